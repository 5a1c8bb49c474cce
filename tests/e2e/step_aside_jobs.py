"""Communicators that step aside, 4 gloo ranks (run by tests/e2e/test_step_aside_gloo.py via torchrun).

Part "mesh": a mesh (pp=2, dp=2, ep=2, a flattened pp x dp, p2p pairs) releases its communicators
and resumes them; what it holds before, while released and after, torch's live groups, and an
all-reduce over every group before and after.
Part "pipe": a pipeline engine (pp=2, dp=2), the same twice, the second released between steps.
Part "zero3_hpz": a world ZeRO-3 engine with ZeRO++ hpZ groups of 2 (groups outside its mesh).
Parts "zero1" / "zero3": each half of the world ([0, 1], [2, 3]) trains its own engine (the shim,
"mesh": {"ranks": half}) for STEPS steps twice from the same seed and data: once straight, once
releasing and resuming the engine's communicators after every step but the last.

usage: step_aside_jobs.py OUT_DIR PART[,PART]
"""

from __future__ import annotations

import gc

import torch
import torch.distributed as dist

from common import params_of, ranks, run_parts, set_mode

# isort: split

STEPS = 3
DIMS = ["pp", "dp", ("pp", "dp"), "ep", "edp"]


def _live_groups() -> list:
    """The process groups torch holds on this rank, the world excluded."""
    world = dist.GroupMember.WORLD
    return [g for g in dist.distributed_c10d._world.pg_map if g is not world]


def _live_of(records) -> int:
    """Groups torch still holds over the rank sets a release covered (groups an earlier part left
    over other rank sets are not this engine's)."""
    released = {key[1] for record in records for key in record.keys}
    return sum(1 for g in _live_groups() if tuple(ranks(g)) in released)


def _sums(mesh, rank: int) -> dict:
    out = {}
    for dims in DIMS:
        value = torch.tensor([float(rank + 1)])
        dist.all_reduce(value, group=mesh.get_group(dims))
        out[str(dims)] = value.item()
    for peer in sorted({mesh.layout.stage_peer(rank, 1), mesh.layout.stage_peer(rank, -1)}):
        value = torch.tensor([float(rank + 1)])
        dist.all_reduce(value, group=mesh.p2p_group(peer))
        out[f"p2p {peer}"] = value.item()
    return out


def _held(mesh, owners=()) -> list:
    from mesh_core.step_aside import holds

    return [[list(c.uses), list(c.ranks), c.state] for c in holds(mesh, owners=owners).communicators]


def part_mesh(rank: int, out: dict) -> None:
    import weakref

    from mesh_core import DeepSpeedDeviceMesh, MeshSpecError
    from mesh_core.step_aside import holds, release_communicators, resume_communicators

    mesh = DeepSpeedDeviceMesh.build(pp=2, ep=2, flatten=[("pp", "dp")], p2p_groups=True)
    other = DeepSpeedDeviceMesh.build(dp=2, tp=2)  # its tp groups are mesh's dp groups, its dp mesh's pp
    out["sums_before"] = _sums(mesh, rank)
    out["held_before"] = _held(mesh)
    out["memory_reported"] = [holds(mesh).device_memory_bytes, [c.memory_stats for c in holds(mesh).communicators]]
    old = [weakref.ref(g) for g in _live_groups()]
    out["live_before"] = len(old)
    out["names_before"] = sorted(g().group_name for g in old)
    record = release_communicators(mesh)
    release_communicators(other)  # the rank sets it shares are set aside already
    out["modes"] = sorted(set(record.mode.values()))
    out["held_released"] = _held(mesh)
    out["alive_released"] = holds(mesh).alive
    out["live_released"] = len(_live_groups())
    out["old_objects_alive"] = sum(1 for g in old if g() is not None)
    out["still_referenced"] = record.still_referenced()
    try:
        dist.all_reduce(torch.ones(1), group=mesh.get_group("dp"))
        out["released_use_error"] = None
    except (MeshSpecError, ValueError, TypeError) as exc:  # torch reports a foreign group object as a ValueError
        # torch 2.6's c10d logger, asking the backend of the released group while it reports the error, raises
        # its own TypeError with ours as the context: the remedy is in the chain
        chain = [exc, exc.__context__] if isinstance(exc, TypeError) else [exc]
        out["released_use_error"] = " | ".join(str(e) for e in chain if e is not None)
    out["rebound"] = resume_communicators(mesh)
    resume_communicators(other)
    out["shared_after"] = other.get_group("tp") is mesh.get_group("dp") and other.get_group("dp") is mesh.get_group(
        "pp"
    )
    out["held_after"] = _held(mesh)
    out["live_after"] = len(_live_groups())
    out["names_after"] = sorted(g.group_name for g in _live_groups())
    out["sums_after"] = _sums(mesh, rank)
    out["device_mesh_dp"] = ranks(mesh["dp"].get_group())
    other.destroy()
    mesh.destroy()


