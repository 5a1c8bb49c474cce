"""One communicator per (world, backend, rank set), created only by the ranks that belong to it.

Member-only creation
--------------------
A rank needs only the communicators it is a member of, so the registry creates a group with
``torch.distributed.new_group(ranks, use_local_synchronization=True)``: only the members call, and
the rendezvous (gloo's full mesh, NCCL's unique id) goes through the store under a prefix equal to
the group's name. Non-members issue nothing. A mesh dim therefore costs each rank one call
(its own group), whatever the world size.

Why the registry names groups itself (checked in torch 2.6 … 2.14's ``distributed_c10d.py``):

- without local synchronization, ``_process_group_name`` names a group ``str(_world.group_count)``
  and increments that counter; every rank of the world must make the call so the counters stay
  equal. That is the O(groups) loop member-only creation removes;
- with local synchronization the name is ``_hash_ranks_to_str(ranks)`` = ``sha1("_".join(ranks) +
  "_" + salt)``. Up to torch 2.13 the salt is ``len(_world.pg_names)``, the groups *this rank* has
  registered; non-members never register a group, so two members of the same rank set that belong
  to different numbers of other groups (a rank of a sub-world mesh and one outside it; EP groups
  that span pipeline stages; compat's legacy groups) compute different names, hence different store
  prefixes, and the creation hangs. From 2.14 the salt is ``_world.group_count`` and the hashed
  namer increments it too; only members call it, so the counters (and later names) diverge the
  same way;
- the registry's creations never call torch's namer, so the world-collective, counter-named
  creations other code still makes (DeviceMesh's own ``__init__``/``_flatten``, legacy DeepSpeed,
  user code) keep agreeing across ranks after ours: every rank makes those calls, every rank
  increments the counter.

So the registry passes torch a name that is a function of the rank set alone:
``mesh_core.<sha1(backend, ranks)>.<generation>`` where *generation* counts earlier creations of
the same (backend, rank set) in this world (after :meth:`GroupRegistry.release` destroyed one);
every member sees the same requests and releases for its rank set, so every member computes the
same name. The name is injected by swapping ``distributed_c10d._process_group_name`` for the
duration of one public ``new_group`` call, and the created group's ``group_name`` is checked
afterwards, so a torch that stops using that hook fails loudly (:class:`GroupNamingError`) instead
of hanging.

``split_group`` (one collective call per partition, ``ncclCommSplit``) is used instead where the
default group is bound to a device whose backend reports ``supports_splitting``, an accelerator is
present, no other backend is requested and the mesh covers the whole world (split_group is
collective over its parent, so a sub-world mesh would force its non-members to call):
:func:`choose_creation_path` is that rule as a typed decision over :class:`CreationInputs`. A mesh
takes it only inside its constructor, where every world rank is, in the same order; a group asked
for later (a flattened dim, a dim of size 1, a legacy getter), possibly by some ranks only, is
member-only. Split groups are named by the same hook (torch's namer is not called, so its group
counter stays equal on every rank whether a release names split members only, 2.6–2.9, or every
rank, 2.14).

A bound world (``init_process_group(device_id=...)``, which DeepSpeed does on a CUDA world of more
than one rank) makes torch build *every* ``new_group`` by splitting the world's communicator
(``ncclCommSplit``), a collective of every world rank, which non-members of a member-only creation
never join. So a member-only creation hides the default group's bound device *from the creating
thread* for its one ``new_group`` call (:func:`mesh_core.torch_compat.unbound_default_group`; every
other thread keeps seeing it): torch then creates the communicator among the members alone, and the
registry binds the group to the rank's device. docs/nccl.md lists which path each kind of group
takes, bound and unbound.

The connect plan (docs/nccl.md): creating never waits for the members; the communicator is connected
(``ncclCommInitRank``) by :meth:`GroupRegistry.connect` at a connect point — the end of a whole-world
build, a resume, an explicit call — one rank set after the other in ascending order on every rank,
each after a bounded store arrival of its members that names the absent ones; or else by torch at its
first collective. Blocking creation in each rank's own request order could wait in a cycle across
ranks (ring-ordered pair meshes) and would initialise NCCL wherever a handle is first fetched, in
flight work or not. Host backends (gloo) connect inside the creation: there the arrival runs first.

Invariants the callers keep: identical rank sets share one communicator (the cache below; a split
child is kept under its own key, :data:`SPLIT_CHILD`, apart from member-only requests); every
member of a rank set issues its requests for it in the same order (meshes are built, and lazy
groups requested, in the same program order on all their members). Each creation, reuse or connect
is logged at DEBUG with the rank set, the requester and its dims.

Registries are kept per default process group (the "world"); a destroyed and re-initialised world
gets a fresh one.

Threads
-------
torch's public ``new_group`` / ``split_group`` take no group name (checked in torch 2.6 … 2.14: only a
default group that implements ``new_group`` itself, or the private ``_new_process_group_helper``,
accept one), so the name still goes in through ``distributed_c10d._process_group_name``. It is
swapped for a hook that answers the name only to the thread that set it and delegates to torch's
own function for every other caller, so a plain ``dist.new_group`` running in another thread at
the same time keeps torch's naming. The hook is installed by the first creation in flight and
torch's function put back (in ``finally``) when the last one ends, under a process-wide lock. The
bound device is hidden the same way, per thread: no process state another thread reads changes
during a creation, so a foreign ``new_group``, ``split_group`` or ``DeviceMesh`` creation in another
thread takes the path its peers take.

The registry's bookkeeping (cache, reference counts, generations) is under a per-registry lock
that is never held across a blocking call; a rank set requested by two threads at once is created
by the first and waited for by the second. Creations are not serialized per process, bound world
or not: a creation waits for its members (gloo's full mesh, NCCL's connect, the
``TORCH_DIST_INIT_BARRIER=1`` barrier), and serializing would deadlock two threads whose peers are
in each other's creation.
"""

