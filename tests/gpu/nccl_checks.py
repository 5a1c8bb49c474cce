"""The NCCL paths on real GPUs, one rank per GPU: the rank side of one part of tools/gpu_check.sh
(the driver, tests/gpu/gpu_driver.py, starts one torchrun per part under that part's bound).

NCCL refuses two ranks of one communicator on the same GPU, so the world is at most the number of
GPUs (the driver picks 8, 4, 2 or 1). On one GPU every part still runs on NCCL, with the rank sets
that exist in a world of one; the parts that need peers say so in their result. Each part's world is
set up as :mod:`gpu_world` says (bound where DeepSpeed binds, or unbound), with its groups' timeout
inside the part's bound:

- probe: what ``CreationInputs.probe`` reads from a default group bound to a GPU, and the path; the
  device a mesh built without ``device_type`` takes (cuda, the bound ``cuda:LOCAL_RANK``);
- member_only: a mesh with ``backend="nccl"`` over ranks [0, 1] built by its members only (world 1:
  over [0]); an all_reduce over it;
- not_split: on the bound world, a one-rank mesh per rank is not made by splitting the world's
  communicator: torch found no split source for its creation (recorded per thread, on every engine;
  a world-collective ``new_group`` right after finds one, which shows the signal works) and, where the
  world backend has ``comm_split_count()`` (stock NCCL, not nccl2), that count is unchanged (a
  ``split_group`` adds one); and it is bound to the rank's own GPU; catches on one GPU what hangs only
  on several;
- split: a whole-world mesh on the ``split_group`` path (world 1: ``dist.split_group`` called
  directly, since a one-rank mesh has no group to split); all_reduces over its groups;
- sharing: two meshes whose dims have the same rank set share one communicator;
- subworld_engine: an engine over ranks [0] built and stepped on rank 0 only (world >= 2), its
  parameters against plain torch SGD on the same data;
- zero3: a ZeRO-3 engine over the world, one step, parameters against plain torch SGD;
- unbound_engine: the world DeepSpeed leaves unbound, nobody calls ``set_device``: a Megatron-style
  mpu, ``deepspeed.initialize(mpu=...)`` under the shim then plain, the same losses, every rank on its
  own GPU;
- then the parts of tests/gpu/acceptance_parts.py: zero_bf16, hf_trainer, pipelines, transfer, weight_link,
  link_reads, member_only_bound;
- step_aside: release and resume a whole-world mesh (suspend or destroy, whichever this torch and NCCL
  take), a DeviceMesh slice and a DTensor made before the release used after it; a pair mesh connected
  at the registry's connect point.

usage: nccl_checks.py OUT_DIR PART [PART ...]   (parts of one world kind; each rank writes
``OUT_DIR/<part>.rank<r>.json``; MESH_GPU_DRY_RUN=1: the same parts on gloo/CPU, to check the script
itself where there is no GPU; the NCCL-only parts then report "dry run")
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
import threading  # noqa: E402
from typing import Optional  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import acceptance_parts  # noqa: E402
import gpu_world  # noqa: E402

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
    if not _world_is_bound():
        return {"ok": True, "skipped": gpu_world.not_binding_reason(torch.__version__)}
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
        "ok": got == _expect(members)
        and name == group_name_for((BACKEND, tuple(members)))
        and mesh.creation_path.name == "LOCAL"
        and mesh.device_type == DEVICE
        and restored,
        "sum": got,
        "name": name,
        "path": mesh.creation_path.name,
        "members": members,
        "device_type": mesh.device_type,
        "bound_device_restored": restored,
    }


def part_split(rank: int, world: int) -> dict:
    from mesh_core import DeepSpeedDeviceMesh

    if DRY:
        return {"ok": True, "skipped": "dry run (gloo cannot split)"}
    if not _world_is_bound():  # torch splits only a bound world
        return {"ok": True, "skipped": gpu_world.not_binding_reason(torch.__version__)}
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
    return {
        "ok": mesh.creation_path.name == "SPLIT" and sums == wanted,
        "sums": sums,
        "wanted": wanted,
        "path": mesh.creation_path.name,
        "split_calls": created,
    }


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
    return {
        "ok": shared and calls == 0 and got == still == _expect(members),
        "shared": shared,
        "creation_calls_for_b": calls,
        "sums": [got, still],
    }


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
    return {
        "train_micro_batch_size_per_gpu": 4,
        "steps_per_print": 10**6,
        "optimizer": {"type": "SGD", "params": {"lr": LR}},
        "zero_allow_untested_optimizer": True,
        "gradient_clipping": 0.0,
        "zero_optimization": {"stage": stage, "stage3_param_persistence_threshold": 0},
        "mesh": mesh,
    }


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


def _local() -> int:
    return int(os.environ["LOCAL_RANK"])


def _world_is_bound() -> bool:
    return getattr(dist.distributed_c10d._get_default_group(), "bound_device_id", None) is not None


class SplitSources:
    """Per thread, how many of torch's group creations found a *split source* (``_get_split_source`` of
    ``distributed_c10d`` returned the world's backend: the creation is an ``ncclCommSplit`` every world
    rank must join). Read in Python on every engine: stock NCCL, nccl2 (which has no
    ``comm_split_count()``) and gloo."""

    def __init__(self) -> None:
        self._local = threading.local()
        self._c10d = dist.distributed_c10d
        self._real = getattr(self._c10d, "_get_split_source", None)

    def __enter__(self) -> "SplitSources":
        real, local = self._real, self._local
        if real is not None:

            def recording(*args, **kwargs):
                found = real(*args, **kwargs)
                if found is not None:
                    local.found = getattr(local, "found", 0) + 1
                return found

            self._c10d._get_split_source = recording
        return self

    def __exit__(self, *exc) -> None:
        if self._real is not None:
            self._c10d._get_split_source = self._real

    def found(self) -> Optional[int]:
        """Creations in this thread that found one so far (None: this torch has no such function)."""
        return None if self._real is None else getattr(self._local, "found", 0)


def part_not_split(rank: int, world: int) -> dict:
    """A member-only group is not a split of the world's communicator, and is bound to this rank's GPU.
    Two signals: whether torch found a split source for the creation (:class:`SplitSources`, every
    engine) and the world backend's ``comm_split_count()`` where it has one (stock NCCL; not nccl2)."""
    from mesh_core import DeepSpeedDeviceMesh, torch_compat

    if DRY:
        with SplitSources() as sources:  # the signal on gloo: nothing is bound, so nothing finds a source
            alone = DeepSpeedDeviceMesh.build(ranks=[rank], dp=1, backend=BACKEND)
            member_found = sources.found()
            alone.destroy()
            everyone = dist.new_group(list(range(world)))
            control_found = sources.found() - member_found
            dist.destroy_process_group(everyone)
        return {
            "ok": True,
            "skipped": "dry run (gloo has no communicator split count; an unbound world has no split source)",
            "member_only": {"split_source_found": member_found},
            "world_new_group_control": {"split_source_found": control_found},
        }
    if not _world_is_bound():
        return {"ok": True, "skipped": gpu_world.not_binding_reason(torch.__version__)}
    device = torch.device("cuda", _local())
    world_backend = dist.distributed_c10d._get_default_group()._get_backend(device)
    counter = getattr(world_backend, "comm_split_count", None)

    def splits() -> Optional[int]:
        return None if counter is None else counter()

    def made(mark: Optional[int]) -> Optional[int]:
        return None if mark is None else splits() - mark

    out: dict = {"comm_split_count": counter is not None, "engine": type(world_backend).__name__}
    with SplitSources() as sources:
        before, found = splits(), sources.found()
        alone = DeepSpeedDeviceMesh.build(ranks=[rank], dp=1, backend=BACKEND)  # every rank its own: members only
        group = alone.get_group("dp")
        out["member_only"] = member = {
            "split_source_found": sources.found() - found,  # 0: torch found nothing to split from
            "world_splits_made": made(before),  # 0: not a split of the world's communicator (None: no counter)
            "initialised_right_after_creation": torch_compat.backend_initialised(group, device),  # eager or lazy
            "bound_device_id": str(getattr(group, "bound_device_id", None)),  # cuda:LOCAL_RANK when bound
            "sum": _sum_over(group, rank),
            "initialised_after_a_collective": torch_compat.backend_initialised(group, device),
        }
        member["path"] = alone.creation_path.name
        alone.destroy()
        members = list(range(world // 2))
        if rank in members:  # world >= 2: a sub-world mesh as the mesh builds it (no backend given)
            mark, found = splits(), sources.found()
            sub = DeepSpeedDeviceMesh.build(ranks=members, tp=len(members))
            out["sub_world"] = {
                "members": members,
                "path": sub.creation_path.name,
                "split_source_found": sources.found() - found,
                "world_splits_made": made(mark),
                "bound_device_id": str(getattr(sub.get_group("tp"), "bound_device_id", None)),
                "sum": _sum_over(sub.get_group("tp"), rank),
            }
            sub.destroy()
        found = sources.found()
        everyone = dist.new_group(list(range(world)))  # every world rank joins: torch splits the bound world
        out["world_new_group_control"] = {"split_source_found": sources.found() - found}
        dist.destroy_process_group(everyone)
    before = splits()
    control = torch_compat.split_group([[r] for r in range(world)])  # every world rank joins
    out["split_control"] = {
        "world_splits_made": made(before),
        "initialised_right_after_creation": torch_compat.backend_initialised(control, device),
    }
    dist.destroy_process_group(control)
    sub = out.get("sub_world")
    counted = counter is not None
    out["ok"] = (
        member["split_source_found"] == 0
        and out["world_new_group_control"]["split_source_found"] >= 1
        and (not counted or (member["world_splits_made"] == 0 and out["split_control"]["world_splits_made"] == 1))
        and member["bound_device_id"] == str(device)
        and member["sum"] == float(rank + 1)
        and (
            sub is None
            or (
                sub["split_source_found"] == 0
                and (not counted or sub["world_splits_made"] == 0)
                and sub["bound_device_id"] == str(device)
                and sub["sum"] == _expect(members)
            )
        )
    )
    return out


class _UserMPU:
    """A script's own Megatron-style mpu: data parallel over the world, one-rank model parallel groups."""

    def __init__(self, world: int) -> None:
        rank = dist.get_rank()
        self.dp = dist.new_group(list(range(world)))
        singles = [dist.new_group([r]) for r in range(world)]  # every rank calls every creation
        self.tp = singles[rank]

    def get_data_parallel_group(self):
        return self.dp

    def get_data_parallel_world_size(self):
        return dist.get_world_size(self.dp)

    def get_data_parallel_rank(self):
        return dist.get_rank(self.dp)

    def get_model_parallel_group(self):
        return self.tp

    def get_model_parallel_world_size(self):
        return 1

    def get_model_parallel_rank(self):
        return 0


def _mpu_losses(shim: bool, world: int, mpu: _UserMPU, steps: int = 3) -> tuple[list[float], str]:
    import deepspeed

    acceptance_parts.set_shim(shim)
    net = _net(9)
    config = {
        "train_micro_batch_size_per_gpu": 4,
        "steps_per_print": 10**9,
        "optimizer": {"type": "Adam", "params": {"lr": 1e-2, "torch_adam": True}},
    }
    engine, *_ = deepspeed.initialize(model=net, model_parameters=net.parameters(), config=config, mpu=mpu)
    gen = torch.Generator().manual_seed(4 + dist.get_rank())
    losses = []
    for _ in range(steps):
        loss = engine(torch.randn(4, 16, generator=gen).to(engine.device)).pow(2).mean()
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    device = str(engine.device)
    engine.destroy()
    return losses, device


def part_unbound_engine(rank: int, world: int) -> dict:
    """The unbound world and a script that leaves ``set_device`` to DeepSpeed: under the shim every
    rank's first collectives run on its own GPU (on cuda:0 for every rank they fail with NCCL's
    duplicate-GPU error on >= 2 GPUs), and the engine trains as plain DeepSpeed does."""
    from mesh_core import torch_compat

    bound = _world_is_bound()
    own = torch.device("cpu") if DRY else torch.device("cuda", _local())
    shim_device_before = torch_compat.default_device()  # where the shim's agreement all_reduce runs
    mpu = _UserMPU(world)
    try:
        shim, shim_engine_device = _mpu_losses(True, world, mpu)
        plain, plain_engine_device = _mpu_losses(False, world, mpu)
    finally:
        acceptance_parts.set_shim(True)
    return {
        "ok": not bound and shim_device_before == own and shim == plain and shim_engine_device == str(own),
        "world_bound": bound,
        "shim_collective_device": str(shim_device_before),
        "engine_device": shim_engine_device,
        "identical_losses": shim == plain,
        "losses": shim,
        "plain_engine_device": plain_engine_device,
    }


def part_step_aside(rank: int, world: int) -> dict:
    """Release and resume on the world's own path: suspend (NCCL >= 2.29.7 and a torch whose backend has
    ``suspend()``) or destroy and re-create; a torch DeviceMesh slice and a DTensor built before the
    release work after it, and a sub-world mesh's groups are connected at the registry's connect point."""
    from torch.distributed.tensor import DTensor, Replicate, Shard

    from mesh_core import DeepSpeedDeviceMesh
    from mesh_core.step_aside import holds, release_communicators, resume_communicators

    # backend named: its groups are its own, not the world group (which is never released)
    mesh = DeepSpeedDeviceMesh.build(tp=world, backend=BACKEND, device_type=DEVICE)
    dim = mesh.mesh_dim_names[0]  # "tp" (a world of one: the mesh's one dim of size 1)
    held = mesh[dim]
    tensor = DTensor.from_local(torch.full((2,), float(rank + 1), device=DEVICE), held, [Shard(0)])
    before = _sum_over(mesh.get_group(dim), rank)
    record = release_communicators(mesh, holders=[held])
    states = [c.state for c in holds(mesh).communicators]
    resume_communicators(mesh, holders=[held])
    after = _sum_over(mesh.get_group(dim), rank)
    gathered = tensor.redistribute(held, [Replicate()]).to_local().tolist()
    resolves = held.get_group() is mesh.get_group(dim)
    members = [0, 1] if world >= 2 else [0]
    connected = None
    if rank in members:  # created unconnected, connected at the connect point, then used
        pair = DeepSpeedDeviceMesh.build(ranks=members, tp=len(members), device_type=DEVICE)
        connected = pair.registry.connect()
        pair_sum = _sum_over(pair.get_group("tp"), rank)
        pair.destroy()
    mesh.destroy()
    want = [float(r + 1) for r in range(world) for _ in range(2)]
    return {
        "ok": before == after == _expect(range(world))
        and gathered == want
        and resolves
        and (connected is None or pair_sum == _expect(members))
        and bool(record.mode),
        "modes": sorted(set(record.mode.values())),
        "states_while_released": states,
        "device_free_bytes": record.device_free_bytes,
        "sums": [before, after],
        "dtensor_gathered": gathered,
        "old_device_mesh_resolves_new_group": resolves,
        "connected_at_connect_point": connected,
    }


def part_hang_selftest(rank: int, world: int) -> dict:
    """Never returns: checks that the driver bounds a part and names it (run only when named)."""
    while True:
        time.sleep(1)


PARTS = {
    "probe": part_probe,
    "member_only": part_member_only,
    "not_split": part_not_split,
    "split": part_split,
    "sharing": part_sharing,
    "subworld_engine": part_subworld_engine,
    "zero3": part_zero3,
    "unbound_engine": part_unbound_engine,
    "step_aside": part_step_aside,
    "hang_selftest": part_hang_selftest,
}
for _name, _part in acceptance_parts.PARTS.items():
    PARTS[_name] = functools.partial(_part, env=acceptance_parts.Env(DRY))
assert set(PARTS) == set(gpu_world.SPECS), sorted(set(PARTS) ^ set(gpu_world.SPECS))


def _bound_group_timeouts(seconds: float) -> timedelta:
    """Every group this process creates without a timeout of its own (the meshes', DeepSpeed's) gets
    ``seconds``, not torch's 10 or 30 minutes: a hang is reported inside the part's bound."""
    timeout = timedelta(seconds=seconds)
    c10d = dist.distributed_c10d
    c10d.default_pg_timeout = timeout
    if isinstance(getattr(c10d, "default_pg_nccl_timeout", None), timedelta):
        c10d.default_pg_nccl_timeout = timeout
    return timeout


def init_world(kind: str, timeout: timedelta) -> None:
    """The part's world (:mod:`gpu_world`): gloo in the dry run; else NCCL, bound to ``cuda:LOCAL_RANK``
    where DeepSpeed binds ("bound"), or left unbound with no ``set_device`` ("unbound")."""
    if DRY:
        dist.init_process_group("gloo", timeout=timeout)
    elif kind == "unbound":
        dist.init_process_group("nccl", timeout=timeout)  # no device_id, no set_device: DeepSpeed sets it later
    elif gpu_world.version_allows_binding(torch.__version__):
        torch.cuda.set_device(_local())
        dist.init_process_group("nccl", device_id=torch.device("cuda", _local()), timeout=timeout)
    else:  # as DeepSpeed on 2.6.x / 2.7.0: unbound (the parts that need a bound world say so)
        torch.cuda.set_device(_local())
        dist.init_process_group("nccl", timeout=timeout)


def main() -> None:
    out_dir = sys.argv[1]
    chosen = sys.argv[2:]
    unknown = sorted(set(chosen) - set(PARTS))
    if not chosen or unknown:
        raise SystemExit(
            f"usage: nccl_checks.py OUT_DIR PART [PART ...]; unknown {unknown}; the parts are {list(PARTS)}"
        )
    kinds = {gpu_world.SPECS[name].world for name in chosen}
    if len(kinds) != 1:
        raise SystemExit(f"parts {chosen} need different worlds ({sorted(kinds)}): run them separately")
    os.environ["MESH_GPU_OUT"] = out_dir
    timeout = _bound_group_timeouts(float(os.environ.get("MESH_GPU_GROUP_TIMEOUT_S", "120")))
    init_world(kinds.pop(), timeout)
    import compat
    import compat.install

    hook = compat.install.is_installed()  # DS_MESH=1 and the ds_mesh.pth start-up hook in this environment
    compat.install()
    if DRY:  # deepspeed's CPU accelerator would JIT-build its shm op (as tests/e2e/common.py skips it)
        import deepspeed  # noqa: F401

        sys.modules["deepspeed.comm.torch"].build_shm_op = lambda: None
    rank, world = dist.get_rank(), dist.get_world_size()
    for name in chosen:
        start = time.monotonic()
        try:
            result = PARTS[name](rank, world)
        except Exception:
            result = {"ok": False, "error": traceback.format_exc()[-3000:]}
        result["seconds"] = round(time.monotonic() - start, 1)
        print(f"rank {rank}: {name} ok={result['ok']} ({result['seconds']} s)", file=sys.stderr, flush=True)
        if not result["ok"]:
            print(f"rank {rank}: {name}: {json.dumps(result)[-2000:]}", file=sys.stderr, flush=True)
        record = {
            "part": name,
            "rank": rank,
            "world": world,
            "torch": torch.__version__,
            "world_bound": _world_is_bound(),
            "startup_hook_installed_the_shim": hook,
            "gpu": "dry run" if DRY else torch.cuda.get_device_name(_local()),
            "result": result,
        }
        with open(os.path.join(out_dir, f"{name}.rank{rank}.json"), "w") as fh:
            json.dump(record, fh, indent=1)
        dist.barrier()  # the next part starts together (a failed part must not leave peers inside it)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
