"""AutoTP engines on disjoint halves of a 4-rank world (run by tests/e2e/test_subworld_pipe.py).

Each half builds its own tiny HF-style model (blocks with ``up_proj`` / ``down_proj`` linears, no
``transformers`` needed) and an engine with ``tensor_parallel.autotp_size=2`` over its half
(``"mesh": {"ranks": half, "tp": 2}``); only the half calls ``deepspeed.initialize``. Reference: the
same model on a 2-rank legacy run (same seed, data, SGD).

Mode "legacy" (2 ranks, shim uninstalled) trains both models with plain deepspeed as the reference.
DeepSpeed's AutoTP training differs from the unsharded model after the first step (legacy too), so
the sub-world losses are compared with legacy deepspeed, and only the first step with plain torch.

usage: subworld_autotp.py OUT_DIR [halves|legacy]
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist

from common import dump, init_world, ranks, shutdown

# isort: split

import compat  # noqa: E402

compat.install()
import deepspeed  # noqa: E402

STEPS, BATCH, WIDTH, HIDDEN = 3, 4, 8, 16
CFG = {
    "train_micro_batch_size_per_gpu": BATCH,
    "steps_per_print": 10**6,
    "optimizer": {"type": "SGD", "params": {"lr": 0.05}},
}
# AutoTP's configurable partitioning (DeepSpeed's heuristic parser imports `transformers`)
PARTITION = {
    "use_default_specs": False,
    "layer_specs": [
        {"patterns": [r".*\.up_proj\.weight$"], "partition_type": "column"},
        {"patterns": [r".*\.down_proj\.weight$"], "partition_type": "row"},
    ],
}


class MLP(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up_proj = torch.nn.Linear(WIDTH, HIDDEN)
        self.down_proj = torch.nn.Linear(HIDDEN, WIDTH)

    def forward(self, x):
        return x + self.down_proj(torch.tanh(self.up_proj(x)))


class TinyModel(torch.nn.Module):
    def __init__(self, depth: int) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(MLP() for _ in range(depth))

    def forward(self, x, y):
        for layer in self.layers:
            x = layer(x)
        return torch.nn.functional.mse_loss(x, y)


def data(seed: int) -> list:
    gen = torch.Generator().manual_seed(seed)
    return [(torch.randn(BATCH, WIDTH, generator=gen), torch.randn(BATCH, WIDTH, generator=gen)) for _ in range(STEPS)]


MODELS = {"A": (2, 7), "B": (3, 11)}  # depth, seed


def reference_losses(model: str) -> list[float]:
    depth, seed = MODELS[model]
    torch.manual_seed(seed)
    reference = TinyModel(depth)
    opt = torch.optim.SGD(reference.parameters(), lr=0.05)
    losses = []
    for x, y in data(seed):
        opt.zero_grad()
        loss = reference(x, y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def train(model: str, mesh: dict | None) -> dict:
    depth, seed = MODELS[model]
    torch.manual_seed(seed)
    net = TinyModel(depth)
    cfg = {**CFG, "tensor_parallel": {"autotp_size": 2, "partition_config": PARTITION}}
    if mesh is not None:
        cfg["mesh"] = mesh
    engine, *_ = deepspeed.initialize(model=net, model_parameters=net.parameters(), config=cfg)
    losses = []
    for x, y in data(seed):
        loss = engine(x, y)
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    groups = engine.mpu
    return dict(
        losses=losses,
        tp_group=ranks(groups.get_tensor_model_parallel_group()),
        dp_group=ranks(groups.get_data_parallel_group()),
        up_shape=list(engine.module.layers[0].up_proj.weight.shape),
        up_type=type(engine.module.layers[0].up_proj).__name__,
        down_type=type(engine.module.layers[0].down_proj).__name__,
        mesh=engine.mesh_device.spec.describe() if hasattr(engine.mesh_device, "spec") else None,
    )


def main(out_dir: str, mode: str) -> None:
    if mode == "legacy":  # both models, one after the other, on a 2-rank world without the shim
        compat.uninstall()
        rank = init_world()
        report = {name: train(name, None) for name in MODELS}
    else:
        rank = init_world()
        half = [0, 1] if rank < 2 else [2, 3]
        name = "A" if rank < 2 else "B"
        report = {name: train(name, {"ranks": half}), "reference": reference_losses(name)}
        c10d = dist.distributed_c10d
        report["groups"] = sorted(
            sorted(m) for pg, m in c10d._world.pg_group_ranks.items() if pg is not c10d.GroupMember.WORLD
        )
    dump(out_dir, rank, {"autotp": report})
    shutdown()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "halves")