from __future__ import annotations

import contextlib
import enum
import hashlib
import logging
import threading
import weakref
from collections import Counter
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Callable, Iterable, Iterator, Optional, Sequence

import torch
import torch.distributed as dist
from torch.distributed import ProcessGroup

from . import consistency, torch_compat
from .absence import AbsentRanksError
from .rendezvous import arrive

logger = logging.getLogger(__name__)

RankKey = tuple[int, ...]
Key = tuple[Optional[str], RankKey]

#: ``key[0]`` of a ``split_group`` child: split children have their own keys (and names), never shared
#: with member-only requests of the same rank set, so which one a rank set gets does not depend on which
#: thread of a rank reaches it first (a whole-world build splitting while another thread's sub-world
#: mesh asks for one of its rank sets)
SPLIT_CHILD = "split_group"


def _backend_of(key: Key) -> Optional[str]:
    """The backend a key's communicator is created with (None: the world's)."""
    return None if key[0] == SPLIT_CHILD else key[0]


class GroupNamingError(RuntimeError):
    """torch did not give a member-only group the name every member agreed on."""


class CreationPath(enum.Enum):
    """How a rank set's communicator is created."""

    LOCAL = "new_group(use_local_synchronization=True), members only"
    SPLIT = "split_group from the default group, one collective call per partition"
    WORLD = "the default group itself (the rank set is the whole world)"


@dataclass(frozen=True)
class CreationInputs:
    """What :func:`choose_creation_path` decides on (read from torch by :meth:`probe`)."""

    bound_device: Optional[torch.device]  # the default group's bound_device_id
    accelerator_available: bool
    supports_splitting: bool  # the default group's backend for that device says so
    backend_requested: Optional[str]  # None: the default group's backend
    whole_world: bool  # the partition covers every rank of the world

    @classmethod
    def probe(cls, backend: Optional[str], whole_world: bool) -> "CreationInputs":
        world = torch_compat.default_group()
        device = torch_compat.bound_device(world)
        available = torch_compat.accelerator_available()
        splitting = device is not None and available and torch_compat.backend_supports_splitting(world, device)
        return cls(device, available, splitting, backend, whole_world)


