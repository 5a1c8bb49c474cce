"""An NCCL-contract world on CPU: one process plays rank r of a fake world that torch reports as NCCL.

What a CPU run never meets and a GPU world does, made to hold here:

- **torch's real answers on NCCL**: ``dist.get_backend()`` is ``"nccl"``, ``get_backend_config()`` is
  ``"cuda:nccl"``, ``distributed_c10d._get_object_coll_device()`` returns the *string* ``"cuda"``
  (as in every torch from 2.6 to 2.14), the backend ``supports_splitting``, its options carry a
  ``_timeout``, an accelerator is available and the current device is ``cuda:0`` (as before anyone
  calls ``set_device``);
- **a bound default group** (``bound=True``, what DeepSpeed's ``init_distributed`` does on a CUDA
  world > 1): ``bound_device_id`` is ``cuda:<local_rank>``;
- **creations that need every world rank** on a bound world. torch builds each ``new_group`` of a
  bound world by ``ncclCommSplit`` of the world's communicator, a collective of *every* world rank
  (members with a colour, non-members of a world-collective ``new_group`` with none); a member-only
  (``use_local_synchronization=True``) call is skipped by non-members, so on GPUs the members wait
  forever. ``dist.split_group`` is the same collective. Each rank's run records these world
  collectives in order (:class:`RankLog`); :func:`check_contract` then demands the same sequence on
  every world rank and fails naming the first one a rank skipped: what hangs on GPUs fails here.
  A creation on an unbound world (or with the bound device cleared) is a fresh communicator among
  its members: recorded per member, and every member must make it, in the same relative order.
- the store-based mesh check (``mesh_core.consistency``) stays skipped as on any fake world: the fake
  store holds nothing, and the check does not depend on the backend (the gloo tests run it);
- **CUDA tensors**: ``torch.tensor`` / ``zeros`` / ``empty`` / ``ones`` / ``full`` asked for a cuda
  device allocate on the CPU instead and record the device asked for (:attr:`RankLog.allocations`).

Use :func:`run_ranks` to play a scenario on every rank (one after the other, each in a fresh world)
and check the contract. ``creation_s`` makes each creation take that long (thread tests).
``split_non_member`` picks what ``split_group`` returns to a rank in none of
the splits: None (torch ≤ 2.13) or ``GroupMember.NON_GROUP_MEMBER`` (-100, torch 2.14).
"""
from __future__ import annotations

import contextlib
import dataclasses
import inspect
import threading
import time
from datetime import timedelta
from typing import Any, Callable, Iterator, Optional

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

from fakepg import fake_world

NON_GROUP_MEMBER = dist.GroupMember.NON_GROUP_MEMBER


class ContractViolation(AssertionError):
    """The ranks' creations break NCCL's contract: on GPUs this would hang."""


@dataclasses.dataclass
class NcclOptions:
    """What ``ProcessGroupNCCL.Options`` offers the project (deep-copyable, like the real one)."""

    _timeout: timedelta = timedelta(minutes=10)


@dataclasses.dataclass
class RankLog:
    rank: int
    world: list = dataclasses.field(default_factory=list)  # world collectives: ("comm_split", ranks) / ("split_group", splits)
    members: list = dataclasses.field(default_factory=list)  # fresh communicators: (group name, ranks)
    allocations: list = dataclasses.field(default_factory=list)  # cuda devices tensors were asked for
    split_options: list = dataclasses.field(default_factory=list)  # pg_options passed to split_group
    parent_options: Any = None
    max_concurrent_creations: int = 0
    result: Any = None


_FACTORIES = ("tensor", "zeros", "empty", "ones", "full")


def _bind(function: Callable, args: tuple, kwargs: dict) -> dict:
    bound = inspect.signature(function).bind_partial(*args, **kwargs)
    return dict(bound.arguments)


