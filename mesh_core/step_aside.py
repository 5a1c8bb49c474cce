"""Communicators that step aside: release every communicator a mesh holds, bring them back later.

Colocated RL (trainer and rollout on the same devices) wants the trainer's idle communicators gone
while the rollout runs. :func:`release_communicators` takes them away and
:func:`resume_communicators` brings them back with the same rank sets, member-only, in one order
every rank shares (sorted by rank set, so overlapping creations never wait on each other); training afterwards is bit-identical to never releasing (the collectives run
over the same ranks in the same order). :func:`holds` reports what a mesh holds.

How a communicator steps aside depends on the backend:

- **suspend** — an NCCL group when the NCCL torch runs is 2.29.7 or newer and torch's backend object
  has ``suspend()``/``resume()`` (torch 2.13+; a backend that refuses is destroyed instead): its backend's
  ``suspend()`` (``ncclCommSuspend``) releases the communicator's device memory and ``resume()``
  restores it. The ``ProcessGroup`` objects stay, so nothing that holds them changes.
- **destroy** — every other backend (gloo, older NCCL): the group is destroyed
  (``dist.destroy_process_group``) and a :class:`ReleasedCommunicator` is put wherever the mesh, and
  the ``holders`` the caller names, held it (:func:`mesh_core.rebind.rebind_references`), so nothing
  keeps it alive and a use while released raises naming the remedy. Resume creates a new group
  for the same rank set, named ``mesh_core.<sha1 of the rank set>.<next generation>`` (a fresh
  store prefix: the old one still holds the first rendezvous' keys), and puts it where the stand-in
  is. torch's name registry resolves the old group names to the new groups until they are released
  (:meth:`GroupRegistry.alias`), so a ``DeviceMesh`` built before the release — and the DTensors /
  FSDP2 state on it — resolves its dims again after resume; the mesh's own ``DeviceMesh`` is dropped
  while released (its group table pointing at the stand-ins) and, if still held, is the mesh's again.
  FSDP2's cached ``ProcessGroup`` objects are module state: name the module as a holder. :mod:`compat.engine_step_aside` names a DeepSpeed engine's holders.

The world (default) group is never released. Release and resume are explicit and collective over
each group's members: every rank of the mesh calls them at the same program point (a colocated loop
releases after its optimizer step, before the rollout, and resumes after the rollout, before the
next forward). Nothing resumes lazily at a first collective: a rank would create (NCCL: connect)
a group its peers are not creating at that moment. A rank set another mesh shares is released for
both: release and resume both meshes (the second finds the rank set already set aside / back).
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import types
import weakref
from dataclasses import dataclass, field
from typing import Any, Iterable, Optional

import torch
import torch.distributed as dist
from torch.distributed import ProcessGroup

from . import torch_compat
from .rebind import held_under, rebind_references
from .registry import Key
from .spec import MeshSpecError

logger = logging.getLogger(__name__)

ATTR = "_step_aside"  # the record of a released mesh, on the mesh
SUSPEND_MIN_NCCL = (2, 29, 7)  # ncclCommSuspend / ncclCommMemStats
_LOCK = threading.Lock()


@dataclass(frozen=True)
class HeldCommunicator:
    """One communicator a mesh holds on this rank."""

    uses: tuple[str, ...]  # the mesh's names for it: dims ("dp", "dp x sp"), "ep(4)", "p2p"
    ranks: tuple[int, ...]
    backend: str  # the backend name torch reports ("" while released)
    group_name: str  # torch's group name ("" while released)
    state: str  # "alive", "suspended" or "released"
    memory_stats: Optional[dict[str, int]] = None  # the backend's own counters, where it reports them


@dataclass(frozen=True)
class MeshHoldings:
    """What a mesh holds on this rank: its communicators (the world group excluded).

    Device memory is what the backends report per communicator (``Backend.memory_stats()``: torch's
    NCCL backend on NCCL >= 2.29.7 gives ``total`` / ``persist`` / ``suspend`` bytes and
    ``suspended``); gloo reports nothing, and ``torch.cuda.memory_stats`` does not see NCCL's buffers
    (they are allocated outside the caching allocator). The device-wide free memory before and after
    a release, where a CUDA device is in use, is in :attr:`ReleaseRecord.device_free_bytes`."""

    communicators: tuple[HeldCommunicator, ...]

    @property
    def device_memory_bytes(self) -> Optional[int]:
        """The ``total`` bytes the backends report, summed; None where none reports."""
        totals = [c.memory_stats["total"] for c in self.communicators if c.memory_stats and "total" in c.memory_stats]
        return sum(totals) if totals else None

    @property
    def alive(self) -> int:
        """Communicators that are usable now (neither suspended nor released)."""
        return sum(1 for c in self.communicators if c.state == "alive")

    def rank_sets(self) -> list[tuple[int, ...]]:
        return [c.ranks for c in self.communicators]


class ReleasedCommunicator:
    """Stands where a destroyed group was held until it is resumed; any use says so.

    Holding no reference to the released group lets it go now (gloo's connections close when its
    last reference does; NCCL's communicator is destroyed by ``destroy_process_group`` anyway)."""

    def __init__(self, ranks: tuple[int, ...], mesh: str) -> None:
        self.__dict__.update(_ranks=ranks, _mesh=mesh)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):  # copy / pickle / hasattr probes
            raise AttributeError(name)
        raise MeshSpecError(
            f"the communicator of ranks {list(self._ranks)} of {self._mesh} is released "
            "(release_communicators); call resume_communicators() on every member before using it"
        )

    def __repr__(self) -> str:
        # torch's collectives put the repr into their own error ("Process group ... is not initialized")
        return (
            f"ReleasedCommunicator(ranks={list(self._ranks)} of {self._mesh}: released by "
            "release_communicators; call resume_communicators() on every member first)"
        )