def choose_creation_path(inputs: CreationInputs) -> CreationPath:
    """SPLIT where torch's ``split_group`` can serve a whole-world partition, else LOCAL."""
    if (
        inputs.bound_device is not None
        and inputs.accelerator_available
        and inputs.supports_splitting
        and inputs.backend_requested is None
        and inputs.whole_world
    ):
        return CreationPath.SPLIT
    return CreationPath.LOCAL


def group_name_for(key: Key, generation: int = 0) -> str:
    """The name every member of ``key``'s rank set gives its communicator (a function of the set)."""
    backend, ranks = key
    text = f"{backend or ''}|{','.join(map(str, ranks))}"
    return f"mesh_core.{hashlib.sha1(text.encode(), usedforsecurity=False).hexdigest()}.{generation}"


_NAMING_LOCK = threading.Lock()
_naming = threading.local()  # .namer: ranks -> the name of the group this thread is creating, if any
_torch_namer = None  # torch's _process_group_name while the hook is installed
_naming_users = 0


def _hooked_process_group_name(ranks, use_hashed_name):  # type: ignore[no-untyped-def]
    namer = getattr(_naming, "namer", None)
    if namer is not None:
        return torch_compat.group_name(namer(ranks))
    return _torch_namer(ranks, use_hashed_name)  # type: ignore[misc]


@contextlib.contextmanager
def _named(name: "str | Callable[[Sequence[int]], str]") -> Iterator[None]:
    """Groups this thread creates inside the block are named ``name`` (or ``name(ranks)``); other
    threads unaffected. torch's namer is not called for them, so its group counter does not move."""
    global _torch_namer, _naming_users
    namer = name if callable(name) else (lambda ranks: name)
    if getattr(_naming, "namer", None) is not None:
        raise RuntimeError(f"nested member-only group creation in one thread ({name!r})")
    with _NAMING_LOCK:
        if _naming_users == 0 and torch_compat.process_group_namer() is not _hooked_process_group_name:
            _torch_namer = torch_compat.process_group_namer()
            torch_compat.set_process_group_namer(_hooked_process_group_name)
        _naming_users += 1
    _naming.namer = namer
    try:
        yield
    finally:
        _naming.namer = None
        with _NAMING_LOCK:
            _naming_users -= 1
            if _naming_users == 0:
                if torch_compat.process_group_namer() is _hooked_process_group_name:
                    torch_compat.set_process_group_namer(_torch_namer)  # type: ignore[arg-type]
                else:  # someone patched over the hook meanwhile: leave theirs, the hook only delegates
                    logger.warning("distributed_c10d._process_group_name was replaced during group creation")


def _binds_to(backend: Optional[str], device: torch.device) -> bool:
    """Whether a group of ``backend`` (None: the world's) serves ``device``'s type, so it can be bound
    to it (an explicit host backend such as gloo is not bound; it connects at creation anyway)."""
    return backend is None or torch_compat.home_device_type(str(backend).lower()) == device.type


def new_member_group(
    ranks: Sequence[int], name: str, backend: Optional[str] = None
) -> tuple[ProcessGroup, Optional[torch.device]]:
    """Create the communicator for ``ranks`` (this rank among them) with only its members calling,
    without waiting for them (see "The connect plan"). Returns the group and the device it is to be
    connected on by :meth:`GroupRegistry.connect` (None: nothing to connect — an unbound world, whose
    communicators torch makes at their first collective, a host backend, which connected during the
    creation, or torchcomms, which connects at creation).

    On a bound world the bound device is hidden from this thread for this one call (no split of the
    world's communicator, which non-members would have to join) and the group is bound to the
    rank's device (its barrier and first collective run there), but not connected."""
    with _named(name), torch_compat.unbound_default_group() as bound:
        device = bound if bound is not None and _binds_to(backend, bound) else None
        # torchcomms (2.14) builds a member-only new_comm on device_id and needs its index
        eager = device if device is not None and torch_compat.torchcomms_enabled() else None
        group = dist.new_group(ranks=list(ranks), backend=backend, use_local_synchronization=True, device_id=eager)
    _check_name(group, ranks, name)
    if device is None or eager is not None:
        return group, None
    group.bound_device_id = device
    return group, device


