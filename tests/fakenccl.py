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
  A creation on an unbound world (or with the bound device hidden from the creating thread) is a
  fresh communicator among its members: recorded per member, and every member must make it, in the
  same relative order.
- the store-based mesh check (``mesh_core.consistency``) stays skipped as on any fake world: the fake
  store holds nothing, and the check does not depend on the backend (the gloo tests run it);
- **CUDA tensors**: ``torch.tensor`` / ``zeros`` / ``empty`` / ``ones`` / ``full`` asked for a cuda
  device allocate on the CPU instead and record the device asked for (:attr:`RankLog.allocations`).

What else a GPU world does and the harness models (each a hazard the tests play):

- **communicators and their first collective**: a group created with a device (a split, a
  ``new_group`` on a bound world, or one given ``device_id``) is connected at creation and bound to
  that device; any other is *lazy*: its communicator is made at its first collective, among its
  members (an event every member must reach, in the same order), on the device of that
  collective's tensors (the current device, ``cuda:0``, for a ``barrier``). A lazy init while this
  rank has a collective in flight on another communicator (``async_op=True``, not yet waited) is
  recorded (:attr:`RankLog.hazards`): that is the ``ncclCommInitRank`` deadlock;
- **devices at collective time**: a bound group rejects a cuda tensor of another device; two ranks
  of one communicator on one device fail :func:`check_contract` (NCCL's duplicate-GPU error);
- **torch's naming per release** (``release=``): ``_process_group_name`` and ``split_group`` as
  2.6–2.9 (counter names, members only), 2.10–2.13 (hashed, salted by ``len(pg_names)``) and 2.14
  (hashed, salted by the counter, which every call advances) do it; :func:`check_contract` demands
  equal ``group_count`` on every rank and the same names for a rank set's groups on all its members;
- ``destroy_process_group(group)``: an event of the group's members (every member, same order);
- ``torchcomms=True`` (``TORCH_DISTRIBUTED_USE_TORCHCOMMS=1``): before 2.14 ``new_group(
  use_local_synchronization=True)`` raises ``NotImplementedError`` as torch does; from 2.14 every
  subgroup is a member-only ``new_comm`` on ``device_id`` (one without an index is a violation: torch's
  wrong-device case);
- ``init_barrier=True`` (``TORCH_DIST_INIT_BARRIER=1``): a member-only creation ends in a barrier
  among its members that takes ``creation_s`` (counted in :attr:`RankLog.max_concurrent_barriers`).

- **the NCCL engine** (``engine=``: ``"nccl"``, stock ProcessGroupNCCL, by default, the one ds-mesh
  runs on, which 2.15 builds with ``TORCH_DIST_USE_NCCL2=0``; ``"auto"``: what ``init_process_group
  ("nccl")`` builds on the release with this process's ``TORCH_DIST_USE_NCCL2``: nccl2 on 2.15 unless
  it is ``0``, on 2.14 only when it is ``1``, never before): on
  ``"nccl2"`` the world's backend object is what ``distributed_c10d.ProcessGroupNCCL2`` names (the
  class ds-mesh recognises it by) and the world is bound whatever ``bound`` says, to
  ``cuda:LOCAL_RANK % device_count`` (``_nccl2_device``); ``"nccl-lazy"`` likewise with
  ``ProcessGroupNCCLLazy``; ``"nccl"`` is stock ProcessGroupNCCL;
- **``ProcessGroupNCCL.Options.lazy_init``** (:class:`NcclOptions`, ``release >= 2.15``): a creation
  with it is no split (non-members do nothing), and on nccl2 its communicator is made at its first
  collective, among its members; stock NCCL ignores the field (connected at creation given a device).

