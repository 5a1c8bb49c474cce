"""HSDP under ZeRO on 4 gloo ranks (run by tests/test_hsdp.py through torchrun).

For each ZeRO stage 1, 2, 3, one after the other in one world, same seed and data (batch seeded by
the global rank): ``dp`` over {"dp": 4}; ``hsdp`` over {"dp_replicate": 2, "dp_shard": 2}
(shard groups [0,1] [2,3]); ``hsdp_shard_outer`` the same with dp_shard outermost (shard groups
[0,2] [1,3]). Each rank dumps losses, final full parameters, its own partitions, partition sizes
and the groups ZeRO used. Then the checkpoint round trips (ZeRO-3): HSDP -> HSDP, and HSDP <->
dp-only through DeepSpeed's universal checkpoint (``ds_to_universal`` on rank 0).

usage: hsdp.py OUT_DIR
"""
from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.distributed as dist

from common import dump, init_world, ranks, set_mode, shutdown

import deepspeed  # noqa: E402

STEPS, WIDTH = 3, 16
DP = {"dp": 4}
HSDP = {"dp_replicate": 2, "dp_shard": 2}
HSDP_SHARD_OUTER = {**HSDP, "order": ["dp_shard", "dp_replicate"]}


def config(stage: int, mesh: dict, universal: bool = False) -> dict:
    cfg = {
        "train_micro_batch_size_per_gpu": 4,
        "steps_per_print": 10**6,
        "optimizer": {"type": "Adam", "params": {"lr": 1e-2, "torch_adam": True}},
        "zero_optimization": {"stage": stage, "stage3_param_persistence_threshold": 0,
                              "stage3_model_persistence_threshold": 0},
        "mesh": mesh,
    }
    if universal:
        cfg["checkpoint"] = {"load_universal": True}
    return cfg


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH), torch.nn.Tanh(), torch.nn.Linear(WIDTH, WIDTH),
                               torch.nn.Tanh(), torch.nn.Linear(WIDTH, 1))


def build(cfg: dict):
    net = model()
    engine, *_ = deepspeed.initialize(model=net, model_parameters=net.parameters(), config=cfg)
    return engine


def run_steps(engine, steps: int = STEPS, seed: int = 1000) -> list[float]:
    gen = torch.Generator().manual_seed(seed + dist.get_rank())
    losses = []
    for _ in range(steps):
        loss = engine(torch.randn(4, WIDTH, generator=gen)).pow(2).mean()
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    return losses


def full_params(engine) -> list[torch.Tensor]:
    params = list(engine.module.parameters())
    if engine.zero_optimization_stage() == 3:
        with deepspeed.zero.GatheredParameters(params):
            return [p.detach().clone() for p in params]
    return [p.detach().clone() for p in params]


def local_state(engine) -> dict:
    """This rank's partitions: parameters (stage 3), fp32 master weights, Adam moments."""
    opt = engine.optimizer
    params = list(engine.module.parameters())
    if engine.zero_optimization_stage() == 3:
        fp32 = list(opt.fp32_partitioned_groups_flat)
        out = {"param_partition": [p.ds_tensor.detach().clone() for p in params],
               "param_numel": [p.ds_tensor.numel() for p in params],
               "zero_groups": sorted({tuple(ranks(p.ds_process_group)) for p in params})}
    else:
        fp32 = list(opt.single_partition_of_fp32_groups)
        out = {"param_partition": None, "param_numel": None,
               "zero_groups": sorted({tuple(ranks(g)) for g in opt.real_dp_process_group})}
    out["fp32"] = [t.detach().clone() for t in fp32]
    out["optimizer_numel"] = sum(t.numel() for t in fp32)
    out["moments"] = [opt.optimizer.state[t][k].detach().clone() for t in fp32 for k in ("exp_avg", "exp_avg_sq")]
    out["optimizer_dp_group"] = ranks(opt.dp_process_group)
    out["flat_numel"] = sum(p.ds_numel if hasattr(p, "ds_numel") else p.numel() for p in params)
    return out


def train(stage: int, mesh: dict) -> dict:
    engine = build(config(stage, mesh))
    out = {"losses": run_steps(engine), **local_state(engine), "params": full_params(engine),
           "save_zero_checkpoint": engine.save_zero_checkpoint}
    m = engine.mesh_device
    if "dp_shard" in m.spec.names:
        out["mesh_dp_shard"] = m.get_group_ranks(("dp_shard", "sp"))
        out["mesh_dp_replicate"] = m.get_group_ranks("dp_replicate")
    engine.destroy()
    return out


def to_universal(src: str, dst: str) -> None:
    """DeepSpeed's ds_to_universal on rank 0; every rank waits for it."""
    if dist.get_rank() == 0:
        from deepspeed.checkpoint.ds_to_universal import main as ds_to_universal

        tag = open(os.path.join(src, "latest")).read().strip()
        ds_to_universal(argparse.Namespace(input_folder=os.path.join(src, tag), output_folder=os.path.join(dst, tag),
                                           num_extract_workers=1, num_merge_workers=1, keep_temp_folder=False,
                                           strict=True, inject_missing_state=False))
        with open(os.path.join(dst, "latest_universal"), "w") as f:
            f.write(tag)
    dist.barrier()


def checkpoints(out_dir: str, stage: int) -> dict:
    """Train 2 steps, save, then load into HSDP / dp-only engines and compare; returns per trip."""
    out: dict = {}
    for name, mesh in (("hsdp", HSDP), ("dp", DP)):
        engine = build(config(stage, mesh))
        run_steps(engine, 2)
        path = os.path.join(out_dir, f"ckpt_z{stage}_{name}")
        engine.save_checkpoint(path, tag="t")
        out[f"{name}_saved"] = full_params(engine)
        out[f"{name}_files"] = sorted(os.listdir(os.path.join(path, "t")))
        out[f"{name}_writer"] = engine.save_zero_checkpoint
        out[f"{name}_next"] = run_steps(engine, 1, seed=5000)
        engine.destroy()
        dist.barrier()
        to_universal(path, path + "_universal")
    trips = {"hsdp_to_hsdp": (HSDP, "ckpt_z{}_hsdp", False), "hsdp_to_dp": (DP, "ckpt_z{}_hsdp_universal", True),
             "dp_to_hsdp": (HSDP, "ckpt_z{}_dp_universal", True), "dp_to_dp": (DP, "ckpt_z{}_dp", False)}
    for trip, (mesh, folder, universal) in trips.items():
        engine = build(config(stage, mesh, universal=universal))
        engine.load_checkpoint(os.path.join(out_dir, folder.format(stage)))
        out[trip] = full_params(engine)
        out[f"{trip}_next"] = run_steps(engine, 1, seed=5000)  # optimizer states came back too
        engine.destroy()
    return out


def main() -> None:
    out_dir = sys.argv[1]
    rank = init_world()
    set_mode(True)
    results: dict = {}
    for stage in (1, 2, 3):
        for name, mesh in (("dp", DP), ("hsdp", HSDP), ("hsdp_shard_outer", HSDP_SHARD_OUTER)):
            results[f"z{stage}_{name}"] = train(stage, mesh)
    for stage in (3,):
        results[f"ckpt_z{stage}"] = checkpoints(out_dir, stage)
    dump(out_dir, rank, results)
    shutdown()


if __name__ == "__main__":
    main()
