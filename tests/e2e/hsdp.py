"""HSDP under ZeRO on 4 gloo ranks (run by tests/test_hsdp.py through torchrun).

Modes, one after the other in one world, same seed and data (batch seeded by the global rank):
``dp`` ZeRO-3 over {"dp": 4}; ``hsdp`` ZeRO-3 over {"dp_replicate": 2, "dp_shard": 2};
``hsdp_shard_outer`` the same with dp_shard outermost (shard groups [0,2] [1,3]); ``legacy_hpz``
legacy deepspeed (shim off) with zero_hpz_partition_size=2; ``zero1``/``zero2`` over HSDP must
raise before any group is created. Each rank dumps losses, final full parameters, partition
sizes and the groups ZeRO used.

usage: hsdp.py OUT_DIR
"""
from __future__ import annotations

import sys

import torch
import torch.distributed as dist

from common import dump, init_world, ranks, set_mode, shutdown

import deepspeed  # noqa: E402

STEPS, WIDTH = 3, 16


def config(stage: int, mesh: dict | None, **zero) -> dict:
    cfg = {
        "train_micro_batch_size_per_gpu": 4,
        "steps_per_print": 10**6,
        "optimizer": {"type": "Adam", "params": {"lr": 1e-2, "torch_adam": True}},
        "zero_optimization": {"stage": stage, "stage3_param_persistence_threshold": 0,
                              "stage3_model_persistence_threshold": 0, **zero},
    }
    if mesh is not None:
        cfg["mesh"] = mesh
    return cfg


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH), torch.nn.Tanh(), torch.nn.Linear(WIDTH, WIDTH),
                               torch.nn.Tanh(), torch.nn.Linear(WIDTH, 1))


def train(cfg: dict) -> dict:
    net = model()
    engine, *_ = deepspeed.initialize(model=net, model_parameters=net.parameters(), config=cfg)
    gen = torch.Generator().manual_seed(1000 + dist.get_rank())
    losses, secondary = [], None
    params = list(engine.module.parameters())
    for _ in range(STEPS):
        x = torch.randn(4, WIDTH, generator=gen)
        loss = engine(x).pow(2).mean()
        if secondary is None:  # hpZ keeps the secondary partition from forward until the step
            secondary = [None if p.ds_secondary_tensor is None else p.ds_secondary_tensor.numel() for p in params]
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    out = {
        "losses": losses,
        "primary": [p.ds_tensor.numel() for p in params],
        "secondary": secondary,
        "optimizer_partition": sum(t.numel() for t in engine.optimizer.fp32_partitioned_groups_flat),
        "numel": [p.ds_numel for p in params],
        "zero_group": ranks(params[0].ds_process_group),
        "hpz_group": None if params[0].ds_zero_param_process_group is None else ranks(params[0].ds_zero_param_process_group),
        "optimizer_dp_group": ranks(engine.optimizer.dp_process_group),
        "hpz_size": engine.zero_hpz_partition_size(),
    }
    mesh = getattr(engine, "mesh_device", None)
    if mesh is not None and "dp_shard" in mesh.spec.names:
        out["mesh_dp_shard"] = mesh.get_group_ranks("dp_shard")
        out["mesh_dp_replicate"] = mesh.get_group_ranks("dp_replicate")
        out["mesh_dp"] = mesh.get_group_ranks(("dp_replicate", "dp_shard"))
    with deepspeed.zero.GatheredParameters(params):
        out["params"] = [p.detach().clone() for p in params]
    engine.destroy()
    return out


def main() -> None:
    out_dir = sys.argv[1]
    rank = init_world()
    results: dict = {}
    set_mode(True)
    results["dp"] = train(config(3, {"dp": 4}))
    results["hsdp"] = train(config(3, {"dp_replicate": 2, "dp_shard": 2}))
    results["hsdp_shard_outer"] = train(config(3, {"dp_replicate": 2, "dp_shard": 2,
                                                   "order": ["dp_shard", "dp_replicate"]}))
    for stage in (1, 2):
        try:
            train(config(stage, {"dp_replicate": 2, "dp_shard": 2}))
            results[f"zero{stage}"] = None
        except Exception as err:  # noqa: BLE001 - recorded for the test
            results[f"zero{stage}"] = f"{type(err).__name__}: {err}"
    set_mode(False)
    results["legacy_hpz"] = train(config(3, None, zero_hpz_partition_size=2))
    dump(out_dir, rank, results)
    shutdown()


if __name__ == "__main__":
    main()
