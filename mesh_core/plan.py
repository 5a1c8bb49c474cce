"""The creation plan of a mesh, from layout math alone (no torch.distributed): which groups the
constructor creates (eagerly), which are created only when code asks (lazily), how many creation
calls one rank issues and how many communicators exist per rank and in the world.

With member-only creation (see :mod:`mesh_core.registry`) a rank issues one call per distinct
rank set it belongs to among the eager groups, except the whole world (served by the default
group); rank sets that coincide across dims (e.g. a pp=2 p2p pair and the pp group) are one
communicator. ``mesh show`` prints this plan before anything runs.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Optional, Sequence

import numpy as np

from .layout import MeshLayout
from .spec import HSDP_DIMS, MeshSpec


@dataclass(frozen=True)
class PlannedGroup:
    """One kind of group (a dim, a flattened combination, ep/edp, p2p) in the plan."""

    dims: str
    eager: bool
    group_size: int
    groups_in_world: int
    calls: int  # creation calls this rank issues for it (0: shared with an earlier group, or WORLD)
    note: str = ""


@dataclass(frozen=True)
class CreationPlan:
    rank: int
    calls_per_rank: int
    communicators_per_rank: int
    communicators_in_world: int
    groups: list[PlannedGroup] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _eager_kinds(spec: MeshSpec, flatten: Sequence[Sequence[str]], p2p_groups: bool):
    layout = MeshLayout(spec)
    dims = [n for n, s in zip(spec.names, spec.sizes) if s > 1] or list(spec.names[:1])
    for name in dims:
        yield name, layout.groups_array(name)
    if "dp" not in spec.names and all(spec.dim_size(d) > 1 for d in HSDP_DIMS):
        yield "dp", layout.groups_array("dp")
    for entry in flatten:
        key = layout.normalize(entry)
        yield "x".join(key), layout.groups_array(key)
    if spec.ep > 1:
        yield "ep", layout.groups_array("ep")
        yield "edp", layout.groups_array("edp")
    if p2p_groups and spec.dim_size("pp") > 1:
        pairs = {tuple(sorted(p)) for p in layout.p2p_pairs()}
        yield "p2p", np.asarray(sorted(pairs)).reshape(-1, 2)


def creation_plan(
    spec: MeshSpec,
    *,
    flatten: Sequence[Sequence[str]] = (),
    p2p_groups: bool = False,
    rank: Optional[int] = None,
) -> CreationPlan:
    """The plan of ``DeepSpeedDeviceMesh(spec, flatten=..., p2p_groups=...)`` for ``rank``
    (default: the mesh's first rank) in a fresh world."""
    rank = spec.ranks[0] if rank is None else rank
    world_sets: set[bytes] = set()
    mine: set[tuple[int, ...]] = set()
    uses_world = False
    groups = []
    for label, array in _eager_kinds(spec, flatten, p2p_groups):
        rows = np.sort(array, axis=1)
        for row in rows:
            if len(row) < spec.world_size:
                world_sets.add(row.tobytes())
        member_rows = rows[(rows == rank).any(axis=1)]
        new = 0
        note = ""
        for row in member_rows:
            key = tuple(int(r) for r in row)
            if len(key) == spec.world_size:
                uses_world, note = True, "the default group (no call)"
            elif key not in mine:
                mine.add(key)
                new += 1
            else:
                note = "same ranks as an earlier group (shared)"
        groups.append(PlannedGroup(label, True, rows.shape[1], rows.shape[0], new, note))
    groups += _lazy_kinds(spec, flatten, p2p_groups)
    return CreationPlan(
        rank=rank,
        calls_per_rank=len(mine),
        communicators_per_rank=len(mine) + int(uses_world),
        communicators_in_world=len(world_sets) + int(uses_world),
        groups=groups,
    )


def _lazy_kinds(spec: MeshSpec, flatten: Sequence[Sequence[str]], p2p_groups: bool) -> list[PlannedGroup]:
    out = []
    if not p2p_groups and spec.dim_size("pp") > 1:
        out.append(
            PlannedGroup("p2p", False, 2, spec.size, 0, "not created (p2p_groups=False); pp send/recv need none")
        )
    layout = MeshLayout(spec)
    flattened = {tuple(layout.normalize(f)) for f in flatten}
    dims = [n for n, s in zip(spec.names, spec.sizes) if s > 1]
    if len(dims) > 1 and tuple(dims[-2:]) not in flattened:
        key = tuple(dims[-2:])
        out.append(
            PlannedGroup(
                "x".join(key),
                False,
                spec.dim_size(key[0]) * spec.dim_size(key[1]),
                spec.size // (spec.dim_size(key[0]) * spec.dim_size(key[1])),
                0,
                "and any other flattened combination: created on the first get_group",
            )
        )
    data = spec.data_size
    others = [e for e in range(2, data + 1) if data % e == 0 and e != spec.ep]
    if others:
        out.append(
            PlannedGroup(
                "ep/edp",
                False,
                0,
                0,
                0,
                f"other ep sizes {others[:6]}{'...' if len(others) > 6 else ''}: created on expert_groups(n)",
            )
        )
    return out


def format_plan(plan: dict[str, Any]) -> list[str]:
    """Lines for ``mesh show``."""
    lines = [
        f"creation plan (rank {plan['rank']}, member-only creation): {plan['calls_per_rank']} calls on this rank, "
        f"{plan['communicators_per_rank']} communicators on this rank, {plan['communicators_in_world']} in the world"
    ]
    for g in plan["groups"]:
        when = "eager" if g["eager"] else "lazy "
        size = f"{g['groups_in_world']} x {g['group_size']} ranks" if g["group_size"] else ""
        call = f"{g['calls']} call{'s' if g['calls'] != 1 else ''}"
        lines.append(f"  {when} {g['dims']:<12} {size:<22} {call if g['eager'] else '':<8} {g['note']}".rstrip())
    return lines