def _engine(stage: int, half: list[int], hpz: bool = False):
    import deepspeed

    torch.manual_seed(10 + half[0])
    net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    config = {
        "train_micro_batch_size_per_gpu": 4,
        "gradient_accumulation_steps": 1,
        "steps_per_print": 10**6,
        "optimizer": {"type": "Adam", "params": {"lr": 1e-2, "torch_adam": True}},
        "zero_optimization": {"stage": stage, "stage3_param_persistence_threshold": 0},
        "mesh": {"ranks": half},
    }
    if hpz:  # a world engine whose ZeRO++ hpZ groups (the halves) are not the mesh's
        config["zero_optimization"]["zero_hpz_partition_size"] = 2
        del config["mesh"]
    engine, *_ = deepspeed.initialize(model=net, model_parameters=net.parameters(), config=config)
    return engine


def _full_params(engine) -> dict:
    import deepspeed

    params = list(engine.module.parameters())
    with deepspeed.zero.GatheredParameters(params, enabled=hasattr(params[0], "ds_id")):
        return params_of(engine.module)


def _train(stage: int, rank: int, step_aside: bool, hpz: bool = False) -> dict:
    from compat.engine_step_aside import release_engine_communicators, resume_engine_communicators

    half = [0, 1] if rank < 2 else [2, 3]
    engine = _engine(stage, half, hpz)
    gen = torch.Generator().manual_seed(100 + rank)
    out: dict = {
        "losses": [],
        "alive_released": [],
        "live_released": [],
        "rebound": [],
        "held": [],
        "still_referenced": None,
    }
    for step in range(STEPS):
        x = torch.randn(4, 8, generator=gen)
        loss = engine(x).pow(2).mean()
        engine.backward(loss)
        engine.step()
        out["losses"].append(loss.item())
        if step_aside and step < STEPS - 1:
            records = release_engine_communicators(engine)
            out["still_referenced"] = [list(r.still_referenced()) for r in records]
            out["alive_released"].append(len([c for c in _held(engine.mesh_device, [engine]) if c[2] == "alive"]))
            out["live_released"].append(_live_of(records))
            out["rebound"].append(resume_engine_communicators(engine))
            out["held"].append(_held(engine.mesh_device, [engine]))
    out["params"] = _full_params(engine)
    out["dp_group"] = ranks(engine.data_parallel_group)
    out["held_end"] = _held(engine.mesh_device, [engine])
    engine.destroy()
    gc.collect()  # an engine in a reference cycle would keep the groups it shared with the next one
    return out


def _pipeline(rank: int, step_aside: bool) -> dict:
    import deepspeed
    from deepspeed.pipe import PipelineModule

    from compat.engine_step_aside import release_engine_communicators, resume_engine_communicators

    torch.manual_seed(0)
    layers = [torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)]
    model = PipelineModule(layers=layers, num_stages=2, loss_fn=torch.nn.MSELoss(), partition_method="uniform")
    config = {
        "train_batch_size": 16,
        "train_micro_batch_size_per_gpu": 4,
        "steps_per_print": 10**6,
        "optimizer": {"type": "Adam", "params": {"lr": 1e-2, "torch_adam": True}},
    }
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    gen = torch.Generator().manual_seed(100 + rank % 2)

    def data():
        while True:
            x = torch.randn(4, 8, generator=gen)
            yield x, x.sum(dim=1, keepdim=True)

    batches, out = data(), {"losses": [], "still_referenced": [], "alive_released": [], "live_released": []}
    for step in range(STEPS):
        out["losses"].append(engine.train_batch(data_iter=batches).item())
        if step_aside and step < STEPS - 1:
            records = release_engine_communicators(engine)
            out["still_referenced"] += [list(r.still_referenced()) for r in records]
            out["alive_released"].append(len([c for c in _held(engine.mesh_device) if c[2] == "alive"]))
            out["live_released"].append(_live_of(records))
            resume_engine_communicators(engine)
    out["params"] = params_of(engine.module)
    out["dp_group"] = ranks(engine.data_parallel_group)
    engine.destroy()
    gc.collect()  # an engine in a reference cycle would keep the groups it shared with the next one
    return out


def part_pipe(rank: int, out: dict) -> None:
    set_mode(True)
    out["straight"] = _pipeline(rank, step_aside=False)
    out["step_aside"] = _pipeline(rank, step_aside=True)
    set_mode(False)


def part_zero(stage: int, hpz: bool = False):
    def part(rank: int, out: dict) -> None:
        set_mode(True)
        out["straight"] = _train(stage, rank, step_aside=False, hpz=hpz)
        out["step_aside"] = _train(stage, rank, step_aside=True, hpz=hpz)
        set_mode(False)

    return part


if __name__ == "__main__":
    run_parts(
        {
            "mesh": part_mesh,
            "zero1": part_zero(1),
            "zero3": part_zero(3),
            "pipe": part_pipe,
            "zero3_hpz": part_zero(3, hpz=True),
        }
    )