def _blocks_at_creation(backend: Optional[str]) -> bool:
    """Whether a member-only creation with ``backend`` (None: the world's) waits for its members
    (gloo connects its full mesh in the constructor; NCCL connects later)."""
    name = str(backend if backend is not None else dist.get_backend()).lower()
    return "gloo" in name or "mpi" in name


def _key_order(key: Key) -> tuple[RankKey, str]:
    """The one order every rank connects rank sets in (ascending rank set, then backend)."""
    return key[1], key[0] or ""


def _arrive(what: str, name: str, ranks: RankKey, timeout: Optional[timedelta]) -> None:
    """Wait (bounded) until every member of ``ranks`` reaches ``what`` of group ``name``; raise
    :class:`~mesh_core.absence.AbsentRanksError` naming the missing members on every member that
    came. Skipped where the store holds nothing (the backends the mesh check skips)."""
    if len(ranks) < 2 or dist.get_backend() in consistency.SKIPPED_BACKENDS:
        return
    limit = timeout if timeout is not None else consistency.world_timeout()
    rank = dist.get_rank()
    members = list(ranks)

    def absent(arrived: list[int], missing: Optional[list[int]]) -> BaseException:
        shown = f"ranks {members}" if len(members) <= 16 else f"{len(members)} ranks {members[:8]}.."
        if missing:
            text = (
                f"the group of {shown} ({name}): only ranks {arrived} reached its {what} within {limit}; "
                f"ranks {missing} never asked for it: every member must ask for a group (a mesh's dim, a "
                "flattened dim, expert groups, a legacy getter) that any member asks for"
            )
        else:
            text = (
                f"the group of {shown} ({name}): rank {rank} reached its {what} after the other members "
                f"gave up waiting ({limit})"
                if missing == []
                else f"the group of {shown} ({name}): the store went away during its {what}"
            )
        return AbsentRanksError(
            text, mesh=f"group {members}", rank=rank, arrived=arrived, missing=missing, quiet=None, timeout=limit
        )

    arrive(torch_compat.default_store(), f"mesh_core/{what}/{name}", members, limit, absent)


def _check_name(group: Any, ranks: Sequence[int], name: str) -> None:
    if torch_compat.is_non_member(group) or group.group_name != name:
        got = None if torch_compat.is_non_member(group) else group.group_name
        raise GroupNamingError(
            f"torch {torch.__version__} named the group of ranks {list(ranks)[:8]} {got!r}, not {name!r}; "
            "ds-mesh needs a name that depends on the rank set alone"
        )


