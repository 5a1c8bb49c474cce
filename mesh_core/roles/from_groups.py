"""A mesh from process groups that already exist: an ``mpu`` (Megatron's ``parallel_state``,
DeepSpeed's ``PipelineParallelGrid``, any object with the mpu getters) or explicit groups.

The mesh reads this rank's groups, infers the layout (sizes from the group sizes, dim order from
the rank strides: a row-major mesh over ranks 0..W-1), checks every group against that layout and
adopts the existing communicators instead of creating new ones. This is what migrated code calls
where the mpu's layout is only known at run time (``mpu=mpu if cond else None``).
"""

from __future__ import annotations

import logging
from typing import Any, Optional, TypeVar

import torch
import torch.distributed as dist

from .. import row_major, torch_compat
from ..axis_names import LEGACY_DIMS
from ..layout import MeshLayout
from ..registry import registry_for_world
from ..spec import MeshSpec, MeshSpecError

# the mesh class to build (DeepSpeedDeviceMesh or a subclass; passed in, so this module does not
# import the core class that calls it)
MeshT = TypeVar("MeshT")

logger = logging.getLogger(__name__)

GROUP_DIMS = LEGACY_DIMS
# mpu getter names per mesh dim, in DeepSpeed's probe order (deepspeed/utils/bwc.py)
MPU_GETTERS: dict[str, tuple[str, ...]] = {
    "dp": ("get_data_parallel_group",),
    "tp": ("get_tensor_model_parallel_group", "get_slice_parallel_group"),
    "pp": ("get_pipeline_model_parallel_group", "get_pipe_parallel_group"),
    "sp": ("get_sequence_parallel_group",),
}


def mpu_groups(mpu: Any) -> dict[str, Any]:
    """``mpu``'s groups by mesh dim (this rank's view); dims the mpu lacks or returns None for are
    left out. Raises :class:`MeshSpecError` for an object that is not an mpu."""
    what = getattr(mpu, "__name__", None) or type(mpu).__name__
    if not hasattr(mpu, "get_data_parallel_group") and hasattr(mpu, "initialize_sequence_parallel"):
        return _sequence_parallel_groups(mpu, what)
    if not any(hasattr(mpu, g) for names in MPU_GETTERS.values() for g in names):
        raise MeshSpecError(
            f"mpu {what} has none of the getters {sorted(g for n in MPU_GETTERS.values() for g in n)}; "
            "it is not a Megatron-style mpu"
        )
    found: dict[str, Any] = {}
    for dim, names in MPU_GETTERS.items():
        for name in names:
            if hasattr(mpu, name):
                found[dim] = getattr(mpu, name)()
                break
    # DeepSpeed's bwc order ends with get_model_parallel_group: an mpu with only the model-parallel
    # getters (DeepSpeed's own test MPU, old Megatron) states its tp there; taken only for a size > 1
    # (mpus of size 1 often hand back the world group there: DeepSpeed's DummyMPU does)
    if "tp" not in found and hasattr(mpu, "get_model_parallel_group"):
        if int(getattr(mpu, "get_model_parallel_world_size", lambda: 1)()) > 1:
            found["tp"] = mpu.get_model_parallel_group()
    return {dim: g for dim, g in found.items() if g is not None}


def _sequence_parallel_groups(mpu: Any, what: str) -> dict[str, Any]:
    """DeepSpeed's Ulysses ``parallel_state_sp`` module: its SP group and, as dp, the ranks of its
    sequence-data-parallel group (dp x sp) at this rank's SP position (it has no DP group of its own)."""
    try:
        sp, sdp = mpu.get_sequence_parallel_group(), mpu.get_sequence_data_parallel_group()
    except AssertionError as err:  # "sequence parallel group is not initialized"
        raise MeshSpecError(f"mpu {what}: {err}; call its initialize_sequence_parallel(sp) first") from None
    sp_ranks, sdp_ranks = _ranks_of(sp), _ranks_of(sdp)
    rank = dist.get_rank()
    if rank not in sp_ranks or not set(sp_ranks) <= set(sdp_ranks):
        raise MeshSpecError(
            f"mpu {what}: the SP group {sp_ranks} is not inside the SP x DP group {sdp_ranks} of rank {rank}"
        )
    return {"sp": sp, "dp": sdp_ranks[sp_ranks.index(rank) :: len(sp_ranks)]}