Use :func:`run_ranks` to play a scenario on every rank (one after the other, each in a fresh world)
and check the contract. ``creation_s`` makes each creation take that long (thread tests).
``split_non_member`` overrides what ``split_group`` returns to a rank in none of the splits (by
default the release's: None up to 2.13, ``GroupMember.NON_GROUP_MEMBER`` (-100) from 2.14).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import inspect
import os
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
    simulate_uniform_ranks: bool = False  # read by torch 2.15's fake backend at every subgroup creation
    lazy_init: bool = False  # torch 2.15: not created by a split; nccl2 connects it at its first collective


@dataclasses.dataclass
class Comm:
    """One communicator as this rank sees it."""

    name: str
    ranks: tuple
    device: Optional[torch.device] = None  # the device it was connected on (None: not yet)
    bound: bool = False  # bound to ``device`` at creation (a collective off it fails)
    lazy: bool = True  # made at its first collective, not at creation


@dataclasses.dataclass
class RankLog:
    rank: int
    world: list = dataclasses.field(
        default_factory=list
    )  # world collectives: ("comm_split", ranks) / ("split_group", splits)
    members: list = dataclasses.field(default_factory=list)  # fresh communicators: (group name, ranks)
    events: list = dataclasses.field(default_factory=list)  # member events: (kind, group name, ranks)
    allocations: list = dataclasses.field(default_factory=list)  # cuda devices tensors were asked for
    split_options: list = dataclasses.field(default_factory=list)  # pg_options passed to split_group
    comms: dict = dataclasses.field(default_factory=dict)  # group name -> Comm
    names: list = dataclasses.field(default_factory=list)  # (ranks, group name) of every group this rank made
    lazy_inits: list = dataclasses.field(default_factory=list)  # (group name, ranks, device) made at a first collective
    hazards: list = dataclasses.field(default_factory=list)  # lazy inits while another collective was in flight
    waits: list = dataclasses.field(default_factory=list)  # blocking steps, in order: (kind, group name, ranks)
    collectives: list = dataclasses.field(default_factory=list)  # (op, group name, device)
    group_count: int = 0  # torch's _world.group_count when the scenario ended
    parent_options: Any = None
    max_concurrent_creations: int = 0
    max_concurrent_barriers: int = 0
    result: Any = None


_FACTORIES = ("tensor", "zeros", "empty", "ones", "full")
_COLLECTIVES = (
    "all_reduce",
    "broadcast",
    "barrier",
    "all_gather_into_tensor",
    "reduce_scatter_tensor",
    "all_gather",
    "all_to_all_single",
    "reduce",
)
_DEVICE_ATTR = "_fakenccl_device"


def _bind(function: Callable, args: tuple, kwargs: dict) -> dict:
    bound = inspect.signature(function).bind_partial(*args, **kwargs)
    return dict(bound.arguments)


def tensor_device(tensor: Any) -> Optional[torch.device]:
    """The cuda device a harness tensor was asked for (None: a host tensor)."""
    return getattr(tensor, _DEVICE_ATTR, None)


def _release_of(release: Optional[str]) -> tuple[int, int]:
    text = str(torch.__version__ if release is None else release)
    major, minor = text.split(".")[:2]
    return int(major), int(minor)


class _Work:
    """An async collective in flight until waited."""

    def __init__(self, work: Any, done: Callable[[], None]) -> None:
        self._work, self._done, self._waited = work, done, False

    def wait(self, *args: Any, **kwargs: Any) -> Any:
        if not self._waited:
            self._waited = True
            self._done()
        return self._work.wait(*args, **kwargs) if hasattr(self._work, "wait") else True

    def is_completed(self) -> bool:
        return self._waited

    def __getattr__(self, name: str) -> Any:
        return getattr(self._work, name)


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
    release: Optional[str] = None,
    torchcomms: bool = False,
    init_barrier: bool = False,
    engine: str = "nccl",
) -> Iterator[RankLog]:
    """Rank ``rank`` of a fake world of ``world_size`` that torch reports as NCCL (module docstring).
    ``release`` ("2.6", "2.10", "2.14", …): the torch release whose naming, split and version the
    world shows (default: the installed one)."""
    log = RankLog(rank)
    local = rank if local_rank is None else local_rank
    rel = _release_of(release)
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

        if release is not None:
            patch(
                torch,
                "__version__",
                torch.torch_version.TorchVersion(f"{release}.0" if release.count(".") == 1 else release),
            )
        engine = default_engine(rel) if engine == "auto" else engine
        for kind, class_name in (("nccl2", "ProcessGroupNCCL2"), ("nccl-lazy", "ProcessGroupNCCLLazy")):
            # the class torch's engine has (absent before 2.14): the world's backend is one when it plays it
            patch(c10d, class_name, backend_type if engine == kind else type(f"Real{class_name}", (), {}))
        if engine in ("nccl2", "nccl-lazy"):  # _nccl2_device: every world bound, to LOCAL_RANK % device_count
            bound = True
            local = local % max(world_size, 1)  # ``local_rank`` plays the launcher's LOCAL_RANK (default: the rank)
        # torch's answers on an NCCL world
        for module in (dist, c10d):
            patch(module, "get_backend", lambda group=None: "nccl")
            patch(module, "get_backend_config", lambda group=None: "cuda:nccl")
        patch(c10d, "_get_object_coll_device", lambda group=None: "cuda")
        patch(backend_type, "supports_splitting", property(lambda self: True))
        patch(backend_type, "options", property(lambda self: options))
        patch(backend_type, "perform_nocolor_split", lambda self, device: None)  # a non-member's part of a split
        patch(
            backend_type,
            "eager_connect_single_device",
            lambda self, device: _record_connect(log, self, device, outstanding),
        )  # at creation: recorded below
        # the store-based mesh check is backend-independent (the gloo tests run it); the fake
        # backend's store holds nothing, so it stays skipped as on any fake world
        import mesh_core.consistency as consistency

        patch(consistency, "SKIPPED_BACKENDS", (*consistency.SKIPPED_BACKENDS, "nccl"))
        patch(torch.accelerator, "is_available", lambda: True)
        patch(torch.accelerator, "current_accelerator", lambda *a, **k: torch.device("cuda", 0))
        patch(torch.accelerator, "current_device_index", lambda: 0)
        patch(torch.accelerator, "device_count", lambda: max(world_size, 1))
        patch(c10d, "_use_torchcomms_enabled", lambda: torchcomms)
        if init_barrier:
            undo.enter_context(_env("TORCH_DIST_INIT_BARRIER", "1"))
        if bound:
            world.bound_device_id = torch.device("cuda", local)
            undo.callback(lambda: setattr(world, "bound_device_id", None))
        log.comms[world.group_name] = Comm(
            world.group_name, tuple(range(world_size)), torch.device("cuda", local) if bound else None, bound, not bound
        )

        # cuda allocations land on the CPU, recorded (and remembered on the tensor)
        for name in _FACTORIES:
            real = getattr(torch, name)

            def factory(*args: Any, _real: Callable = real, **kwargs: Any) -> torch.Tensor:
                device = kwargs.get("device")
                asked = None
                if device is not None and torch.device(device).type == "cuda":
                    asked = torch.device(device)
                    if asked.index is None:
                        asked = torch.device("cuda", torch.accelerator.current_device_index())
                    log.allocations.append(torch.device(device))
                    kwargs["device"] = "cpu"
                out = _real(*args, **kwargs)
                if asked is not None:
                    setattr(out, _DEVICE_ATTR, asked)
                return out

            patch(torch, name, factory)

        # torch's namer as the release does it (the registry's hook, when installed, sits in front)
        def model_namer(ranks: Any, use_hashed_name: bool) -> str:
            world_state = c10d._world
            if use_hashed_name:
                salt = world_state.group_count if rel >= (2, 14) else len(world_state.pg_names)
                text = "_".join(map(str, ranks)) + "_" + str(salt)
                name = hashlib.sha1(text.encode()).hexdigest()
            else:
                name = str(world_state.group_count)
            if not use_hashed_name or rel >= (2, 14):
                world_state.group_count += 1
            return name

        patch(c10d, "_process_group_name", model_namer)

        # creations: what each costs on NCCL
        real_new = c10d._new_group_with_tag
        real_new_group = c10d.new_group
        in_flight = [0, 0]  # creations, barriers
        inside_split = threading.local()
        lock = threading.Lock()

        def count(slot: int, step: int) -> None:
            with lock:
                in_flight[slot] += step
                if slot == 0:
                    log.max_concurrent_creations = max(log.max_concurrent_creations, in_flight[0])
                else:
                    log.max_concurrent_barriers = max(log.max_concurrent_barriers, in_flight[1])

        def new_group_with_tag(*args: Any, **kwargs: Any) -> Any:
            if getattr(inside_split, "on", False):
                return real_new(*args, **kwargs)
            call = _bind(real_new, args, kwargs)
            ranks = sorted(call.get("ranks") or range(world_size))
            local_sync = bool(call.get("use_local_synchronization", False))
            device_id = call.get("device_id")
            world_bound = world.bound_device_id  # as this thread sees it
            backend = call.get("backend")
            nccl = backend in (None, "nccl", dist.Backend.NCCL) or str(backend).endswith(":nccl")
            # 2.15 (_new_process_group_helper): options with lazy_init never look for a split source
            options_key = "backend_options" if "backend_options" in call else "pg_options"
            options = call.get(options_key)
            lazy_init = rel >= (2, 15) and bool(getattr(options, "lazy_init", False))
            split = world_bound is not None and nccl and not torchcomms and not lazy_init
            count(0, +1)
            try:
                if split and (rank in ranks or not local_sync):
                    log.world.append(("comm_split", tuple(ranks)))  # ncclCommSplit of the world: all must join
                    log.waits.append(("world", f"world collective #{len(log.world)}", tuple(range(world_size))))
                if creation_s:
                    time.sleep(creation_s)  # widens the window in which another thread could interleave
                if isinstance(options, NcclOptions):  # modelled above; the fake backend takes its own
                    group = real_new(**{**call, options_key: None})
                else:
                    group = real_new(*args, **kwargs)
            finally:
                count(0, -1)
            if group in (None, NON_GROUP_MEMBER):
                return group
            device = device_id or world_bound
            if torchcomms and (device is None or device.index is None):
                log.hazards.append(f"group {group.group_name} of ranks {ranks}: torchcomms comm with no device index")
            eager = nccl and device is not None and not (lazy_init and engine == "nccl2")  # "nccl2 only" lazy
            log.comms[group.group_name] = Comm(
                group.group_name, tuple(ranks), device if eager else None, eager, not eager
            )
            if eager and not split:  # ncclCommInitRank during the creation
                _record_wait(log, "connect", group.group_name, tuple(ranks), outstanding)
            log.names.append((tuple(ranks), group.group_name))
            if not split and nccl:
                log.members.append((group.group_name, tuple(ranks)))
                log.events.append(("create", group.group_name, tuple(ranks)))
            elif not nccl:
                log.members.append((group.group_name, tuple(ranks)))
            return group

        def new_group(ranks: Any = None, *args: Any, **kwargs: Any) -> Any:
            call = _bind(real_new_group, (ranks, *args), kwargs)
            if torchcomms and rel < (2, 14) and call.get("use_local_synchronization"):
                raise NotImplementedError(
                    "new_group cannot delegate to split_group with use_local_synchronization=True; "
                    "split_group requires all ranks in the parent group to participate."
                )
            call.setdefault("ranks", None)
            return c10d._new_group_with_tag(
                call.pop("ranks"),
                call.pop("timeout", None),
                call.pop("backend", None),
                call.pop("pg_options", None),
                None,
                **{k: v for k, v in call.items() if k in ("use_local_synchronization", "group_desc", "device_id")},
            )

        def split_group(
            parent_pg: Any = None,
            split_ranks: Any = None,
            timeout: Any = None,
            pg_options: Any = None,
            group_desc: Any = None,
            **rest: Any,
        ) -> Any:
            if world.bound_device_id is None and not torchcomms:  # as torch: a split needs the bound device
                raise RuntimeError("No device associated with the default pg, not safe to split any process groups")
            splits = tuple(tuple(sorted(r)) for r in split_ranks)
            log.world.append(("split_group", splits))
            log.waits.append(("world", f"world collective #{len(log.world)}", tuple(range(world_size))))
            log.split_options.append(pg_options)
            mine = next((s for s in splits if rank in s), None)
            non_member = (
                split_non_member if split_non_member is not None else (NON_GROUP_MEMBER if rel >= (2, 14) else None)
            )
            if rel < (2, 10):  # non-members return before naming; members counter-name
                if mine is None:
                    return non_member
                name = c10d._process_group_name(list(mine), use_hashed_name=False)
            else:  # every rank names (its own split, or the first one)
                name = c10d._process_group_name(list(mine or splits[0]), use_hashed_name=True)
                if mine is None:
                    return non_member
            inside_split.on = True
            namer = c10d._process_group_name
            c10d._process_group_name = lambda ranks, use_hashed_name: name
            try:
                group = real_new(list(mine), use_local_synchronization=True)
            finally:
                c10d._process_group_name = namer
                inside_split.on = False
            log.comms[group.group_name] = Comm(group.group_name, mine, world.bound_device_id, True, False)
            log.names.append((mine, group.group_name))
            return group

        def store_based_barrier(
            rank_: Any, store: Any, group_name: Any, size: Any, timeout: Any, *a: Any, **k: Any
        ) -> None:
            comm = log.comms.get(group_name)
            ranks = comm.ranks if comm is not None else ()
            log.events.append(("barrier", group_name, ranks))
            log.waits.append(("barrier", group_name, ranks))
            count(1, +1)
            try:
                if creation_s:
                    time.sleep(creation_s)  # waiting for the members
            finally:
                count(1, -1)

        def destroy_process_group(group: Any = None) -> Any:
            if group is not None and group is not dist.GroupMember.WORLD and group not in (NON_GROUP_MEMBER,):
                name = getattr(group, "group_name", None)
                comm = log.comms.pop(name, None)
                if comm is not None:
                    log.events.append(("destroy", name, comm.ranks))
                    if comm.device is not None:  # ncclCommDestroy of a made communicator: intra-node collective
                        log.waits.append(("destroy", name, comm.ranks))
            return real_destroy(group)

        real_destroy = c10d.destroy_process_group
        outstanding: dict = {}

        def collective(op: str, real: Callable) -> Callable:
            def run(*args: Any, **kwargs: Any) -> Any:
                call = _bind(real, args, kwargs)
                group = call.get("group") or world
                name = group.group_name
                comm = log.comms.get(name)
                tensors = [v for v in call.values() if isinstance(v, torch.Tensor)]
                tensors += [
                    t for v in call.values() if isinstance(v, (list, tuple)) for t in v if isinstance(t, torch.Tensor)
                ]
                devices = {tensor_device(t) for t in tensors} - {None}
                device = next(iter(devices), None)
                if op == "barrier" and device is None:
                    device = (
                        comm.device
                        if comm is not None and comm.bound
                        else (
                            getattr(group, "bound_device_id", None)  # torch's barrier: the group's bound device
                            or torch.device("cuda", torch.accelerator.current_device_index())
                        )
                    )
                if comm is not None:
                    if comm.bound and device is not None and device != comm.device:
                        raise RuntimeError(f"{op} on group {name} bound to {comm.device} with a tensor on {device}")
                    if comm.device is None:  # a lazy communicator: made now, among the members
                        comm.device = device or torch.device("cuda", torch.accelerator.current_device_index())
                        log.lazy_inits.append((name, comm.ranks, comm.device))
                        log.events.append(("init", name, comm.ranks))
                        log.waits.append(("init", name, comm.ranks))
                        busy = sorted(k for k, v in outstanding.items() if v and k != name)
                        if busy:
                            log.hazards.append(
                                f"lazy init of group {name} {list(comm.ranks)} while collectives on {busy} are in flight"
                            )
                log.collectives.append((op, name, device))
                out = None if op == "barrier" else real(*args, **kwargs)  # torch's barrier allocates on cuda
                if call.get("async_op"):
                    outstanding[name] = outstanding.get(name, 0) + 1

                    def done(name: str = name) -> None:
                        outstanding[name] -= 1

                    return _Work(out, done)
                return out

            return run

        patch(c10d, "_new_group_with_tag", new_group_with_tag)
        patch(c10d, "_store_based_barrier", store_based_barrier)
        for module in (dist, c10d):
            patch(module, "new_group", new_group)
            patch(module, "split_group", split_group)
            patch(module, "destroy_process_group", destroy_process_group)
            for op in _COLLECTIVES:
                patch(module, op, collective(op, getattr(c10d, op) if module is dist else vars(c10d)[op]))
        import torch.distributed.device_mesh as device_mesh_module

        if hasattr(device_mesh_module, "split_group"):
            patch(device_mesh_module, "split_group", split_group)
        try:
            yield log
        finally:
            log.group_count = c10d._world.group_count