class GroupRegistry:
    """This rank's rank set → process group cache for one world, with reference counts.

    Thread-safe bookkeeping (see the module docstring, "Threads"); the cross-rank rule is
    c10d's: every member of a rank set issues its requests and releases of that set in the same
    order, so threads that request or release the *same* rank set concurrently must have their
    order fixed by the program (one thread, or a join/barrier between them).
    """

    _not_a_holder = True  # bookkeeping: mesh_core.rebind's walk does not enter it
    #: how long a connect (or a gloo creation) waits for the group's members before naming the
    #: absent ones; None: the world's timeout
    arrival_timeout: Optional[timedelta] = None

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._pending: dict[Key, threading.Event] = {}  # rank sets another thread is creating
        self._groups: dict[Key, ProcessGroup] = {}
        self._refs: Counter = Counter()
        self._generation: Counter = Counter()
        self._split_known: set[Key] = set()  # sets of every split partition (same on all ranks)
        self._aside: dict[Key, "weakref.ref[ProcessGroup]"] = {}  # set aside (destroyed), not yet back
        self._unconnected: dict[Key, torch.device] = {}  # created, to be connected on that device
        self._aliases: dict[Key, list[str]] = {}  # earlier names torch resolves to the group now held
        self.created = 0  # creation calls this rank issued (new_group / split_group)
        self.reused = 0  # requests served from the cache
        self.world_size = dist.get_world_size()
        self.rank = dist.get_rank()

    @staticmethod
    def key(ranks: Iterable[int], backend: Optional[str] = None) -> Key:
        return (backend, tuple(sorted(int(r) for r in ranks)))

    def has(self, ranks: Iterable[int], backend: Optional[str] = None) -> bool:
        """Whether this rank holds a communicator for ``ranks`` (it must be a member)."""
        key = self.key(ranks, backend)
        return key in self._groups or self.is_world(key)

    def get(self, ranks: Iterable[int], backend: Optional[str] = None, *, asker: str = "") -> Optional[ProcessGroup]:
        """This rank's communicator for ``ranks``, created member-only on first request.

        Returns None (and issues nothing) when this rank is not in ``ranks``. Every member must
        request the same rank sets in the same order.
        """
        key = self.key(ranks, backend)
        if self.rank not in key[1]:
            return None
        return self._acquire(key, asker)

    def split_key(self, ranks: Iterable[int]) -> Key:
        """The key of ``ranks``' ``split_group`` child (the world's key where ``ranks`` is the world)."""
        plain = self.key(ranks)
        return plain if self.is_world(plain) else (SPLIT_CHILD, plain[1])

    def partition(
        self, rank_lists: Sequence[Sequence[int]], backend: Optional[str] = None, *, asker: str = ""
    ) -> tuple[Optional[ProcessGroup], list[Key]]:
        """This rank's group of a partition (the one list holding it), created member-only.

        Returns the group (None outside every list) and the keys this rank now references.
        """
        for ranks in rank_lists:
            if self.rank in ranks:
                key = self.key(ranks, backend)
                return self._acquire(key, asker), [key]
        return None, []

    def split(
        self, rank_lists: Sequence[Sequence[int]], *, asker: str = ""
    ) -> tuple[Optional[ProcessGroup], list[Key]]:
        """Like :meth:`partition` via ``split_group`` (default backend, whole-world partition).

        Collective over the world: every rank calls it with the same lists, in the same order (mesh
        construction only); one call covers the partition's sets that no earlier split created.
        Each split group is named by the registry as a member-only group is (``torch``'s namer is
        not called, so its group counter stays equal on every rank, whichever ranks a release names).
        """
        keys = [self.split_key(r) for r in rank_lists]
        with self._lock:
            new = [k for k in keys if k not in self._split_known and not self.is_world(k)]
            self._split_known.update(new)
            if new:
                self.created += 1
            names = {k: group_name_for(k, self._generation[k]) for k in new}
        mine = next((k for k in keys if self.rank in k[1]), None)
        fresh: Optional[ProcessGroup] = None
        if new:
            try:
                with _named(lambda ranks: names.get(self.split_key(ranks), "mesh_core.unused")):
                    fresh = torch_compat.split_group([list(k[1]) for k in new])
                if fresh is not None:
                    _check_name(fresh, mine[1] if mine else (), names.get(mine, "?"))  # type: ignore[index]
            except BaseException:
                with self._lock:
                    self._split_known.difference_update(new)
                raise
        if mine is None:
            return None, []
        if fresh is not None:
            with self._lock:
                self._generation[mine] += 1  # the name is used: a later creation of the set gets the next
                held = mine in self._groups
                if not held:
                    self._groups[mine] = fresh
                    self._refs[mine] += 1
            if held:  # already held from a member-only creation: keep sharing it
                dist.destroy_process_group(fresh)
            else:
                self._log("created (split)", mine, asker)
                return fresh, [mine]
        # held already, or split earlier and released since: members fall back together
        return self._acquire(mine, asker), [mine]

    def adopt(
        self, rank_lists: Sequence[Sequence[int]], group: Optional[ProcessGroup], backend: Optional[str] = None
    ) -> list[Key]:
        """Record this rank's group of a partition some other creator made (``group``)."""
        for ranks in rank_lists:
            if self.rank in ranks:
                key = self.key(ranks, backend)
                with self._lock:
                    adopted = key not in self._groups and group is not None
                    if adopted:
                        self._groups[key] = group  # type: ignore[assignment]
                    self._refs[key] += 1
                if adopted:
                    self._log("adopted", key, "")
                return [key]
        return []

    def release(self, keys: Iterable[Key]) -> int:
        """Drop one reference per key; destroy groups nobody references. Returns groups destroyed."""
        doomed = []
        with self._lock:
            for key in keys:
                self._refs[key] -= 1
                if self._refs[key] > 0:
                    continue
                del self._refs[key]
                self._aside.pop(key, None)
                self._unconnected.pop(key, None)
                self._drop_aliases(key)
                group = self._groups.pop(key, None)
                if group is not None and group is not dist.GroupMember.WORLD:
                    doomed.append(group)
        if not dist.is_initialized():
            return 0
        for group in doomed:  # outside the lock: a later request of the key makes a new generation
            dist.destroy_process_group(group)
        return len(doomed)

    def set_aside(self, key: Key) -> tuple[Optional[ProcessGroup], bool]:
        """Take ``key``'s communicator out of the cache, its references still counted (see
        :mod:`mesh_core.step_aside`). Returns the group and whether this call took it out (the caller
        then destroys it). For a key set aside earlier: the group while something still holds it
        (kept weakly), else None; for a key never held: (None, False)."""
        with self._lock:
            group = self._groups.pop(key, None)
            self._unconnected.pop(key, None)
            self._drop_aliases(key)
            if group is not None:
                self._aside[key] = weakref.ref(group)
                return group, True
            ref = self._aside.get(key)
            return (ref() if ref is not None else None), False

    def alias(self, key: Key, name: str) -> bool:
        """Make torch resolve ``name`` (an earlier generation's group name of ``key``) to the group held
        now, until it is released: a torch ``DeviceMesh`` (and DTensors on it) built before a release
        finds the re-created group. False where torch cannot (nothing held, or no name registry)."""
        with self._lock:
            group = self._groups.get(key)
            if name in self._aliases.get(key, ()):  # a second mesh sharing the rank set resumed it too
                return True
            try:
                if group is None or not torch_compat.alias_group_name(name, group):
                    return False
            except RuntimeError:  # the name is registered to another group: leave torch's entry as it is
                logger.warning(
                    "group name %s is taken; a DeviceMesh built before the release will not find %s", name, list(key[1])
                )
                return False
            self._aliases.setdefault(key, []).append(name)
            return True

    def _drop_aliases(self, key: Key) -> None:
        for name in self._aliases.pop(key, ()):
            torch_compat.drop_group_alias(name)

    def is_aside(self, key: Key) -> bool:
        """Whether ``key``'s communicator is set aside and not brought back yet."""
        with self._lock:
            return key in self._aside

    def bring_back(self, key: Key, *, asker: str = "") -> ProcessGroup:
        """The communicator of a set-aside ``key``: created again member-only under the next
        generation's name (or the one already brought back); its reference count is unchanged."""
        group = self._acquire(key, asker)
        with self._lock:
            self._refs[key] -= 1
            self._aside.pop(key, None)
        return group

    def forget(self, group: ProcessGroup) -> int:
        """Drop every cache entry holding ``group`` (already destroyed by someone else), so no later
        request is served a dead communicator. Returns the number of entries dropped."""
        with self._lock:
            keys = [key for key, cached in self._groups.items() if cached is group]
            for key in keys:
                del self._groups[key]
                self._refs.pop(key, None)
                self._unconnected.pop(key, None)
        return len(keys)

    def connect(self, keys: Optional[Iterable[Key]] = None, *, timeout: Optional[timedelta] = None) -> int:
        """Connect the communicators of ``keys`` (default: every one this rank holds) that are not
        connected yet, one after the other in ascending order of rank sets — one order on every
        rank, so connections of overlapping rank sets cannot wait on each other in a cycle. A
        collective of each group's members: each first waits (``timeout``, default the world's) for
        all of them and raises :class:`~mesh_core.absence.AbsentRanksError` naming those that never
        came. Returns how many this call connected."""
        with self._lock:
            wanted = set(self._unconnected) if keys is None else {k for k in keys if k in self._unconnected}
        connected = 0
        for key in sorted(wanted, key=_key_order):
            with self._lock:
                device = self._unconnected.pop(key, None)
                group = self._groups.get(key)
            if device is None or group is None:
                continue  # connected (or released) meanwhile by another thread
            if torch_compat.backend_initialised(group, device):
                continue  # made by its first collective already (on every member: that init was collective)
            try:
                _arrive("connect", group.group_name, key[1], timeout or self.arrival_timeout)
                torch_compat.connect_backend(group, device)
            except BaseException:
                with self._lock:
                    if self._groups.get(key) is group:
                        self._unconnected[key] = device
                raise
            connected += 1
            self._log("connected", key, "")
        return connected

    def is_connected(self, key: Key) -> bool:
        """Whether ``key``'s communicator is held and needs no :meth:`connect` (it was connected,
        or is connected by torch at its first collective / was at its creation)."""
        with self._lock:
            return key in self._groups and key not in self._unconnected

    def cached(self, key: Key) -> Optional[ProcessGroup]:
        """The communicator held for ``key``, without creating one (None when none is held)."""
        with self._lock:
            return self._groups.get(key)

    def held(self) -> dict[Key, ProcessGroup]:
        """A snapshot of every communicator held, by rank set."""
        with self._lock:
            return dict(self._groups)

    def is_world(self, key: Key) -> bool:
        """Whether ``key`` is the default group's rank set (the world, never created here)."""
        return key[0] is None and len(key[1]) == self.world_size

    @property
    def rank_sets(self) -> int:
        """Distinct rank sets this rank holds a communicator for (the world counts once used)."""
        with self._lock:
            return len(self._groups) + (1 if any(self.is_world(k) for k in self._refs) else 0)

    # --- internals ----------------------------------------------------------------------------
    def _acquire(self, key: Key, asker: str) -> ProcessGroup:
        while True:
            with self._lock:
                if key in self._groups:
                    self._refs[key] += 1
                    self.reused += 1
                    group = self._groups[key]
                    break
                if self.is_world(key):
                    self._refs[key] += 1
                    return dist.GroupMember.WORLD  # type: ignore[return-value]
                pending = self._pending.get(key)
                if pending is None:  # this thread creates it (outside the lock: it blocks on peers)
                    done = self._pending[key] = threading.Event()
                    name = group_name_for(key, self._generation[key])
                    self._generation[key] += 1
                    self.created += 1
            if pending is None:
                return self._create_member_group(key, name, done, asker)
            pending.wait()  # another thread of this rank is creating the same rank set
        self._log("reused", key, asker)
        return group

    def _create_member_group(self, key: Key, name: str, done: threading.Event, asker: str) -> ProcessGroup:
        try:
            if _blocks_at_creation(_backend_of(key)):  # a bounded wait naming absent members, before gloo's own
                _arrive("create", name, key[1], self.arrival_timeout)
            group, device = new_member_group(key[1], name, _backend_of(key))
            with self._lock:
                self._groups[key] = group
                self._refs[key] += 1
                if device is not None:
                    self._unconnected[key] = device
        finally:
            with self._lock:
                del self._pending[key]
            done.set()
        self._log("created", key, asker)
        return group

    def _log(self, what: str, key: Key, asker: str) -> None:
        if logger.isEnabledFor(logging.DEBUG):
            ranks = key[1]
            shown = list(ranks) if len(ranks) <= 8 else f"{list(ranks[:4])}..{ranks[-1]} ({len(ranks)} ranks)"
            logger.debug(
                "rank %d %s group ranks=%s backend=%s for %s",
                self.rank,
                what,
                shown,
                key[0] or "default",
                asker or "?",
            )


_REGISTRIES: "weakref.WeakKeyDictionary[ProcessGroup, GroupRegistry]" = weakref.WeakKeyDictionary()


def registry_for_world() -> GroupRegistry:
    """The registry of the current default process group (created on first use)."""
    world = torch_compat.default_group()
    registry = _REGISTRIES.get(world)
    if registry is None:
        torch_compat.check_settings()  # every creation path goes through here: none on a refused engine (nccl2)
        registry = _REGISTRIES[world] = GroupRegistry()
    return registry