@dataclass
class ReleaseRecord:
    """What :func:`release_communicators` did; kept on the mesh until it is resumed."""

    _not_a_holder = True  # the reference walk does not enter it

    keys: list[Key]
    mode: dict[Key, str]  # key -> "suspend" | "destroy"
    suspended: dict[Key, ProcessGroup] = field(default_factory=dict)
    standins: dict[Key, ReleasedCommunicator] = field(default_factory=dict)
    old: dict[Key, "weakref.ref[ProcessGroup]"] = field(default_factory=dict)  # destroyed groups, weakly
    old_names: dict[Key, str] = field(default_factory=dict)  # their names (resolved to the new groups on resume)
    device_mesh: Optional["weakref.ref[Any]"] = None  # the torch DeviceMesh dropped at release, weakly
    rebound: list[str] = field(default_factory=list)  # where the stand-ins were put
    dim_entries: list[tuple[str, ...]] = field(default_factory=list)  # DeviceMesh dims served by stand-ins
    device_mesh_layout: Optional[tuple[Any, tuple[str, ...], str]] = None  # (mesh tensor, dim names, device type)
    device_free_bytes: Optional[tuple[int, int]] = None  # (before, after), CUDA only

    def still_referenced(self) -> list[tuple[int, ...]]:
        """Rank sets whose destroyed group something the walk did not reach still holds (on gloo
        its connections stay open until that reference goes)."""
        return [key[1] for key, ref in self.old.items() if ref() is not None]


def _own_modules() -> list[types.ModuleType]:
    """mesh_core's modules: process-wide state (e.g. :data:`mesh_core.roles.state.PROCESS_ROLES`)
    that can hold a mesh's groups."""
    return [m for name, m in list(sys.modules.items()) if m is not None and name.split(".", 1)[0] == "mesh_core"]


def _mesh_keys(mesh: Any) -> list[Key]:
    """The mesh's rank sets this rank holds a communicator for, in creation order, world excluded."""
    registry = mesh.registry
    seen: list[Key] = []
    for key in mesh._communicators().keys:
        if key not in seen and registry.rank in key[1] and not registry.is_world(key):
            seen.append(key)
    return seen


def _held_key(mesh: Any, ranks: Iterable[int]) -> Key:
    """The key under which ``mesh`` holds ``ranks``' communicator: its split child's where the mesh
    split it, else the member-only one."""
    split = mesh.registry.split_key(ranks)
    return split if split in mesh._communicators().keys else mesh.registry.key(ranks, mesh.backend)