def default_engine(release: tuple[int, int]) -> str:
    """What ``init_process_group("nccl")`` builds on ``release`` with this process's ``TORCH_DIST_USE_NCCL2``."""
    setting = os.environ.get("TORCH_DIST_USE_NCCL2")
    if release >= (2, 15):
        return "nccl" if setting == "0" else "nccl2"
    return "nccl2" if release >= (2, 14) and setting == "1" else "nccl"


@contextlib.contextmanager
def _env(name: str, value: str) -> Iterator[None]:
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old


def check_contract(logs: list[RankLog]) -> None:
    """Raise :class:`ContractViolation` where the ranks' creations would hang (or crash) on NCCL."""
    reference = logs[0]
    for log in logs[1:]:
        if log.world != reference.world:
            k = next(
                (i for i, (a, b) in enumerate(zip(reference.world, log.world)) if a != b),
                min(len(reference.world), len(log.world)),
            )
            mine = log.world[k] if k < len(log.world) else "nothing"
            theirs = reference.world[k] if k < len(reference.world) else "nothing"
            raise ContractViolation(
                f"world collective #{k} of the bound world: rank {reference.rank} made {theirs}, rank {log.rank} "
                f"made {mine}; every world rank must join each ncclCommSplit (rank {reference.rank}: "
                f"{len(reference.world)}, rank {log.rank}: {len(log.world)} in all) — on GPUs this hangs"
            )
    for log in logs:
        if log.hazards:
            raise ContractViolation(f"rank {log.rank}: {log.hazards[0]}")
    named: dict[tuple, dict[int, list[str]]] = {}
    for log in logs:
        for ranks, name in log.names:
            named.setdefault(ranks, {}).setdefault(log.rank, []).append(name)
    for ranks, by_rank in named.items():
        if len({tuple(sorted(v)) for v in by_rank.values()}) > 1:  # distinct communicators: any order
            raise ContractViolation(
                f"the groups of ranks {list(ranks)} have different names on different ranks ({by_rank}): their "
                "store rendezvous (NCCL's unique id, gloo's full mesh, p2p communicators) use different prefixes"
            )
    played = {log.rank for log in logs}
    made: dict[tuple, set[int]] = {}
    for log in logs:
        for name, ranks in log.members:
            made.setdefault(("create", name, ranks), set()).add(log.rank)
        for kind, name, ranks in log.events:
            if kind != "create":
                made.setdefault((kind, name, ranks), set()).add(log.rank)
    for (kind, name, ranks), by in made.items():
        missing = (set(ranks) & played) - by
        if missing:
            what = {
                "create": "never created it",
                "init": "never initialised it (its first collective)",
                "destroy": "never destroyed it (a collective of its members)",
                "barrier": "never reached its barrier",
            }
            raise ContractViolation(f"group {name} of ranks {list(ranks)}: members {sorted(missing)} {what[kind]}")
    for a in logs:
        for b in logs:
            if a.rank >= b.rank:
                continue
            common_a = [e for e in a.events if b.rank in e[2]]
            common_b = [e for e in b.events if a.rank in e[2]]
            if common_a != common_b:
                raise ContractViolation(
                    f"ranks {a.rank} and {b.rank} reach their common groups' creations, first collectives and "
                    f"destroys in different orders: {[(k, list(r)) for k, _, r in common_a]} vs "
                    f"{[(k, list(r)) for k, _, r in common_b]}"
                )
    check_waits(logs)
    devices: dict[str, dict[torch.device, int]] = {}
    for log in logs:
        for comm in log.comms.values():
            if comm.device is not None and len(comm.ranks) > 1:
                other = devices.setdefault(comm.name, {}).get(comm.device)
                if other is not None:
                    raise ContractViolation(
                        f"group {comm.name} {list(comm.ranks)}: ranks {other} and {log.rank} both use {comm.device} "
                        "(NCCL: duplicate GPU)"
                    )
                devices[comm.name][comm.device] = log.rank
    if played == set(range(len(reference.comms[next(iter(reference.comms))].ranks))):
        counts = {log.rank: log.group_count for log in logs}
        if len(set(counts.values())) > 1:
            raise ContractViolation(
                f"torch's group counter differs across ranks: {counts} — the next "
                "counter-named group gets different names (store rendezvous hangs)"
            )


