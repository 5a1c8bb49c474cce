"""ZeRO++ hpZ (secondary partition) groups on the mesh: one set per world and ZeRO domain.

DeepSpeed 0.19.8 keeps one process-global hpZ group (``deepspeed.utils.groups``
``_create_zero_param_parallel_group(N)`` and the ``_get_zero_param_intra_parallel_*`` getters):
``zero.Init`` builds it, usually before ``deepspeed.initialize`` and outside any engine, and the
engine / ZeRO-3 optimizer read it later, building it only if nobody has. A second build asserts;
the getters return None (size: the world's, rank: the global rank, ranks: ``[]``) until it exists.

Here the groups belong to a *ZeRO domain* of the current world: the rank sets ZeRO partitions over
on a mesh. Every mesh of the world with the same domain sees the same groups, so the mesh
``zero.Init`` reads (``current_mesh()``: the world mesh before any engine exists) and the engine's
own mesh object agree, as the legacy global did:

- a dp-only mesh over the whole world (the world mesh, a compat engine without TP/PP/SP): the
  domain is the world, the groups are DeepSpeed's consecutive world blocks of ``min(N, W)`` ranks;
- an HSDP mesh (``dp_replicate`` x ``dp_shard``): the hpZ groups are its ``(dp_shard, sp)`` groups
  and N must be their size;
- any other mesh (TP / PP / SP, or a mesh over a subset of the world): blocks of ``min(N, Z)``
  consecutive members of each of its ZeRO groups ``(dp, sp)`` of size Z. Legacy cut world blocks
  even then, mixing TP lanes / pipeline stages in one hpZ group; a sub-world mesh only ever groups
  its own ranks, so ranks outside it never take part (member-only creation, nothing to hang on).

Why process state in mesh_core: the legacy group is process-global and built before the engine's
mesh exists, so it cannot live on a mesh object; it is held by
:data:`mesh_core.roles.state.PROCESS_ROLES`, keyed by the world's :class:`~mesh_core.runtime_hooks.GroupRegistry`
(a new world starts empty) and by the domain, nothing else.
:func:`release_hpz_groups` is DeepSpeed's ``_release_process_group_references`` for these groups.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

import torch.distributed as dist
from torch.distributed import ProcessGroup

from ..registry import registry_for_world
from ..spec import MeshSpec, MeshSpecError
from .state import PROCESS_ROLES

if TYPE_CHECKING:
    from ..device_mesh import DeepSpeedDeviceMesh

logger = logging.getLogger(__name__)

HPZ_DIMS = ("dp_shard", "sp")
ZERO_DIMS = ("dp", "sp")
ALREADY_BUILT = "ZeRO parameter intra parallel group is already initialized"  # DeepSpeed's message

Domain = tuple[str, tuple[tuple[int, ...], ...]]


class HpzGroupError(MeshSpecError, AssertionError):
    """A bad hpZ size or a second build (an AssertionError too, as DeepSpeed's checks)."""


@dataclass
class HpzGroups:
    """The hpZ groups built for one domain: their size, every group's ranks and this rank's group."""

    size: int
    rank_lists: list[list[int]]
    group: Optional[ProcessGroup]


def is_hsdp(spec: MeshSpec) -> bool:
    """The mesh replicates over ``dp_replicate`` (> 1) and declares the HSDP pair."""
    return "dp" not in spec.names and spec.dim_size("dp_replicate") > 1


def zero_domain(mesh: Optional["DeepSpeedDeviceMesh"]) -> Domain:
    """The domain of ``mesh`` (None: the whole world, data-parallel only, as legacy DeepSpeed)."""
    if mesh is None:
        return ("zero", (tuple(range(dist.get_world_size())),))
    if is_hsdp(mesh.spec):
        return ("hsdp", tuple(tuple(g) for g in mesh.get_all_group_ranks(HPZ_DIMS)))
    return ("zero", tuple(tuple(g) for g in mesh.get_all_group_ranks(ZERO_DIMS)))


def hpz_rank_lists(mesh: Optional["DeepSpeedDeviceMesh"], group_size: int) -> list[list[int]]:
    """Every hpZ group's ranks for ``group_size`` on ``mesh`` (None: the world); see the module
    docstring. Raises :class:`HpzGroupError` for a size that does not fit, before any group exists."""
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1:
        raise HpzGroupError(f"zero_hpz_partition_size={group_size!r} must be a positive int (1: no hpZ)")
    kind, zero_groups = zero_domain(mesh)
    if kind == "hsdp":
        assert mesh is not None
        size = mesh.size(HPZ_DIMS)
        if group_size != size:
            raise HpzGroupError(
                f"zero_hpz_partition_size={group_size} does not match {mesh.spec.describe()}: its hpZ group is "
                f"dp_shard x sp = {size} ranks; set zero_hpz_partition_size to {size} or leave it out"
            )
        return [list(g) for g in zero_groups]
    zero_size = len(zero_groups[0])
    size = min(group_size, zero_size)
    if zero_size % size:
        where = "the world" if mesh is None else mesh.spec.describe()
        raise HpzGroupError(
            f"zero_hpz_partition_size={group_size} does not divide the ZeRO group size {zero_size} of {where} "
            f"({zero_size} is not divisible by {size}); valid sizes divide {zero_size}"
        )
    return [list(g[i : i + size]) for g in zero_groups for i in range(0, zero_size, size)]


def _store() -> dict[Domain, HpzGroups]:
    return PROCESS_ROLES.hpz_store()


def built_hpz_groups(mesh: Optional["DeepSpeedDeviceMesh"]) -> Optional[HpzGroups]:
    """The hpZ groups built for ``mesh``'s domain (None: none yet, or torch.distributed is down)."""
    if not dist.is_initialized():
        return None
    return _store().get(zero_domain(mesh))


def create_hpz_group(mesh: Optional["DeepSpeedDeviceMesh"], group_size: int) -> Optional[ProcessGroup]:
    """Build the hpZ groups of ``mesh``'s domain (DeepSpeed's ``_create_zero_param_parallel_group``)
    and return this rank's group. Member-only: each rank creates its own group only. Raises
    :class:`HpzGroupError` (an AssertionError) if they exist already or the size does not fit."""
    if not dist.is_initialized():
        raise HpzGroupError("torch.distributed is not initialised; initialise it before building hpZ groups")
    store, domain = _store(), zero_domain(mesh)
    if domain in store:
        where = "the world" if mesh is None else mesh.spec.describe()
        raise HpzGroupError(f"{ALREADY_BUILT} (hpZ groups of {where}); read them with hpz_group(<mesh>)")
    rank_lists = hpz_rank_lists(mesh, group_size)
    asker = f"hpZ {group_size} of {'the world' if mesh is None else mesh.spec.describe()}"
    group, _ = registry_for_world().partition(rank_lists, asker=asker)
    store[domain] = HpzGroups(len(rank_lists[0]), rank_lists, group)
    logger.debug("hpZ groups of size %d built: %s", len(rank_lists[0]), rank_lists[:4])
    return group


def hpz_group(mesh: Optional["DeepSpeedDeviceMesh"]) -> Optional[ProcessGroup]:
    """This rank's hpZ group of ``mesh``'s domain, or None before one is built."""
    built = built_hpz_groups(mesh)
    return None if built is None else built.group


def hpz_group_size(mesh: Optional["DeepSpeedDeviceMesh"]) -> int:
    """Size of this rank's hpZ group; the world size while none is built (``group=None``)."""
    return dist.get_world_size(group=hpz_group(mesh))


def hpz_group_rank(mesh: Optional["DeepSpeedDeviceMesh"]) -> int:
    """This rank's index in its hpZ group; its global rank while none is built (``group=None``)."""
    return dist.get_rank(group=hpz_group(mesh))


def hpz_group_ranks(mesh: Optional["DeepSpeedDeviceMesh"]) -> list[int]:
    """Global ranks of this rank's hpZ group; ``[]`` while none is built (DeepSpeed's
    ``get_all_ranks_from_group(None)``)."""
    group = hpz_group(mesh)
    return [] if group is None else list(dist.get_process_group_ranks(group))


def release_hpz_groups(group: Optional[ProcessGroup] = None) -> int:
    """Forget hpZ groups (DeepSpeed's ``_release_process_group_references``): all of them for None
    (world teardown), else the entries holding ``group``. Destroys nothing. Returns entries dropped."""
    dropped = 0
    for store in list(PROCESS_ROLES.hpz_by_world.values()):
        for domain, built in list(store.items()):
            if group is None or built.group is group:
                del store[domain]
                dropped += 1
    return dropped