def _owned_keys(mesh: Any, owners: list[Any]) -> list[Key]:
    """Rank sets of the world registry's groups, outside the mesh, that ``owners`` hold (e.g. an
    engine's ZeRO++ hpZ groups)."""
    if not owners:
        return []
    registry, mine = mesh.registry, set(_mesh_keys(mesh))
    others = {id(g): (k, g) for k, g in registry.held().items() if k not in mine}
    return [others[id(g)][0] for g in held_under(owners, [g for _, g in others.values()])]


def _keys_to_release(mesh: Any, owners: list[Any]) -> list[Key]:
    """The mesh's rank sets and its owners' (:func:`_owned_keys`), in one order every rank shares
    (sorted by rank set: overlapping member-only creations on resume cannot wait on each other)."""
    return sorted(_mesh_keys(mesh) + _owned_keys(mesh, owners), key=lambda k: (k[1], k[0] or ""))


def _suspendable(group: ProcessGroup) -> Any:
    """The NCCL backend of ``group`` when it can suspend, else None: the loaded NCCL is 2.29.7 or newer
    *and* torch's backend object has ``suspend()`` / ``resume()`` (torch 2.6–2.10's have not, whatever
    NCCL is loaded)."""
    if not torch.cuda.is_available():
        return None
    try:
        if group._get_backend_name() != "nccl" or tuple(torch.cuda.nccl.version()[:3]) < SUSPEND_MIN_NCCL:
            return None
        backend = group._get_backend(torch.device("cuda"))
    except (RuntimeError, AttributeError):
        return None
    if not (callable(getattr(backend, "suspend", None)) and callable(getattr(backend, "resume", None))):
        return None
    return backend


def _check_releasable(suspending: bool) -> None:
    """Refuse, before anything is released, what a release would break half-way."""
    if torch.cuda.is_available() and torch.cuda.is_initialized() and torch.cuda.is_current_stream_capturing():
        raise MeshSpecError(
            "release_communicators during CUDA-graph capture: a captured graph would replay collectives on "
            "communicators that are released; release outside capture, and recapture graphs that hold the "
            "mesh's collectives after a resume on the destroy path"
        )
    if suspending and os.environ.get("NCCL_COMM_SPLIT_SHARE_RESOURCES") == "1":
        raise MeshSpecError(
            "release_communicators would suspend NCCL communicators with NCCL_COMM_SPLIT_SHARE_RESOURCES=1: "
            "NCCL refuses ncclCommSuspend for split children that share resources; unset it, or release with "
            "suspend=False (destroy and re-create)"
        )


def _device_free() -> Optional[int]:
    if not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return None
    torch.cuda.synchronize()
    return torch.cuda.mem_get_info()[0]