def _record_wait(log: RankLog, kind: str, name: str, ranks: tuple, outstanding: dict) -> None:
    """A blocking step of this rank (an ``ncclCommInitRank``): recorded for :func:`check_waits`, and
    a hazard when this rank has collectives in flight on other communicators (the init deadlock)."""
    log.waits.append((kind, name, ranks))
    busy = sorted(k for k, v in outstanding.items() if v and k != name)
    if busy:
        log.hazards.append(
            f"init of group {name} {list(ranks)} at its {kind} while collectives on {busy} are in flight"
        )


def _record_connect(log: RankLog, backend: Any, device: Any, outstanding: dict) -> None:
    """``eager_connect_single_device`` of a group's backend: made now, bound to ``device``. At a
    creation given ``device_id`` the group is not registered yet (the creation records it)."""
    for group in list(c10d._world.pg_map):
        try:
            mine = group._get_backend(torch.device("cuda")) is backend
        except RuntimeError:
            continue
        comm = log.comms.get(group.group_name) if mine else None
        if comm is not None and comm.device is None:
            comm.device, comm.bound, comm.lazy = torch.device(device), True, False
            _record_wait(log, "connect", comm.name, comm.ranks, outstanding)
            return


def check_waits(logs: list[RankLog]) -> None:
    """Replay every rank's blocking steps (connects at creation or later, lazy inits, destroys of made
    communicators, barriers, world collectives) as NCCL runs them: a step ends when every member is at
    the same step. Raise :class:`ContractViolation` when the replay sticks: a cycle of waits across
    ranks (on GPUs a hang that no pairwise order check sees) or members that never reach a step."""
    played = {log.rank for log in logs}
    queues = {log.rank: list(log.waits) for log in logs}
    at = dict.fromkeys(queues, 0)
    progress = True
    while progress:
        progress = False
        for rank, queue in queues.items():
            if at[rank] >= len(queue):
                continue
            step = queue[at[rank]]
            members = (set(step[2]) & played) or {rank}  # a barrier of a group not recorded yet: its own
            if all(at[m] < len(queues[m]) and queues[m][at[m]] == step for m in members):
                for m in members:
                    at[m] += 1
                progress = True
    stuck = {r: queues[r][at[r]] for r in queues if at[r] < len(queues[r])}
    if not stuck:
        return

    def text(step: tuple) -> str:
        return f"{step[0]} of {step[1]} {list(step[2])}"

    for rank, step in sorted(stuck.items()):
        gone = sorted(m for m in set(step[2]) & played if m not in stuck)
        if gone:
            raise ContractViolation(
                f"rank {rank} waits in the {text(step)}, which members {gone} never reach "
                "(they finished without it) — on GPUs this hangs"
            )
    rank, chain = min(stuck), []
    while rank not in chain:
        chain.append(rank)
        step = stuck[rank]
        rank = min(m for m in set(step[2]) & played if queues[m][at[m]] != step)
    cycle = chain[chain.index(rank) :]
    raise ContractViolation(
        "a cycle of waits across ranks (on GPUs this hangs): "
        + "; ".join(
            f"rank {r} waits in the {text(stuck[r])} for rank {cycle[(i + 1) % len(cycle)]}"
            for i, r in enumerate(cycle)
        )
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