def _ranks_of(group: Any) -> list[int]:
    if isinstance(group, (list, tuple, range)):
        return sorted(int(r) for r in group)
    return sorted(dist.get_process_group_ranks(group))


def unstated_pp(rank_lists: dict[str, list[int]], world: int, rank: int) -> Optional[list[int]]:
    """The pp group through ``rank`` that groups covering fewer ranks than the world leave unstated,
    or None when they cover the world (or state pp, or are no mesh: :func:`infer_spec` says why).

    DeepSpeed reads only the groups an mpu has: one with only data- and model-parallel getters on a
    pp=2 x tp=2 x dp=2 world trains with pipeline size 1, the other ranks being the other stages of
    a pipeline the script runs itself (Megatron's schedule). The stated groups' strides leave one
    gap in a row-major layout (inside, between or outside them); that gap is pp. Two gaps are two
    unstated dims no getter names: an error saying what to write."""
    if "pp" in rank_lists:
        return None
    strided = []
    for dim, ranks in rank_lists.items():
        if len(ranks) > 1:
            step = ranks[1] - ranks[0]
            if step < 1 or any(b - a != step for a, b in zip(ranks, ranks[1:])):
                return None
            strided.append((step, len(ranks), dim))
    gaps, covered = [], 1  # (stride, size) of each run of ranks no stated dim spans
    for step, size, _ in sorted(strided):
        if step % covered:
            return None
        if step > covered:
            gaps.append((covered, step // covered))
        covered = step * size
    if world % covered:
        return None
    if world > covered:
        gaps.append((covered, world // covered))
    if not gaps:
        return None
    if len(gaps) > 1:
        stated = ", ".join(f"{dim}={size} (stride {step})" for step, size, dim in sorted(strided))
        unstated = ", ".join(f"{size} ranks at stride {step}" for step, size in gaps)
        product = 1
        for _, size, _ in strided:
            product *= size
        raise MeshSpecError(
            f"the groups {stated} cover {product} of the world's {world} ranks and leave "
            f"{len(gaps)} separate runs unstated ({unstated}); only one can be inferred (as pp). State the "
            "missing groups (get_pipeline_model_parallel_group, get_sequence_parallel_group) on the mpu, "
            "or build the mesh yourself: DeepSpeedDeviceMesh.build(..., order=[outermost, ..., innermost])"
        )
    step, size = gaps[0]
    start = rank - row_major.coord_along(rank, step, size) * step
    return [start + k * step for k in range(size)]


def infer_spec(rank_lists: dict[str, list[int]], world: int, rank: int) -> MeshSpec:
    """The row-major spec whose groups through ``rank`` are ``rank_lists`` (dim -> ranks); a pp the
    groups leave unstated is inferred (:func:`unstated_pp`)."""
    unknown = sorted(set(rank_lists) - set(GROUP_DIMS))
    if unknown:
        raise MeshSpecError(f"unknown dims {unknown}; valid dims are {list(GROUP_DIMS)}")
    pp = unstated_pp(rank_lists, world, rank)
    if pp is not None:
        rank_lists = {**rank_lists, "pp": pp}
    sizes = {dim: len(r) for dim, r in rank_lists.items()}
    strides = {}
    for dim, ranks in rank_lists.items():
        if rank not in ranks:
            raise MeshSpecError(f"the {dim} group {ranks} does not contain this rank ({rank})")
        if len(ranks) > 1:
            step = ranks[1] - ranks[0]
            if any(b - a != step for a, b in zip(ranks, ranks[1:])):
                raise MeshSpecError(f"the {dim} group {ranks} is not evenly strided, so the groups are not a mesh")
            strides[dim] = step
    order = sorted(strides, key=lambda d: -strides[d])
    order += [d for d in GROUP_DIMS if d not in order]
    try:
        spec = MeshSpec.build(world, order=order, **{d: sizes.get(d, 1) for d in GROUP_DIMS})
    except MeshSpecError as err:
        raise MeshSpecError(f"group sizes {sizes} do not form a mesh over world_size={world}: {err}") from None
    layout = MeshLayout(spec)
    for dim, ranks in rank_lists.items():
        expected = layout.group_ranks(dim, rank)
        if sorted(expected) != ranks:
            raise MeshSpecError(
                f"the {dim} group {ranks} on rank {rank} differs from {expected}, the {dim} group of "
                f"{spec.describe()}; the groups are not a row-major mesh"
            )
    return spec


def mpu_spec(mpu: Any) -> MeshSpec:
    """The spec of ``mpu``'s groups as this rank sees them (an unstated pp inferred); nothing is
    created and nothing communicated, so ranks may disagree (:func:`from_mpu` checks that)."""
    rank_lists = {dim: _ranks_of(g) for dim, g in mpu_groups(mpu).items()}
    return infer_spec(rank_lists, dist.get_world_size(), dist.get_rank())


def _check_agreement(spec: Optional[MeshSpec], problem: Optional[Exception]) -> None:
    """Every rank takes part before anyone raises, so a rank-local mismatch fails everywhere."""
    if spec is None or problem is not None:
        code = [-1] * (2 * len(GROUP_DIMS))
    else:
        code = [spec.dim_size(d) for d in GROUP_DIMS] + [spec.names.index(d) for d in GROUP_DIMS]
    # on the rank's own device (the bound one; on an unbound world cuda:LOCAL_RANK until the process
    # selects one), not the current one: before DeepSpeed's engine sets the device every rank's is cuda:0
    low = torch.tensor(code, dtype=torch.int64, device=torch_compat.default_device())
    high = low.clone()
    dist.all_reduce(low, op=dist.ReduceOp.MIN)
    dist.all_reduce(high, op=dist.ReduceOp.MAX)
    if problem is None and not torch.equal(low, high):
        raise MeshSpecError(
            f"ranks inferred different meshes from the groups (this rank: {spec.describe() if spec else None}); "
            "they are not a row-major mesh"
        )


def from_groups(
    cls: "type[MeshT]",
    *,
    device_type: Optional[str] = None,
    check_agreement: bool = True,
    **groups: Any,
) -> MeshT:
    """A mesh whose ``dp`` / ``tp`` / ``pp`` / ``sp`` groups are the given ones (this rank's
    ``ProcessGroup`` or its rank list per dim; None or a missing dim means size 1).

    Collective: every rank calls it. Existing communicators are adopted, not recreated. Raises
    :class:`MeshSpecError` (on every rank) when the groups are not the groups of a row-major mesh.
    """
    if not dist.is_available() or not dist.is_initialized():
        raise MeshSpecError("torch.distributed is not initialised; initialise it before building a mesh from groups")
    world, rank = dist.get_world_size(), dist.get_rank()
    given = {dim: g for dim, g in groups.items() if g is not None}
    spec: Optional[MeshSpec] = None
    problem: Optional[MeshSpecError] = None
    try:
        spec = infer_spec({dim: _ranks_of(g) for dim, g in given.items()}, world, rank)
    except MeshSpecError as err:
        problem = err
    if check_agreement and world > 1:
        _check_agreement(spec, problem)
    if problem is not None:
        raise problem
    assert spec is not None
    layout = MeshLayout(spec)
    registry = registry_for_world()
    for dim, group in given.items():
        if not isinstance(group, (list, tuple, range)):
            registry.adopt(layout.groups(dim), group)
    logger.debug("from_groups: %s", spec.describe())
    return cls(spec, device_type=device_type or torch_compat.default_device_type())


def from_mpu(cls: "type[MeshT]", mpu: Any, *, device_type: Optional[str] = None, check_agreement: bool = True) -> MeshT:
    """A mesh reproducing ``mpu``'s groups (Megatron ``parallel_state``, a ``PipelineParallelGrid``,
    DeepSpeed's AutoTP ``groups`` module, DeepSpeed's Ulysses ``parallel_state_sp`` module (dp x sp),
    or any object with the mpu getters); see :func:`from_groups`. Collective. The mesh keeps ``mpu``
    as its ``source_mpu``."""
    mesh = from_groups(cls, device_type=device_type, check_agreement=check_agreement, **mpu_groups(mpu))
    mesh.source_mpu = mpu
    return mesh