def release_communicators(
    mesh: Any, *, suspend: bool = True, holders: Iterable[Any] = (), owners: Iterable[Any] = ()
) -> ReleaseRecord:
    """Release every communicator ``mesh`` holds on this rank, and the world registry's groups that
    ``owners`` (e.g. the engine on the mesh) hold besides: suspended where the backend can (and
    ``suspend`` is true), else destroyed, with a :class:`ReleasedCommunicator` put in its place in
    the mesh, ``owners`` and ``holders`` (:func:`rebind_references`). Every member of the mesh calls
    it at the same point."""
    owners, holders = list(owners), list(holders)
    with _LOCK:
        mesh._communicators().check_alive()
        if getattr(mesh, ATTR, None) is not None:
            raise MeshSpecError(f"{mesh!r}: its communicators are already released; resume them first")
        keys = _keys_to_release(mesh, owners)
        suspenders = {}
        for key in keys if suspend else ():
            cached = mesh.registry.cached(key)
            backend = _suspendable(cached) if cached is not None else None
            if backend is not None:
                suspenders[key] = backend
        _check_releasable(bool(suspenders))
        record = ReleaseRecord(keys=keys, mode={})
        setattr(mesh, ATTR, record)
    before = _device_free()
    registry, label = mesh.registry, mesh.spec.describe()
    doomed: list[ProcessGroup] = []
    replacements: dict[int, tuple[Any, Any]] = {}
    group: Optional[ProcessGroup] = None
    for key in record.keys:
        group = registry.cached(key)
        backend = suspenders.get(key)
        if backend is not None:
            try:
                backend.suspend()
            except RuntimeError as err:  # refused by this backend (on every member alike): destroy it instead
                logger.warning("%r: suspend of ranks %s refused (%s); destroying it instead", mesh, list(key[1]), err)
            else:
                record.mode[key], record.suspended[key] = "suspend", group
                continue
        group, taken = registry.set_aside(key)
        if group is None and not registry.is_aside(key):
            continue  # never created (a lazily requested group nobody asked for)
        record.mode[key] = "destroy"
        record.standins[key] = standin = ReleasedCommunicator(key[1], label)
        if group is not None:  # None: set aside by another mesh and held by nothing any more
            record.old[key] = weakref.ref(group)
            record.old_names[key] = group.group_name
            replacements[id(group)] = (group, standin)
        if taken:
            doomed.append(group)  # type: ignore[arg-type]
    _serve_dims_from_standins(mesh, record)
    record.rebound = rebind_references([mesh, *owners, *holders, *_own_modules()], replacements)
    replacements.clear()
    for group in doomed:
        if dist.is_initialized():
            dist.destroy_process_group(group)
    del doomed, group  # the last strong references this function held
    after = _device_free()
    record.device_free_bytes = None if before is None or after is None else (before, after)
    logger.debug("%r: released %d communicators (%s)", mesh, len(record.mode), sorted(set(record.mode.values())))
    return record


def resume_communicators(mesh: Any, *, holders: Iterable[Any] = ()) -> list[str]:
    """Bring back what :func:`release_communicators` released: the same rank sets in the same
    order, member-only; a destroyed group comes back as a new group, put wherever its stand-in
    (or the old group, if something kept it) is held in the mesh and under ``holders``. Returns
    those places. A mesh that is not released: nothing happens."""
    record: Optional[ReleaseRecord] = getattr(mesh, ATTR, None)
    if record is None:
        return []
    registry = mesh.registry
    asker = f"{mesh.spec.describe()} resume"
    replacements: dict[int, tuple[Any, Any]] = {}
    for key in record.keys:
        mode = record.mode.get(key)
        if mode == "suspend":
            _suspendable(record.suspended[key]).resume()
        elif mode == "destroy":
            new = registry.bring_back(key, asker=asker)
            standin, ref = record.standins[key], record.old.get(key)
            old = ref() if ref is not None else None
            replacements[id(standin)] = (standin, new)
            if old is not None:
                replacements[id(old)] = (old, new)
            if key in record.old_names and record.old_names[key] != new.group_name:
                registry.alias(key, record.old_names[key])  # DeviceMeshes / DTensors resolve the old name
    registry.connect([k for k in record.keys if record.mode.get(k) == "destroy"])  # a connect point: ascending
    rebound: list[str] = []
    view = mesh._communicators()
    for dims in record.dim_entries:  # the rebuilt DeviceMesh serves them again
        view.unserve(dims)
    if replacements:
        _rebuild_device_mesh(mesh, record)
        rebound = rebind_references([mesh, *holders, *_own_modules()], replacements)
    setattr(mesh, ATTR, None)
    return rebound


def _serve_dims_from_standins(mesh: Any, record: ReleaseRecord) -> None:
    """The torch ``DeviceMesh`` keeps its groups alive and resolves them by name: it is dropped
    (rebuilt on resume), and while released the mesh's DeviceMesh dims answer with their stand-ins."""
    device_mesh = mesh.device_mesh
    if device_mesh is None or not record.standins:
        return
    record.device_mesh_layout = (device_mesh.mesh, tuple(device_mesh.mesh_dim_names), device_mesh.device_type)
    record.device_mesh = weakref.ref(device_mesh)
    torch_compat.retarget_device_mesh(
        device_mesh,
        {  # its own table lets the released groups go
            record.old_names[k]: record.standins[k] for k in record.standins if k in record.old_names
        },
    )
    mesh.device_mesh = None
    view = mesh._communicators()
    for name in record.device_mesh_layout[1]:
        key = _held_key(mesh, mesh.layout.group_ranks((name,), mesh.rank))
        if key in record.standins and view.serve((name,), record.standins[key]):
            record.dim_entries.append((name,))


