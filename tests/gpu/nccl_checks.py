"""The NCCL paths on real GPUs, one rank per GPU (run by tests/gpu/test_nccl.py through torchrun).

NCCL refuses two ranks of one communicator on the same GPU, so the world is the number of GPUs
(capped at 4; the caller picks 1, 2 or 4). On one GPU every part still runs on NCCL, with the rank
sets that exist in a world of one; the parts that need peers say so in their result:

- probe: what ``CreationInputs.probe`` reads from a default group bound to a GPU, and the path; the
  device a mesh built without ``device_type`` takes (cuda, the bound ``cuda:LOCAL_RANK``);
- member_only: a mesh with ``backend="nccl"`` (member-only ``new_group`` with the registry's name,
  the bound device cleared for the call and restored) over ranks [0, 1] built by its members only
  (world 1: over [0]); an all_reduce over it;
- split: a whole-world mesh on the ``split_group`` path (world 1: ``dist.split_group`` called
  directly, since a one-rank mesh has no group to split); all_reduces over its groups;
- sharing: two meshes whose dims have the same rank set share one communicator;
- subworld_engine: an engine over ranks [0] built and stepped on rank 0 only (world >= 2), its
  parameters against plain torch SGD on the same data;
- zero3: a ZeRO-3 engine over the world, one step, parameters against plain torch SGD;
- then the parts of tests/gpu/acceptance_parts.py: zero_bf16, hf_trainer, pipelines, transfer,
  member_only_bound.

usage: nccl_checks.py OUT_DIR [PART ...]   (default: every part; MESH_GPU_DRY_RUN=1: the same parts
on gloo/CPU, to check the script itself where there is no GPU; probe and split then report "dry run")
"""
from __future__ import annotations

import json
import os
import sys
import time
import traceback
from datetime import timedelta

DRY = os.environ.get("MESH_GPU_DRY_RUN") == "1"
BACKEND, DEVICE = ("gloo", "cpu") if DRY else ("nccl", "cuda")
os.environ.setdefault("DS_ACCELERATOR", DEVICE)
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

import functools  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import acceptance_parts  # noqa: E402

LR = 0.1


def _sum_over(group, rank: int) -> float:
    value = torch.tensor([float(rank + 1)], device=DEVICE)
    dist.all_reduce(value, group=group)
    return value.item()


def _expect(members) -> float:
    return float(sum(r + 1 for r in members))


def part_probe(rank: int, world: int) -> dict:
    from mesh_core import torch_compat
    from mesh_core.registry import CreationInputs, choose_creation_path

    if DRY:
        return {"ok": True, "skipped": "dry run"}
    inputs = CreationInputs.probe(None, whole_world=True)
    path = choose_creation_path(inputs)
    local = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
    device_type, device = torch_compat.default_device_type(), torch_compat.default_device()
    return {
        "ok": path.name == "SPLIT" and inputs.supports_splitting and device_type == "cuda" and device == local,
        "bound_device": str(inputs.bound_device),
        "supports_splitting": inputs.supports_splitting,
        "path": path.name,
        "default_device_type": device_type,  # what a mesh built without device_type runs on
        "default_device": str(device),
    }


def part_member_only(rank: int, world: int) -> dict:
    from mesh_core import DeepSpeedDeviceMesh
    from mesh_core.registry import group_name_for

    members = [0, 1] if world >= 2 else [0]
    if rank not in members:  # non-members never construct it
        return {"ok": True, "member": False}
    bound = dist.distributed_c10d._get_default_group().bound_device_id
    mesh = DeepSpeedDeviceMesh.build(ranks=members, tp=len(members), backend=BACKEND)  # device follows the world
    group = mesh.get_group("tp")
    got = _sum_over(group, rank)
    name = group.group_name
    restored = dist.distributed_c10d._get_default_group().bound_device_id == bound  # cleared only for the creation
    mesh.destroy()
    return {
        "ok": got == _expect(members) and name == group_name_for((BACKEND, tuple(members)))
        and mesh.creation_path.name == "LOCAL" and mesh.device_type == DEVICE and restored,
        "sum": got, "name": name, "path": mesh.creation_path.name, "members": members,
        "device_type": mesh.device_type, "bound_device_restored": restored,
    }


def part_split(rank: int, world: int) -> dict:
    from mesh_core import DeepSpeedDeviceMesh

    if DRY:
        return {"ok": True, "skipped": "dry run (gloo cannot split)"}
    if world == 1:
        group = dist.split_group(split_ranks=[[0]])
        got = _sum_over(group, rank)
        dist.destroy_process_group(group)
        return {"ok": got == 1.0, "sum": got, "note": "world 1: dist.split_group([[0]]) called directly"}
    mesh = DeepSpeedDeviceMesh.build(tp=2, device_type=DEVICE)
    sums = {d: _sum_over(mesh.get_group(d), rank) for d in ("tp", "dp") if mesh.size(d) > 1}
    wanted = {d: _expect(mesh.get_group_ranks(d)) for d in sums}
    created = mesh.registry.created
    mesh.destroy()
    return {"ok": mesh.creation_path.name == "SPLIT" and sums == wanted, "sums": sums, "wanted": wanted,
            "path": mesh.creation_path.name, "split_calls": created}


