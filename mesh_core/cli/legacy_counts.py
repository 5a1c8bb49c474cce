"""How many communicators a layout costs: DeepSpeed 0.19.8's formulas beside the mesh's count.

Each function counts the ``new_group`` calls one legacy builder makes (every rank makes all of
them: group creation is collective) and how many of those groups each rank belongs to. The
formulas follow the installed package's loops:

- ``PipelineParallelGrid(PipeModelDataParallelTopology(pp, mp, dp))``: ds_model groups (one per
  data index), dp groups, pp groups, then the slice (tp) groups, which are ``W`` singletons when
  ``mp == 1``;
- ``groups._create_expert_and_data_parallel(ep, pp_size=pp)`` (what an ``MoE`` layer calls): EDP
  groups (``ep`` per stage), then EP groups (``W/ep``);
- ``groups._create_expert_data_and_model_parallel(ep, mpu=grid)`` (expert tensor parallelism,
  which keeps tp lanes apart like the mesh does): ``W/ep`` EP groups, then ``W*ep/dp`` EDP groups;
- ``parallel_state_sp.initialize_sequence_parallel(sp)`` (Ulysses): ``W/sp`` SP groups plus one
  sequence-data group over the whole world.

:func:`legacy_counts` composes them for a mesh layout. DeepSpeed never reuses a rank set: the same
ranks created by two builders are two communicators. :func:`mesh_count` is what
:class:`~mesh_core.DeepSpeedDeviceMesh` creates for the same layout (distinct rank sets only, and
none for a set spanning the world, which reuses WORLD), from layout math alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Optional, Sequence

import numpy as np

from ..layout import MeshLayout
from ..spec import HSDP_DIMS, MeshSpec


@dataclass(frozen=True)
class LegacyCount:
    """One legacy builder's group creation: calls in the world and memberships per rank."""

    builder: str
    new_group_calls: int
    per_rank: int
    formula: str


def grid_count(pp: int, mp: int, dp: int) -> LegacyCount:
    """``PipelineParallelGrid`` over ``PipeModelDataParallelTopology(pp, mp, dp)``."""
    world = pp * mp * dp
    slices = pp * dp if mp > 1 else world
    slice_term = "pp*dp" if mp > 1 else "W (singletons, mp=1)"
    return LegacyCount(
        builder=f"PipelineParallelGrid(pp={pp}, mp={mp}, dp={dp})",
        new_group_calls=dp + pp * mp + dp * mp + slices,
        per_rank=4,  # one ds_model, dp, pp and slice group each
        formula=f"dp + pp*mp + dp*mp + {slice_term} = {dp} + {pp * mp} + {dp * mp} + {slices}",
    )