def _rebuild_device_mesh(mesh: Any, record: ReleaseRecord) -> None:
    """A torch ``DeviceMesh`` keeps its groups by name: make a new one over the new groups."""
    from torch.distributed.device_mesh import DeviceMesh

    if record.device_mesh_layout is None:
        return
    tensor, names, device_type = record.device_mesh_layout
    groups = []
    for name in names:
        key = _held_key(mesh, mesh.layout.group_ranks((name,), mesh.rank))
        groups.append(dist.GroupMember.WORLD if mesh.registry.is_world(key) else mesh.registry.cached(key))
    held = record.device_mesh() if record.device_mesh is not None else None
    if held is not None:  # someone (a DTensor, FSDP2, the caller) still holds it: it works again, by the old names
        torch_compat.retarget_device_mesh(
            held,
            {
                record.old_names[k]: mesh.registry.cached(k)
                for k in record.old_names
                if mesh.registry.cached(k) is not None
            },
        )
        mesh.device_mesh = held
        return
    mesh.device_mesh = DeviceMesh.from_group(groups, device_type, mesh=tensor, mesh_dim_names=names)


def holds(mesh: Any, *, owners: Iterable[Any] = ()) -> MeshHoldings:
    """The communicators ``mesh`` holds on this rank, with what the mesh uses each for, and those
    of the world registry that ``owners`` hold besides (used "outside the mesh")."""
    registry = mesh.registry
    record: Optional[ReleaseRecord] = getattr(mesh, ATTR, None)
    uses: dict[Key, list[str]] = {}

    def note(ranks: Iterable[int], what: str) -> None:
        key = _held_key(mesh, ranks)
        if key in uses and what not in uses[key]:
            uses[key].append(what)

    view = mesh._communicators()
    keys = _mesh_keys(mesh) if view.usable else []
    for key in keys:
        uses[key] = []
    if keys:
        for name in mesh.mesh_dim_names:
            note(mesh.layout.group_ranks((name,), mesh.rank), name)
        for dims in view.dims:
            note(mesh.layout.group_ranks(dims, mesh.rank) if dims else [mesh.rank], " x ".join(dims) or "one-rank")
        for ep, experts in mesh.experts.sizes().items():
            note(experts.ep_ranks, f"ep({ep})")
            note(experts.edp_ranks, f"edp({ep})")
        for pair in view.p2p_pairs:
            note(pair, "p2p")
        if record is not None:  # released: the owners' groups are the record's other keys
            extra = [k for k in record.keys if k not in uses]
        else:
            extra = _owned_keys(mesh, list(owners))
        for key in extra:
            keys.append(key)
            uses[key] = ["outside the mesh"]
    out = []
    for key in keys:
        group = registry.cached(key)
        mode = record.mode.get(key) if record is not None else None
        if group is None or mode == "destroy":
            out.append(HeldCommunicator(tuple(uses[key]), key[1], "", "", "released"))
            continue
        state = "suspended" if mode == "suspend" else "alive"
        out.append(
            HeldCommunicator(
                tuple(uses[key]), key[1], group._get_backend_name(), group.group_name, state, _memory_stats(group)
            )
        )
    return MeshHoldings(tuple(out))


def _memory_stats(group: ProcessGroup) -> Optional[dict[str, int]]:
    """The counters ``group``'s backends report (summed per key over its devices); None if none does."""
    stats: dict[str, int] = {}
    for device_type in getattr(group, "_device_types", ()):
        try:
            for name, value in group._get_backend(device_type).memory_stats().items():
                stats[name] = stats.get(name, 0) + int(value)
        except (RuntimeError, AttributeError):  # "Backend gloo does not support getMemoryStats", older NCCL;
            continue  # an older torch's backends have no memory_stats at all
    return stats or None


__all__ = [
    "HeldCommunicator",
    "MeshHoldings",
    "ReleaseRecord",
    "ReleasedCommunicator",
    "holds",
    "release_communicators",
    "resume_communicators",
]
