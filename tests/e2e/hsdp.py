"""HSDP under ZeRO on 4 gloo ranks (run by tests/e2e/test_hsdp.py through torchrun).

For each ZeRO stage 1, 2, 3, one after the other in one world, same seed and data (batch seeded by
the global rank): ``dp`` over {"dp": 4}; ``hsdp`` over {"dp_replicate": 2, "dp_shard": 2}
(shard groups [0,1] [2,3]); ``hsdp_shard_outer`` the same with dp_shard outermost (shard groups
[0,2] [1,3]). Each rank dumps losses, final full parameters, its own partitions, partition sizes
and the groups ZeRO used. Then the checkpoint round trips (per stage): HSDP -> HSDP (also from
the dp_shard-outer order), and HSDP <-> dp-only through DeepSpeed's universal checkpoint
(``ds_to_universal`` on rank 0).

usage: hsdp.py OUT_DIR PARTS   (comma-separated: train, sp, gas, ckpt1, ckpt2, ckpt3)
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.distributed as dist

from common import dump, init_world, ranks, set_mode, shutdown

# isort: split

import deepspeed  # noqa: E402

STEPS, WIDTH = 3, 16
DP = {"dp": 4}
HSDP = {"dp_replicate": 2, "dp_shard": 2}
HSDP_SHARD_OUTER = {**HSDP, "order": ["dp_shard", "dp_replicate"]}


def config(stage: int, mesh: dict, universal: bool = False, gas: int = 1) -> dict:
    cfg = {
        "train_micro_batch_size_per_gpu": 4,
        "gradient_accumulation_steps": gas,
        "steps_per_print": 10**6,
        "gradient_clipping": 0.05,  # the gradient norm is taken after the cross-replica average
        "optimizer": {"type": "Adam", "params": {"lr": 1e-2, "torch_adam": True}},
        "zero_optimization": {
            "stage": stage,
            "stage3_param_persistence_threshold": 0,
            "stage3_model_persistence_threshold": 0,
            "stage3_gather_16bit_weights_on_model_save": True,
        },
        "mesh": mesh,
    }
    if universal:
        cfg["checkpoint"] = {"load_universal": True}
    return cfg


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(WIDTH, WIDTH),
        torch.nn.Tanh(),
        torch.nn.Linear(WIDTH, WIDTH),
        torch.nn.Tanh(),
        torch.nn.Linear(WIDTH, 1),
    )


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


def _real(engine, flat: list[torch.Tensor]) -> list[torch.Tensor]:
    """ZeRO-3's flat partitions without their padding (the last ranks' tails are uninitialised)."""
    opt = engine.optimizer
    out = []
    for tensor, group in zip(flat, opt.fp16_groups):
        offset = 0
        for p in group:
            rank = dist.get_rank(group=p.ds_process_group)
            size = p.partition_numel()
            real = max(0, min(size, p.ds_numel - rank * size))
            out.append(tensor.narrow(0, offset, real).detach().clone())
            offset += size
    return out


def local_state(engine) -> dict:
    """This rank's partitions (without ZeRO-3's padding): parameters (stage 3), fp32 master weights,
    Adam moments; their sizes and the groups ZeRO used."""
    opt = engine.optimizer
    params = list(engine.module.parameters())
    if engine.zero_optimization_stage() == 3:
        flat = list(opt.fp32_partitioned_groups_flat)
        real = lambda tensors: _real(engine, tensors)  # noqa: E731
        out = {
            "param_partition": [t for p in params for t in _real_param(p)],
            "param_numel": [p.ds_tensor.numel() for p in params],
            "zero_groups": sorted({tuple(ranks(p.ds_process_group)) for p in params}),
        }
    else:
        flat = list(opt.single_partition_of_fp32_groups)
        real = lambda tensors: [t.detach().clone() for t in tensors]  # noqa: E731
        out = {
            "param_partition": None,
            "param_numel": None,
            "zero_groups": sorted({tuple(ranks(g)) for g in opt.real_dp_process_group}),
        }
    out["fp32"] = real(flat)
    out["optimizer_numel"] = sum(t.numel() for t in flat)
    out["moments"] = [m for k in ("exp_avg", "exp_avg_sq") for m in real([opt.optimizer.state[t][k] for t in flat])]
    out["optimizer_dp_group"] = ranks(opt.dp_process_group)
    out["flat_numel"] = sum(p.ds_numel if hasattr(p, "ds_numel") else p.numel() for p in params)
    return out


def _real_param(p) -> list[torch.Tensor]:
    rank, size = dist.get_rank(group=p.ds_process_group), p.partition_numel()
    return [p.ds_tensor.narrow(0, 0, max(0, min(size, p.ds_numel - rank * size))).detach().clone()]


def train(stage: int, mesh: dict, gas: int = 1) -> dict:
    engine = build(config(stage, mesh, gas=gas))
    out = {
        "losses": run_steps(engine, STEPS * gas),
        "grad_norm": float(engine.get_global_grad_norm()),
        **local_state(engine),
        "params": full_params(engine),
        "save_zero_checkpoint": engine.save_zero_checkpoint,
        # the per-step replica average sits on the HSDP optimizer instance, nowhere else
        "hooked": sorted(name for name in ("step", "partition_grads") if name in vars(engine.optimizer)),
    }
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
        ds_to_universal(
            argparse.Namespace(
                input_folder=os.path.join(src, tag),
                output_folder=os.path.join(dst, tag),
                num_extract_workers=1,
                num_merge_workers=1,
                keep_temp_folder=False,
                strict=True,
                inject_missing_state=True,
            )
        )  # a plain model states no TP layout
        with open(os.path.join(dst, "latest_universal"), "w") as f:
            f.write(tag)
    dist.barrier()


SAVES = {"hsdp": HSDP, "dp": DP, "outer": HSDP_SHARD_OUTER}
# trip -> (the saved run, the mesh it loads into, through the universal checkpoint)
TRIPS = {
    "hsdp_to_hsdp": ("hsdp", HSDP, False),
    "hsdp_to_dp": ("hsdp", DP, True),
    "dp_to_hsdp": ("dp", HSDP, True),
    "outer_to_hsdp": ("outer", HSDP, False),
}


def checkpoints(out_dir: str, stage: int) -> dict:
    """Train 2 steps and save under each of SAVES, then load each of TRIPS into a fresh engine:
    its full parameters and the loss of one more step (optimizer states restored too)."""
    out: dict = {}
    for name, mesh in SAVES.items():
        engine = build(config(stage, mesh))
        run_steps(engine, 2)
        path = os.path.join(out_dir, f"ckpt_z{stage}_{name}")
        engine.save_checkpoint(path, tag="t")
        out[f"{name}_saved"] = full_params(engine)
        if name == "hsdp":  # the consolidated 16-bit (here fp32) weights: gathered over dp_shard, rank 0 writes
            engine.save_16bit_model(path + "_16bit")
            dist.barrier()
            state = torch.load(os.path.join(path + "_16bit", "pytorch_model.bin"))
            out["hsdp_16bit"] = [state[k] for k in engine.module.state_dict().keys()]
        out[f"{name}_writer"] = engine.save_zero_checkpoint
        out[f"{name}_next"] = run_steps(engine, 1, seed=5000)
        engine.destroy()
        dist.barrier()
        out[f"{name}_files"] = sorted(os.listdir(os.path.join(path, "t")))
        if any(src == name and universal for src, _, universal in TRIPS.values()):
            to_universal(path, path + "_universal")
    for trip, (src, mesh, universal) in TRIPS.items():
        engine = build(config(stage, mesh, universal=universal))
        engine.load_checkpoint(os.path.join(out_dir, f"ckpt_z{stage}_{src}" + ("_universal" if universal else "")))
        out[trip] = full_params(engine)
        out[f"{trip}_next"] = run_steps(engine, 1, seed=5000)
        engine.destroy()
    return out


def main() -> None:
    out_dir = sys.argv[1]
    rank = init_world()
    set_mode(True)
    parts = sys.argv[2].split(",")  # e.g. "train,ckpt3": training for stages 1-3, checkpoints for stage 3
    results: dict = {}
    for stage in (1, 2, 3) if "train" in parts else ():
        for name, mesh in (("dp", DP), ("hsdp", HSDP), ("hsdp_shard_outer", HSDP_SHARD_OUTER)):
            results[f"z{stage}_{name}"] = train(stage, mesh)
    for stage in (1, 2, 3) if "sp" in parts else ():  # sp beside HSDP: ZeRO's group is (dp_shard, sp)
        results[f"z{stage}_sp_dp"] = train(stage, {"dp": 2, "sp": 2})
        results[f"z{stage}_sp_hsdp"] = train(stage, {"dp_replicate": 2, "sp": 2})
    for stage in (1, 2, 3) if "gas" in parts else ():  # 2 micro-steps per step
        results[f"z{stage}_gas_dp"] = train(stage, DP, gas=2)
        results[f"z{stage}_gas_hsdp"] = train(stage, HSDP, gas=2)
    for stage in (1, 2, 3):
        if f"ckpt{stage}" in parts:
            results[f"ckpt_z{stage}"] = checkpoints(out_dir, stage)
    dump(out_dir, rank, results)
    shutdown()


if __name__ == "__main__":
    main()