def part_sharing(rank: int, world: int) -> dict:
    from mesh_core import DeepSpeedDeviceMesh

    members = [0, 1] if world >= 2 else [0]
    if rank not in members:
        return {"ok": True, "member": False}
    a = DeepSpeedDeviceMesh.build(ranks=members, tp=len(members), backend=BACKEND, device_type=DEVICE)
    before = a.registry.created
    b = DeepSpeedDeviceMesh.build(ranks=members, dp=len(members), backend=BACKEND, device_type=DEVICE)
    shared = a.get_group("tp") is b.get_group("dp")
    calls = a.registry.created - before
    got = _sum_over(b.get_group("dp"), rank)
    b.destroy()
    still = _sum_over(a.get_group("tp"), rank)  # a's communicator survives b's destroy
    a.destroy()
    return {"ok": shared and calls == 0 and got == still == _expect(members),
            "shared": shared, "creation_calls_for_b": calls, "sums": [got, still]}


def _net(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))


def _reference(seed: int, x: torch.Tensor) -> list[torch.Tensor]:
    net = _net(seed).to(DEVICE)
    loss = net(x).pow(2).mean()
    loss.backward()
    with torch.no_grad():
        return [(p - LR * p.grad).detach().cpu() for p in net.parameters()]


def _engine_step(config: dict, seed: int, x: torch.Tensor) -> list[torch.Tensor]:
    import deepspeed

    net = _net(seed)
    engine, *_ = deepspeed.initialize(model=net, model_parameters=net.parameters(), config=config)
    loss = engine(x.to(engine.device)).pow(2).mean()
    engine.backward(loss)
    engine.step()
    params = list(engine.module.parameters())
    with deepspeed.zero.GatheredParameters(params, enabled=hasattr(params[0], "ds_id")):
        got = [p.detach().cpu().clone() for p in params]
    engine.destroy()
    return got


def _config(stage: int, mesh: dict) -> dict:
    return {"train_micro_batch_size_per_gpu": 4, "steps_per_print": 10**6,
            "optimizer": {"type": "SGD", "params": {"lr": LR}}, "zero_allow_untested_optimizer": True,
            "gradient_clipping": 0.0,
            "zero_optimization": {"stage": stage, "stage3_param_persistence_threshold": 0}, "mesh": mesh}


def _close(got: list[torch.Tensor], want: list[torch.Tensor]) -> float:
    return max(float((g - w).abs().max()) for g, w in zip(got, want))


def part_subworld_engine(rank: int, world: int) -> dict:
    if world == 1:
        return {"ok": True, "skipped": "a sub-world engine needs a world of >= 2 GPUs"}
    x = torch.randn(4, 16, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    if rank != 0:  # rank 1.. never build it
        return {"ok": True, "member": False}
    err = _close(_engine_step(_config(2, {"ranks": [0]}), 3, x), _reference(3, x))
    return {"ok": err < 1e-5, "max_abs_diff": err}


def part_zero3(rank: int, world: int) -> dict:
    x = torch.randn(4, 16, generator=torch.Generator().manual_seed(2)).to(DEVICE)  # the same batch on every rank
    err = _close(_engine_step(_config(3, {"dp": world}), 5, x), _reference(5, x))
    return {"ok": err < 1e-5, "max_abs_diff": err}


PARTS = {"probe": part_probe, "member_only": part_member_only, "split": part_split, "sharing": part_sharing,
         "subworld_engine": part_subworld_engine, "zero3": part_zero3}
for _name, _part in acceptance_parts.PARTS.items():
    PARTS[_name] = functools.partial(_part, env=acceptance_parts.Env(DRY))


def main() -> None:
    out_dir = sys.argv[1]
    chosen = sys.argv[2:] or list(PARTS)
    unknown = sorted(set(chosen) - set(PARTS))
    if unknown:
        raise SystemExit(f"unknown parts {unknown}; the parts are {list(PARTS)}")
    os.environ["MESH_GPU_OUT"] = out_dir
    local = int(os.environ["LOCAL_RANK"])
    if DRY:
        dist.init_process_group("gloo", timeout=timedelta(seconds=120))
    else:
        torch.cuda.set_device(local)
        dist.init_process_group("nccl", device_id=torch.device("cuda", local), timeout=timedelta(seconds=120))
    import compat
    import compat.install

    hook = compat.install.is_installed()  # DS_MESH=1 and the ds_mesh.pth start-up hook in this environment
    compat.install()
    if DRY:  # deepspeed's CPU accelerator would JIT-build its shm op (as tests/e2e/common.py skips it)
        import deepspeed  # noqa: F401

        sys.modules["deepspeed.comm.torch"].build_shm_op = lambda: None
    rank, world = dist.get_rank(), dist.get_world_size()
    results = {}
    for name in chosen:
        part = PARTS[name]
        start = time.monotonic()
        try:
            results[name] = part(rank, world)
        except Exception:
            results[name] = {"ok": False, "error": traceback.format_exc()[-3000:]}
        results[name]["seconds"] = round(time.monotonic() - start, 1)
        print(f"rank {rank}: {name} ok={results[name]['ok']} ({results[name]['seconds']} s)", file=sys.stderr, flush=True)
        if not results[name]["ok"]:
            print(f"rank {rank}: {name}: {json.dumps(results[name])[-2000:]}", file=sys.stderr, flush=True)
        dist.barrier()  # the next part starts together (a failed part must not leave peers inside it)
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as fh:
        json.dump({"world": world, "torch": torch.__version__, "startup_hook_installed_the_shim": hook, "gpu": "dry run" if DRY else torch.cuda.get_device_name(local),
                   "results": results}, fh, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
