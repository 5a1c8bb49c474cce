"""Test helpers: one process acting as rank r of a world of N (torch's fake backend), and a
recorder of every group-creation call."""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Iterator

import torch.distributed as dist
from torch.distributed import distributed_c10d
from torch.testing._internal.distributed.fake_pg import FakeStore

os.environ.setdefault("DS_ACCELERATOR", "cpu")

FAKE_RANK, FAKE_WORLD = 1, 4  # the conftest `world` fixture: this rank of a fake world of this size


@contextlib.contextmanager
def fake_world(rank: int, world_size: int, *, deepspeed_comm: bool = False) -> Iterator[None]:
    """Initialise the fake process group as ``rank`` of ``world_size``; tear it down after."""
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world_size)
    try:
        if deepspeed_comm:
            init_deepspeed_comm()
        yield
    finally:
        if deepspeed_comm:
            import deepspeed.comm as dscomm

            dscomm.destroy_process_group()  # also resets deepspeed.utils.groups globals
            if dist.is_initialized():
                dist.destroy_process_group()
        else:
            dist.destroy_process_group()


def init_deepspeed_comm() -> None:
    """deepspeed.comm on top of the already initialised fake group (skipping the shm op build)."""
    import deepspeed  # noqa: F401  (import first: deepspeed.comm.torch is only in sys.modules then)
    import deepspeed.comm as dscomm

    sys.modules["deepspeed.comm.torch"].build_shm_op = lambda: None
    dscomm.init_distributed(dist_backend="fake", dist_init_required=False)


def group_count() -> int:
    """Process groups created so far in this world (c10d's own counter)."""
    return distributed_c10d._world.group_count


@contextlib.contextmanager
def record_new_groups() -> Iterator[list[list[int]]]:
    """Record the ``ranks`` of every group-creation call this rank issues inside the block:
    ``new_group`` (world-collective or member-only) and ``split_group`` (each split list)."""
    calls: list[list[int]] = []
    original = distributed_c10d.new_group
    original_split = distributed_c10d.split_group

    def recording(ranks=None, *args, **kwargs):
        calls.append(sorted(ranks) if ranks is not None else list(range(dist.get_world_size())))
        return original(ranks, *args, **kwargs)

    def recording_split(*args, **kwargs):
        calls.extend(sorted(r) for r in kwargs.get("split_ranks") or args[1])
        return original_split(*args, **kwargs)

    import torch.distributed.device_mesh as dm

    targets = [(distributed_c10d, "new_group"), (dist, "new_group"), (dm, "new_group")]
    split_targets = [(distributed_c10d, "split_group"), (dist, "split_group"), (dm, "split_group")]
    saved = [(mod, name, getattr(mod, name)) for mod, name in targets + split_targets if hasattr(mod, name)]
    for mod, name, _ in saved:
        setattr(mod, name, recording if name == "new_group" else recording_split)
    try:
        yield calls
    finally:
        for mod, name, value in saved:
            setattr(mod, name, value)


def plain(value):
    """``value`` with process groups as ``("group", <sorted global ranks>)`` and ranges as lists,
    through lists, tuples and dicts (so legacy and mesh results compare)."""
    if isinstance(value, dist.ProcessGroup):
        return ("group", sorted(dist.get_process_group_ranks(value)))
    if isinstance(value, range):
        return list(value)
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    return value


def probe_ranks(world: int) -> list[int]:
    """The ranks a fake-world test plays: the first, one past the middle and the last."""
    return sorted({0, world // 2 + 1, world - 1} & set(range(world)))


def exec_source(source: str) -> dict:
    """The namespace of ``source`` run as a module (a legacy or migrated probe)."""
    namespace: dict = {}
    exec(compile(source, "<probe>", "exec"), namespace)
    return namespace


def build_expert_groups(groups, grid, eps, builder: str) -> None:
    """Legacy expert groups for each ep size: ``builder`` "tp" (expert-TP over ``grid``), "dbe"
    (data before expert) or plain."""
    for ep in eps:
        if builder == "tp":
            groups._create_expert_data_and_model_parallel(ep, mpu=grid)
        else:
            groups._create_expert_and_data_parallel(ep, use_data_before_expert_parallel_=builder == "dbe")