@contextlib.contextmanager
def nccl_world(
    rank: int,
    world_size: int,
    *,
    bound: bool = True,
    local_rank: Optional[int] = None,
    split_non_member: Any = None,
    deepspeed_comm: bool = False,
    creation_s: float = 0.0,
) -> Iterator[RankLog]:
    """Rank ``rank`` of a fake world of ``world_size`` that torch reports as NCCL (module docstring)."""
    log = RankLog(rank)
    local = rank if local_rank is None else local_rank
    with fake_world(rank, world_size, deepspeed_comm=deepspeed_comm), contextlib.ExitStack() as undo:
        world = c10d._get_default_group()
        backend_type = type(world._get_backend(torch.device("cuda")))
        options = NcclOptions()
        log.parent_options = options

        def patch(owner: Any, name: str, value: Any) -> None:
            had = name in vars(owner)
            old = vars(owner).get(name)
            setattr(owner, name, value)
            undo.callback(lambda: setattr(owner, name, old) if had else delattr(owner, name))

        # torch's answers on an NCCL world
        for module in (dist, c10d):
            patch(module, "get_backend", lambda group=None: "nccl")
            patch(module, "get_backend_config", lambda group=None: "cuda:nccl")
        patch(c10d, "_get_object_coll_device", lambda group=None: "cuda")
        patch(backend_type, "supports_splitting", property(lambda self: True))
        patch(backend_type, "options", property(lambda self: options))
        patch(backend_type, "perform_nocolor_split", lambda self, device: None)  # a non-member's part of a split
        # the store-based mesh check is backend-independent (the gloo tests run it); the fake
        # backend's store holds nothing, so it stays skipped as on any fake world
        import mesh_core.consistency as consistency

        patch(consistency, "SKIPPED_BACKENDS", (*consistency.SKIPPED_BACKENDS, "nccl"))
        patch(torch.accelerator, "is_available", lambda: True)
        patch(torch.accelerator, "current_accelerator", lambda *a, **k: torch.device("cuda", 0))
        patch(torch.accelerator, "current_device_index", lambda: 0)
        patch(torch.accelerator, "device_count", lambda: max(world_size, 1))
        if bound:
            world.bound_device_id = torch.device("cuda", local)
            undo.callback(lambda: setattr(world, "bound_device_id", None))

        # cuda allocations land on the CPU, recorded
        for name in _FACTORIES:
            real = getattr(torch, name)

            def factory(*args: Any, _real: Callable = real, **kwargs: Any) -> torch.Tensor:
                device = kwargs.get("device")
                if device is not None and torch.device(device).type == "cuda":
                    log.allocations.append(torch.device(device))
                    kwargs["device"] = "cpu"
                return _real(*args, **kwargs)

            patch(torch, name, factory)

        # creations: what each costs on NCCL
        real_new = c10d._new_group_with_tag
        in_flight = [0]
        inside_split = threading.local()
        lock = threading.Lock()

        def new_group_with_tag(*args: Any, **kwargs: Any) -> Any:
            if getattr(inside_split, "on", False):
                return real_new(*args, **kwargs)
            call = _bind(real_new, args, kwargs)
            ranks = sorted(call.get("ranks") or range(world_size))
            local_sync = bool(call.get("use_local_synchronization", False))
            device = call.get("device_id") or world.bound_device_id
            backend = call.get("backend")
            nccl = backend in (None, "nccl", dist.Backend.NCCL) or str(backend).endswith(":nccl")
            with lock:
                in_flight[0] += 1
                log.max_concurrent_creations = max(log.max_concurrent_creations, in_flight[0])
            try:
                if device is not None and nccl and (rank in ranks or not local_sync):
                    log.world.append(("comm_split", tuple(ranks)))  # ncclCommSplit of the world: all must join
                if creation_s:
                    time.sleep(creation_s)  # widens the window in which another thread could interleave
                group = real_new(*args, **kwargs)
            finally:
                with lock:
                    in_flight[0] -= 1
            if (device is None or not nccl) and group not in (None, NON_GROUP_MEMBER):
                log.members.append((group.group_name, tuple(ranks)))
            return group

        def split_group(parent_pg: Any = None, split_ranks: Any = None, timeout: Any = None,
                        pg_options: Any = None, group_desc: Any = None, **rest: Any) -> Any:
            if world.bound_device_id is None:  # as torch: a split needs the bound device
                raise RuntimeError("No device associated with the default pg, not safe to split any process groups")
            splits = tuple(tuple(sorted(r)) for r in split_ranks)
            log.world.append(("split_group", splits))
            log.split_options.append(pg_options)
            mine = next((s for s in splits if rank in s), None)
            if mine is None:
                return split_non_member
            inside_split.on = True
            try:
                return real_new(list(mine), use_local_synchronization=True)
            finally:
                inside_split.on = False

        patch(c10d, "_new_group_with_tag", new_group_with_tag)
        for module in (dist, c10d):
            patch(module, "split_group", split_group)
        import torch.distributed.device_mesh as device_mesh_module

        if hasattr(device_mesh_module, "split_group"):
            patch(device_mesh_module, "split_group", split_group)
        yield log


def check_contract(logs: list[RankLog]) -> None:
    """Raise :class:`ContractViolation` where the ranks' creations would hang on NCCL."""
    reference = logs[0]
    for log in logs[1:]:
        if log.world != reference.world:
            k = next((i for i, (a, b) in enumerate(zip(reference.world, log.world)) if a != b),
                     min(len(reference.world), len(log.world)))
            mine = log.world[k] if k < len(log.world) else "nothing"
            theirs = reference.world[k] if k < len(reference.world) else "nothing"
            raise ContractViolation(
                f"world collective #{k} of the bound world: rank {reference.rank} made {theirs}, rank {log.rank} "
                f"made {mine}; every world rank must join each ncclCommSplit (rank {reference.rank}: "
                f"{len(reference.world)}, rank {log.rank}: {len(log.world)} in all) — on GPUs this hangs"
            )
    made: dict[tuple, set[int]] = {}
    for log in logs:
        for name, ranks in log.members:
            made.setdefault((name, ranks), set()).add(log.rank)
    played = {log.rank for log in logs}
    for (name, ranks), by in made.items():
        missing = (set(ranks) & played) - by
        if missing:
            raise ContractViolation(f"group {name} of ranks {list(ranks)}: members {sorted(missing)} never created it")
    for a in logs:
        for b in logs:
            if a.rank >= b.rank:
                continue
            common_a = [m for m in a.members if b.rank in m[1]]
            common_b = [m for m in b.members if a.rank in m[1]]
            if common_a != common_b:
                raise ContractViolation(
                    f"ranks {a.rank} and {b.rank} create their common groups in different orders: "
                    f"{[list(r) for _, r in common_a]} vs {[list(r) for _, r in common_b]}"
                )


def run_ranks(
    scenario: Callable[[int], Any], world_size: int, *, ranks: Optional[list[int]] = None, **world: Any
) -> list[RankLog]:
    """Play ``scenario(rank)`` as every rank (default: all of the world) in an NCCL-contract world,
    check the contract over them, and return the logs (``log.result``: what the scenario returned)."""
    logs = []
    for rank in range(world_size) if ranks is None else ranks:
        with nccl_world(rank, world_size, **world) as log:
            log.result = scenario(rank)
        logs.append(log)
    check_contract(logs)
    return logs
