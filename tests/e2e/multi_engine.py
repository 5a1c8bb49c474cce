"""Several engines in one 4-rank world (run by tests/e2e/test_multi_engine.py through torchrun).

Part "grid": two engines with different tp layouts interleave their steps; a Megatron-style model
reads the *global* legacy getters inside its forward and must get its own engine's tp group; outside
any step the getters raise WrongGridError naming both engines; compat.use_engine chooses one.
Part "moe": each half builds its own MoE engine (ep=2 over the half).
Part "halves" (sub-world engines): ranks 0-1 and 2-3 each build only their own engine over their
half ("mesh": {"ranks": [...]}), with ZeRO-1 on one half and ZeRO-2/3 on the other, then a third,
whole-world engine; every engine trains and its replicas stay identical.

usage: multi_engine.py OUT_DIR PART[,PART]
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from common import ranks, run_parts

# isort: split

import compat  # noqa: E402

compat.install()
import deepspeed  # noqa: E402
from deepspeed.utils import groups  # noqa: E402

BASE = {
    "train_micro_batch_size_per_gpu": 4,
    "steps_per_print": 10**6,
    "optimizer": {"type": "SGD", "params": {"lr": 0.05}},
}


class GlobalGridModel(torch.nn.Module):
    """Legacy model code: asks deepspeed.utils.groups for "the" tp group inside forward."""

    def __init__(self, width: int = 8) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(width, width)
        self.seen: list[list[int]] = []

    def forward(self, x):
        group = groups.get_tensor_model_parallel_group()
        self.seen.append(ranks(group))
        y = self.lin(x)
        total = y.detach().clone()
        dist.all_reduce(total, group=group)  # the tp peers really talk over it
        return (y + 0 * total).pow(2).mean()


def part_grid(rank: int, out: dict) -> None:
    torch.manual_seed(0)
    a_model, b_model = GlobalGridModel(), GlobalGridModel()
    # the model does its own TP over the legacy getter's group: autotp_size 0 keeps AutoTP off
    no_autotp = {"tensor_parallel": {"autotp_size": 0}}
    cfg_a = {**BASE, **no_autotp, "mesh": {"tp": 2}}  # tp groups [0,1] [2,3]
    cfg_b = {**BASE, **no_autotp, "mesh": {"tp": 2, "order": ["tp", "dp"]}}  # tp groups [0,2] [1,3]
    a, *_ = deepspeed.initialize(model=a_model, model_parameters=a_model.parameters(), config=cfg_a)
    # one engine: the getters serve it outside its steps, as legacy did
    out["single_engine_tp"] = ranks(groups.get_tensor_model_parallel_group())
    b, *_ = deepspeed.initialize(model=b_model, model_parameters=b_model.parameters(), config=cfg_b)
    x = torch.randn(4, 8)
    for _ in range(2):  # interleaved steps
        la = a(x)
        lb = b(x)
        a.backward(la)
        b.backward(lb)
        a.step()
        b.step()
    out["a_seen"], out["b_seen"] = a_model.seen, b_model.seen
    out["a_tp"], out["b_tp"] = a.mesh_device.get_group_ranks("tp"), b.mesh_device.get_group_ranks("tp")
    errors = {}
    for name, call in {
        "get_tensor_model_parallel_group": groups.get_tensor_model_parallel_group,
        "_get_data_parallel_group": groups._get_data_parallel_group,
        "mpu": lambda: groups.mpu.get_data_parallel_group(),
    }.items():
        try:
            call()
            errors[name] = None
        except compat.WrongGridError as err:
            errors[name] = str(err)
    out["errors"] = errors
    with compat.use_engine(b):
        out["use_b_tp"] = ranks(groups.get_tensor_model_parallel_group())
    with compat.use_engine(a):
        out["use_a_tp"] = ranks(groups.get_tensor_model_parallel_group())
    b.destroy()
    out["after_destroy_tp"] = ranks(groups.get_tensor_model_parallel_group())  # only a is left
    a.destroy()


def small_model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))


def zero_config(stage: int, ranks_: list[int] | None) -> dict:
    cfg = {
        **BASE,
        "optimizer": {"type": "Adam", "params": {"lr": 1e-2, "torch_adam": True}},
        "zero_optimization": {"stage": stage, "stage3_param_persistence_threshold": 0},
    }
    cfg["mesh"] = {"ranks": ranks_} if ranks_ is not None else {"dp": 4}
    return cfg


def build(stage: int, ranks_: list[int] | None, seed: int):
    net = small_model(seed)
    engine, *_ = deepspeed.initialize(model=net, model_parameters=net.parameters(), config=zero_config(stage, ranks_))
    return engine


def train_steps(engine, gen, steps: int = 2) -> list[float]:
    losses = []
    for _ in range(steps):
        x = torch.randn(4, 8, generator=gen)
        loss = engine(x).pow(2).mean()
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    return losses


def full_params(engine) -> list[torch.Tensor]:
    params = list(engine.module.parameters())
    with deepspeed.zero.GatheredParameters(params, enabled=hasattr(params[0], "ds_id")):
        return [p.detach().clone() for p in params]


def replicas_identical(engine) -> bool:
    flat = torch.cat([p.reshape(-1) for p in full_params(engine)])
    group = engine.mesh_device.get_group("dp")
    gathered = [torch.empty_like(flat) for _ in range(dist.get_world_size(group))]
    dist.all_gather(gathered, flat, group=group)
    return all(torch.equal(g, flat) for g in gathered)


def engine_report(engine, losses) -> dict:
    return {
        "losses": losses,
        "dp_group": ranks(engine.data_parallel_group),
        "zero_group": ranks(engine.seq_data_parallel_group),
        "mesh": engine.mesh_device.spec.describe(),
        "replicas_identical": replicas_identical(engine),
        "optimizer": type(engine.optimizer).__name__,
    }


def part_halves(rank: int, out: dict) -> None:
    """Each half builds only its own engines; then a whole-world engine joins and all interleave."""
    half = [0, 1] if rank < 2 else [2, 3]
    gen = torch.Generator().manual_seed(rank)
    stages = (1, 3) if rank < 2 else (2, 1)  # ZeRO-1 and ZeRO-3 on one half, ZeRO-2 and ZeRO-1 on the other
    mine = []
    for i, stage in enumerate(stages):
        engine = build(stage, half, seed=10 * i + half[0])
        mine.append((f"half_zero{stage}", engine, train_steps(engine, gen)))
    world = build(2, None, seed=99)
    world_losses = train_steps(world, gen, 1)
    for name, engine, losses in mine:  # the half engines keep training with the world engine alive
        losses += train_steps(engine, gen, 1)
        out[name] = engine_report(engine, losses)
    world_losses += train_steps(world, gen, 1)
    out["world_zero2"] = engine_report(world, world_losses)
    for _, engine, _ in mine:
        engine.destroy()
    world.destroy()


class MoENet(torch.nn.Module):
    def __init__(self) -> None:
        from deepspeed.moe.layer import MoE

        super().__init__()
        self.moe = MoE(hidden_size=8, expert=torch.nn.Linear(8, 8), num_experts=2, ep_size=2, k=1)
        self.out = torch.nn.Linear(8, 1)

    def forward(self, x):
        y, _, _ = self.moe(x)
        return self.out(y).pow(2).mean()


def part_moe(rank: int, out: dict) -> None:
    """Each half builds its own MoE engine (ep=2 over the half); experts differ, the rest agrees."""
    half = [0, 1] if rank < 2 else [2, 3]
    torch.manual_seed(half[0])
    net = MoENet()
    cfg = {**zero_config(1, half)}
    engine, *_ = deepspeed.initialize(model=net, model_parameters=net.parameters(), config=cfg)
    losses = train_steps(engine, torch.Generator().manual_seed(rank))
    dense = torch.cat([p.detach().reshape(-1) for n, p in net.named_parameters() if "experts" not in n])
    gathered = [torch.empty_like(dense) for _ in half]
    dist.all_gather(gathered, dense, group=engine.mesh_device.get_group("dp"))
    out.update(
        mesh=engine.mesh_device.spec.describe(),
        ep_group=engine.mesh_device.get_group_ranks("ep"),
        losses=losses,
        dense_identical=all(torch.equal(g, dense) for g in gathered),
    )
    engine.destroy()


PARTS = {"grid": part_grid, "halves": part_halves, "moe": part_moe}

if __name__ == "__main__":
    run_parts(PARTS)
