"""A zero.Init-sharded ZeRO-3 model handed to engines on other ranks (run by tests/e2e/test_zero3_partitions_gloo.py).

What transformers / TRL do: the model is built under ``deepspeed.zero.Init`` with the world (its
parameters partitioned over [0, 1]), then an engine is initialised on it. Each part runs on a
2-rank gloo world and ends with a world barrier, so a rank stuck in a collective fails the run:

- "subworld": only rank 0 calls ``deepspeed.initialize(..., "mesh": {"ranks": [0]})``;
- "layout": both ranks call it with ``"mesh": {"tp": 2}`` (ZeRO group [rank], not the world);
- "remedy": rank 0 builds the model under ``zero.Init(data_parallel_group=<the sub-world mesh's
  group>)`` and trains a sub-world engine on it alone;
- "world": a whole-world engine on the zero.Init model still trains (nothing refused).

usage: zero3_sharded.py OUT_DIR PART[,PART]
"""

from __future__ import annotations

import torch

from common import ranks, run_parts

# isort: split

import compat  # noqa: E402

compat.install()
import deepspeed  # noqa: E402

from mesh_core import DeepSpeedDeviceMesh, MeshSpecError  # noqa: E402

CONFIG = {
    "train_micro_batch_size_per_gpu": 2,
    "steps_per_print": 10**6,
    "optimizer": {"type": "Adam", "params": {"lr": 0.01, "torch_adam": True}},
    "zero_optimization": {"stage": 3},
}


def model(**init) -> torch.nn.Module:
    torch.manual_seed(0)
    with deepspeed.zero.Init(config_dict_or_path=CONFIG, **init):
        return torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 1))


def train(engine, steps: int = 2) -> list[float]:
    torch.manual_seed(1)
    losses = []
    for _ in range(steps):
        loss = engine(torch.randn(2, 8)).pow(2).mean()
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    return losses


def refused(net, config) -> dict:
    try:
        deepspeed.initialize(model=net, model_parameters=net.parameters(), config=config)
    except MeshSpecError as err:
        return {"error": str(err)}
    return {"error": None}


def part_subworld(rank: int, out: dict) -> None:
    net = model()  # both ranks: zero.Init over the world
    out["param_ranks"] = ranks(next(net.parameters()).ds_process_group)
    if rank == 0:
        out.update(refused(net, {**CONFIG, "mesh": {"ranks": [0]}}))


def part_layout(rank: int, out: dict) -> None:
    net = model()
    out.update(refused(net, {**CONFIG, "mesh": {"tp": 2}, "tensor_parallel": {"autotp_size": 0}}))


def part_remedy(rank: int, out: dict) -> None:
    if rank != 0:
        return
    config = {**CONFIG, "mesh": {"ranks": [0]}}
    mesh = DeepSpeedDeviceMesh.from_config(config)
    net = model(data_parallel_group=mesh.get_group(("dp", "sp")))
    engine, *_ = deepspeed.initialize(model=net, model_parameters=net.parameters(), config=config, mesh=mesh)
    out["param_ranks"] = ranks(next(net.parameters()).ds_process_group)
    out["losses"] = train(engine)
    out["mesh"] = engine.mesh_device.spec.describe()
    engine.destroy()


def part_world(rank: int, out: dict) -> None:
    net = model()
    engine, *_ = deepspeed.initialize(model=net, model_parameters=net.parameters(), config=CONFIG)
    out["losses"] = train(engine)
    engine.destroy()


PARTS = {"subworld": part_subworld, "layout": part_layout, "remedy": part_remedy, "world": part_world}


if __name__ == "__main__":
    run_parts(PARTS)
