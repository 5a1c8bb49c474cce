"""Engine-to-engine weight transfers on 4 gloo ranks (run by tests/e2e/test_transfer_engines.py).

Each case trains the actor engine one step (so its weights differ from any init), moves them with
``mesh_core.transfer.transfer_weights`` into the rollout engine, then gathers the actor's
full weights another way (ZeRO-3: GatheredParameters; AutoTP: all-gather of the shards; whole
parameters: as they are) and sends them from actor rank ``SENDER`` to every rollout rank with plain
point-to-point, which compares bit for bit.

- zero3:  actor ZeRO-3 dp=2 on ranks 0-1 -> rollout dp=2 on ranks 2-3;
- autotp: actor AutoTP tp=2 on ranks 0-1 -> rollout dp=2 on ranks 2-3;
- zero2:  actor ZeRO-2 dp=4 on the whole world -> rollout on ranks 1-3 (a sub-world; ranks 1-3
  hold both sides, so their pieces are copied locally);
- zero3_dst: actor ZeRO-1 on ranks 0-1 -> a ZeRO-3 rollout on ranks 2-3 (written while gathered);
- zero3_autotp: actor ZeRO-3 + AutoTP (dp=2 x tp=2) on the whole world -> rollout dp=2 on ranks 2-3
  (gathered over dp per bucket, the tp shards from both tp ranks).

usage: transfer_engines.py OUT_DIR [zero3,autotp,zero2,zero3_dst]
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist

from common import dump, init_world, shutdown

# isort: split

import compat  # noqa: E402

compat.install()
import deepspeed  # noqa: E402

from mesh_core import spec_from_config  # noqa: E402
from mesh_core.transfer import transfer_weights  # noqa: E402

WIDTH, HIDDEN, WORLD = 8, 16, 4
BASE = {"train_micro_batch_size_per_gpu": 2, "steps_per_print": 10**6}
ADAM = {"optimizer": {"type": "Adam", "params": {"lr": 0.05, "torch_adam": True}}}
PARTITION = {
    "use_default_specs": False,
    "layer_specs": [
        {"patterns": [r".*\.up_proj\.weight$", r".*\.up_proj\.bias$"], "partition_type": "column"},
        {"patterns": [r".*\.down_proj\.weight$"], "partition_type": "row"},
    ],
}
CASES = {
    "zero3": (
        {
            **BASE,
            **ADAM,
            "mesh": {"ranks": [0, 1]},
            "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
        },
        {**BASE, "mesh": {"ranks": [2, 3]}},
    ),
    "autotp": (
        {
            **BASE,
            **ADAM,
            "mesh": {"ranks": [0, 1]},
            "tensor_parallel": {"autotp_size": 2, "partition_config": PARTITION},
        },
        {**BASE, "mesh": {"ranks": [2, 3]}},
    ),
    "zero2": ({**BASE, **ADAM, "zero_optimization": {"stage": 2}}, {**BASE, "mesh": {"ranks": [1, 2, 3]}}),
    "zero3_dst": (
        {**BASE, **ADAM, "mesh": {"ranks": [0, 1]}, "zero_optimization": {"stage": 1}},
        {**BASE, "mesh": {"ranks": [2, 3]}, "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0}},
    ),
    "zero3_autotp": (
        {
            **BASE,
            **ADAM,
            "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
            "tensor_parallel": {"autotp_size": 2, "partition_config": PARTITION},
        },
        {**BASE, "mesh": {"ranks": [2, 3]}},
    ),
}


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up_proj = torch.nn.Linear(WIDTH, HIDDEN)
        self.down_proj = torch.nn.Linear(HIDDEN, WIDTH)
        self.norm = torch.nn.LayerNorm(WIDTH)

    def forward(self, x):
        return self.norm(x + self.down_proj(torch.tanh(self.up_proj(x))))


class MLP(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.block = Block()

    def forward(self, x, y):
        return torch.nn.functional.mse_loss(self.block(x), y)


def full_weights(case: str, actor) -> dict[str, torch.Tensor]:
    """The actor's full parameters on this actor rank, gathered without mesh_core.transfer."""
    params = dict(actor.module.named_parameters())
    with deepspeed.zero.GatheredParameters(list(params.values()), enabled=case in ("zero3", "zero3_autotp")):
        local = {n: p.detach().clone() for n, p in params.items()}  # ZeRO-3: over dp; AutoTP: this tp shard
    out = {}
    for name, p in params.items():
        meta = getattr(p, "ds_autotp_universal_checkpoint_meta", None)
        if (
            case in ("autotp", "zero3_autotp")
            and meta
            and meta.get("partition_dim") is not None
            and not meta.get("replicated")
        ):
            parts = [torch.empty_like(local[name]) for _ in range(2)]
            dist.all_gather(parts, local[name].contiguous(), group=actor.mesh_device.get_group("tp"))
            out[name] = torch.cat(parts, dim=meta["partition_dim"])
        else:
            out[name] = local[name]
    return out