def expert_count(world: int, ep: int, pp: int = 1) -> LegacyCount:
    """``groups._create_expert_and_data_parallel(ep, pp_size=pp)`` (the MoE layer's path)."""
    _check_divides("ep", ep, world // pp)
    return LegacyCount(
        builder=f"groups._create_expert_and_data_parallel({ep}, pp_size={pp})",
        new_group_calls=pp * ep + world // ep,
        per_rank=2,
        formula=f"pp*ep + W/ep = {pp * ep} + {world // ep}",
    )


def expert_tensor_count(world: int, ep: int, dp: int) -> LegacyCount:
    """``groups._create_expert_data_and_model_parallel(ep, mpu=grid)`` with ``dp`` data ranks."""
    _check_divides("ep", ep, dp)
    return LegacyCount(
        builder=f"groups._create_expert_data_and_model_parallel({ep}, mpu=grid)",
        new_group_calls=world // ep + world * ep // dp,
        per_rank=2,
        formula=f"W/ep + W*ep/dp = {world // ep} + {world * ep // dp}",
    )


def sequence_count(world: int, sp: int) -> LegacyCount:
    """``parallel_state_sp.initialize_sequence_parallel(sp)`` (Ulysses)."""
    _check_divides("sp", sp, world)
    return LegacyCount(
        builder=f"parallel_state_sp.initialize_sequence_parallel({sp})",
        new_group_calls=world // sp + 1,
        per_rank=2,
        formula=f"W/sp + 1 = {world // sp} + 1",
    )


def legacy_counts(spec: MeshSpec) -> list[LegacyCount]:
    """The legacy builders a DeepSpeed 0.19.8 job with this layout runs, with their counts.

    The grid's data axis holds every data rank (dp, or dp_replicate x dp_shard, times sp: the grid
    has no sequence axis); Ulysses adds its SP groups when ``sp > 1``; MoE adds the expert groups
    when ``ep > 1`` (the expert-tensor path when ``tp > 1``, since only it keeps tp lanes apart).
    """
    pp, tp, sp = spec.dim_size("pp"), spec.dim_size("tp"), spec.dim_size("sp")
    data = spec.size // (pp * tp)
    counts = [grid_count(pp, tp, data)]
    if sp > 1:
        counts.append(sequence_count(spec.size, sp))
    if spec.ep > 1:
        counts.append(expert_tensor_count(spec.size, spec.ep, data) if tp > 1 else expert_count(spec.size, spec.ep, pp))
    return counts


@dataclass(frozen=True)
class MeshCount:
    """Communicators the mesh creates: in the world, and those one rank belongs to."""

    new_group_calls: int  # collective calls, identical on every rank
    per_rank: int  # communicators ``rank`` belongs to (its own singletons included)
    rank: int
    reused: int  # requested rank sets served by an earlier set or by WORLD
    local_calls: int = 0  # singleton groups ``rank`` creates alone (no world-wide call)


def mesh_count(
    spec: MeshSpec, *, flatten: Sequence[Sequence[str]] = (), p2p_groups: bool = False, rank: Optional[int] = None
) -> MeshCount:
    """``new_group`` calls of ``DeepSpeedDeviceMesh(spec, flatten=..., p2p_groups=...)`` in a fresh
    world, and how many of those groups ``rank`` (default: the mesh's first rank) belongs to."""
    layout = MeshLayout(spec)
    rank = spec.ranks[0] if rank is None else rank
    seen: set[bytes] = set()
    calls = per_rank = reused = local = 0
    for partition in mesh_partitions(layout, flatten=flatten, p2p_groups=p2p_groups):
        rows = np.sort(partition, axis=1)
        for row in rows:
            key = row.tobytes()
            if key in seen or len(row) == spec.world_size:
                reused += 1
                continue
            seen.add(key)
            if len(row) == 1:  # only its member creates a singleton
                local += int(row[0] == rank)
                per_rank += int(row[0] == rank)
                continue
            calls += 1
            if rank in row:
                per_rank += 1
    return MeshCount(new_group_calls=calls, per_rank=per_rank, rank=rank, reused=reused, local_calls=local)


def mesh_partitions(
    layout: MeshLayout, *, flatten: Sequence[Sequence[str]] = (), p2p_groups: bool = False
) -> Iterator[np.ndarray]:
    """Every partition the mesh requests, in its creation order (see ``device_mesh``'s docstring)."""
    spec = layout.spec
    dims = [n for n, s in zip(spec.names, spec.sizes) if s > 1] or list(spec.names[:1])
    for name in dims:
        yield layout.groups_array(name)
    if "dp" not in spec.names and all(spec.dim_size(d) > 1 for d in HSDP_DIMS):
        yield layout.groups_array("dp")
    for entry in flatten:
        key = layout.normalize(entry)
        yield layout.groups_array(key) if key else np.asarray(list(spec.ranks)).reshape(-1, 1)
    if spec.ep > 1:
        yield layout.groups_array("ep")
        yield layout.groups_array("edp")
    if p2p_groups and spec.dim_size("pp") > 1:
        pairs = {tuple(sorted(p)) for p in layout.p2p_pairs()}
        yield np.asarray(sorted(pairs)).reshape(-1, 2)


def _check_divides(what: str, value: int, total: int) -> None:
    if value < 1 or total % value:
        raise ValueError(f"{what}={value} does not divide {total}")