def run(case: str, rank: int) -> dict:
    actor_cfg, rollout_cfg = CASES[case]
    actor_spec, rollout_spec = spec_from_config(actor_cfg, WORLD), spec_from_config(rollout_cfg, WORLD)
    actor = rollout = None
    if rank in actor_spec.ranks:
        torch.manual_seed(1)
        net = MLP()
        actor, *_ = deepspeed.initialize(model=net, model_parameters=net.parameters(), config=actor_cfg)
        gen = torch.Generator().manual_seed(5)
        x, y = torch.randn(2, WIDTH, generator=gen), torch.randn(2, WIDTH, generator=gen)
        actor.backward(actor(x, y))
        actor.step()
    if rank in rollout_spec.ranks:
        torch.manual_seed(2)
        rollout, *_ = deepspeed.initialize(model=MLP(), config=rollout_cfg)
    # ZeRO-3: a bucket of 400 bytes makes the 1184-byte model travel in several gathered groups
    stats = transfer_weights(
        actor_spec, rollout_spec, actor, rollout, **({"bucket_bytes": 400} if case in ("zero3", "zero3_autotp") else {})
    )
    sender = min(actor_spec.ranks)
    expected = full_weights(case, actor) if actor is not None else None
    report = {"messages": stats.messages, "copied": stats.copied, "received": stats.received, "same": None}
    names = sorted(n for n, _ in MLP().named_parameters())
    if rank == sender:
        for peer in rollout_spec.ranks:
            if peer != rank:
                for name in names:
                    dist.send(expected[name].contiguous(), dst=peer)
    elif rollout is not None:
        got = dict(rollout.module.named_parameters())
        same = {}
        with deepspeed.zero.GatheredParameters(list(got.values()), enabled=case == "zero3_dst"):
            for name in names:
                full = torch.empty(got[name].shape, dtype=got[name].dtype)
                dist.recv(full, src=sender)
                same[name] = torch.equal(full, got[name].detach())
            report["rollout_up_numel"] = got["block.up_proj.weight"].numel()
        report["rollout_partitioned"] = got["block.up_proj.weight"].numel() == 0
        report["same"] = same
    if rank == sender and rollout is not None:  # the sender is also a rollout rank (zero2)
        got = dict(rollout.module.named_parameters())
        report["same"] = {n: torch.equal(expected[n], got[n].detach()) for n in names}
    if actor is not None:
        report["actor_changed"] = not torch.equal(expected["block.up_proj.weight"], _init_up())
        report["actor_up_shape"] = list(dict(actor.module.named_parameters())["block.up_proj.weight"].shape)
    dist.barrier()
    for engine in (actor, rollout):
        if engine is not None:
            engine.destroy()
    return report


def _init_up() -> torch.Tensor:
    torch.manual_seed(1)
    return MLP().block.up_proj.weight.detach()


def main(out_dir: str, cases: list[str]) -> None:
    rank = init_world()
    results = {case: run(case, rank) for case in cases}
    dump(out_dir, rank, results)
    shutdown()


if __name__ == "__main__":
    main(sys.argv[1], (sys.argv[2] if len(sys.argv) > 2 else "zero3,autotp,zero2,zero3_dst,zero3_autotp").split(","))
