"""``deepspeed.utils.groups`` (0.19.8) on the mesh: every function, same names and signatures.

Group memberships, return values and the legacy quirks (``range`` objects for legacy expert ranks,
``ep_size_N`` names, ``_get_max_expert_size()`` returning None, the E+D expert layout over a whole
pipeline stage that ignores TP when ``mp_size`` is None, ...) are DeepSpeed's. What differs:

- every communicator comes from a :class:`~mesh_core.DeepSpeedDeviceMesh` or its world's
  :class:`~mesh_core.runtime_hooks.GroupRegistry`, so a rank set gets one communicator however many legacy
  builders ask for it (the world clone is WORLD itself; ``_get_local_all_to_all_group`` no longer
  creates new communicators per call);
- the state is one :class:`GroupsState` object around one default mesh (:func:`bind_mesh`), plus
  the three attributes the engine writes: ``mpu``, ``mesh_device`` and
  ``expert_tensor_parallel_world_size``;
- group creation may issue fewer (shared) calls than legacy, but every rank issues the same ones in
  the same order;
- fixed legacy bugs: ``_init_tp_mesh_device`` keeps its mesh (its groups come back when a bound
  mesh is unbound) and logs a warning on a size conflict instead of silently ignoring it; the
  src-rank helpers return the group's first rank rather than a formula that assumed consecutive groups
  (``get_tensor_model_parallel_src_rank`` keeps the formula when a world-size override is set);
  bad sizes (a pp that does not divide the world, a TP size that does not divide a stage) raise a
  :class:`~mesh_core.MeshSpecError` before any group exists instead of building ragged groups.

Resolution of the underscore DP / SP / SDP getters: ``mesh_device`` (as in DeepSpeed), then the
mesh bound with :func:`bind_mesh`, then ``mpu``, then the world. With a bound mesh the
sequence-data-parallel group is ``("dp", "sp")`` (DeepSpeed's ``mesh_device`` path used DP only).
"""

from __future__ import annotations

import logging
import math
import os
import sys
import types
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

import torch
import torch.distributed as dist

import ds_mesh_advice
from mesh_core import DeepSpeedDeviceMesh, ExpertGroups, MeshLayout, MeshSpec, MeshSpecError, default_mesh
from mesh_core import runtime_hooks as _hooks
from mesh_core.runtime_hooks import (  # noqa: F401 (HPZ_DIMS, hpz_rank_lists, is_hsdp: re-exported)
    HPZ_DIMS,
    NoSequenceParallelGroupError,
    all_to_all_groups,
    autotp_groups,
    hpz_rank_lists,
    init_autotp,
    is_hsdp,
    local_all_to_all_groups,
    register_expert_groups,
    registry_for_world,
    release_hpz_groups,
)

from .deprecation import legacy_entry
from .device import default_device_type
from .mpu import bwc_pipeline_parallel_world_size, bwc_tensor_model_parallel_world_size

logger = logging.getLogger(__name__)

_GROUPS = "deepspeed.utils.groups"
_DEVICE_MESH_SPLIT_UNSUPPORTED = "No backend for the parent process group or its backend does not support splitting"

# --- the legacy module attributes the engine reads and writes ----------------------------------
mpu: Any = None
mesh_device: Any = None
expert_tensor_parallel_world_size: int = 1
# set while engines with different layouts exist and none is in scope (compat.engine_scope)
_WRONG_GRID: Any = None
# [the engine groups state known to be current] (compat.engine_scope's entry-point fast path), or
# [None]; every change of this module's state (bound mesh, mpu, mesh_device, wrong grid) clears it
STATE_MARK: list = [None]


def _set_wrong_grid(ambiguous: Any) -> None:
    """Make every legacy global getter raise ``ambiguous.error(...)`` (None: serve normally)."""
    global _WRONG_GRID
    STATE_MARK[0] = None
    _WRONG_GRID = ambiguous


class _MarkedModule(types.ModuleType):
    """This module's class: an attribute written from outside (``groups.mpu = ...``, through
    ``deepspeed.utils.groups`` too) clears :data:`STATE_MARK`."""

    def __setattr__(self, name: str, value: Any) -> None:
        STATE_MARK[0] = None
        super().__setattr__(name, value)


class DeprecatedException(Exception):
    """Raised by the deprecated ``initialize`` (DeepSpeed's ``DeprecatedException``)."""


@dataclass
class GroupsState:
    """Everything ``deepspeed.utils.groups`` kept in module globals, around one default mesh."""

    mesh: Optional[DeepSpeedDeviceMesh] = None  # the default mesh, bound by bind_mesh (read only while bound)
    mesh_is_bound: bool = False  # bound by bind_mesh: underscore getters serve from it too
    # the TP / DP groups, sizes, ranks, overrides and tp_source: views of mesh_core's one
    # AutoTPGroups (see _TP_FIELDS below), so migrated AutoTP code reads the state these getters serve
    # name -> group / ranks, the live dicts DeepSpeed hands out (engine keeps references)
    expert_parallel_group: dict = field(default_factory=dict)
    expert_parallel_group_ranks: dict = field(default_factory=dict)
    expert_data_parallel_group: dict = field(default_factory=dict)
    expert_data_parallel_group_ranks: dict = field(default_factory=dict)
    world_group: Any = None
    # all_to_all: a view of mesh_core's one node all-to-all dict (see below)
    bound_groups: dict = field(default_factory=dict)  # dims -> (group, size, rank, ranks) of the bound mesh


# one TP state. AutoTPGroups.tp_source is what _init_tp_* set up, kept under a binding:
# (mesh, (tp dims, dp dims)), or (None, ExplicitTP) when a replaced deepspeed.comm function built the groups.
_TP_FIELDS = (
    "tp_group",
    "dp_group",
    "tp_size",
    "tp_rank",
    "tp_src",
    "dp_size",
    "dp_rank",
    "tp_world_size_override",
    "tp_rank_override",
    "tp_source",
)


def _tp_view(name: str) -> property:
    return property(
        lambda self: getattr(autotp_groups(), name), lambda self, value: setattr(autotp_groups(), name, value)
    )


for _name in _TP_FIELDS:
    setattr(GroupsState, _name, _tp_view(_name))
del _name
GroupsState.all_to_all = property(lambda self: all_to_all_groups())  # type: ignore[attr-defined]


_state = GroupsState()
# the live dicts DeepSpeed hands out stay the same objects for the life of the process (cleared on
# world teardown), so the hot getters can hold them directly
_EP_GROUPS = _state.expert_parallel_group
_EDP_GROUPS = _state.expert_data_parallel_group

_LEGACY_GLOBALS = {
    "_TENSOR_MODEL_PARALLEL_GROUP": lambda s: s.tp_group,
    "_MODEL_PARALLEL_GROUP": lambda s: s.tp_group,
    "_DATA_PARALLEL_GROUP": lambda s: s.dp_group,
    "_EXPERT_PARALLEL_GROUP": lambda s: s.expert_parallel_group,
    "_EXPERT_PARALLEL_GROUP_RANKS": lambda s: s.expert_parallel_group_ranks,
    "_EXPERT_DATA_PARALLEL_GROUP": lambda s: s.expert_data_parallel_group,
    "_EXPERT_DATA_PARALLEL_GROUP_RANKS": lambda s: s.expert_data_parallel_group_ranks,
    "_WORLD_GROUP": lambda s: s.world_group,
    "_ZERO_PARAM_INTRA_PARALLEL_GROUP": lambda s: _zero_param_group(),
    "_ALL_TO_ALL_GROUP": lambda s: s.all_to_all,
    "_MPU_TENSOR_MODEL_PARALLEL_WORLD_SIZE": lambda s: s.tp_world_size_override,
    "_MPU_TENSOR_MODEL_PARALLEL_RANK": lambda s: s.tp_rank_override,
}


def __getattr__(name: str) -> Any:
    """Read-only views of DeepSpeed's private module globals (e.g. ``_EXPERT_PARALLEL_GROUP``)."""
    getter = _LEGACY_GLOBALS.get(name)
    if getter is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getter(_state)


def _set_tp_global(value: Any, dp: bool) -> None:
    state = _state
    if value is None:
        if dp:
            state.dp_group = None
        else:
            state.tp_group, state.tp_source = None, None
        return
    try:  # a real group: its size and this rank's place in it, as DeepSpeed's getters would ask torch
        size, rank = dist.get_world_size(value), dist.get_rank(value)
        first = min(dist.get_process_group_ranks(value))
    except (RuntimeError, ValueError, TypeError, AttributeError):
        size, rank, first = 0, 0, 0
    if dp:
        state.dp_group, state.dp_size, state.dp_rank = value, size, rank
    else:
        state.tp_group, state.tp_size, state.tp_rank, state.tp_src = value, size, rank, first


# the mesh of the engine deepspeed.initialize is building right now, if any (compat.engine_scope
# installs its probe here when it first uses this module; this module does not import it)
engine_being_built: list = [lambda: None]


def _set_mpu_written(value: Any) -> None:
    """``deepspeed.utils.groups.mpu = value`` written by DeepSpeed's engine or user code. Outside
    ``deepspeed.initialize`` (an engine a framework constructs itself, e.g. a ``PipelineEngine``
    subclass with ``mpu=`` its grid) the written mpu serves the getters, as in legacy, even while
    another engine's mesh is bound or several engines' layouts exist: that mesh is unbound (its
    engine re-binds it around its steps)."""
    global mpu
    if value is not None and value is not mpu and engine_being_built[0]() is None:
        if _state.mesh_is_bound:
            bind_mesh(None)
        _set_wrong_grid(None)  # one mpu named: the legacy getters have one answer again
    STATE_MARK[0] = None
    mpu = value


_LEGACY_SETTERS = {
    "mpu": _set_mpu_written,
    "_TENSOR_MODEL_PARALLEL_GROUP": lambda v: _set_tp_global(v, dp=False),
    "_MODEL_PARALLEL_GROUP": lambda v: _set_tp_global(v, dp=False),
    "_DATA_PARALLEL_GROUP": lambda v: _set_tp_global(v, dp=True),
    "_WORLD_GROUP": lambda v: setattr(_state, "world_group", v),
    "_MPU_TENSOR_MODEL_PARALLEL_WORLD_SIZE": lambda v: setattr(_state, "tp_world_size_override", v),
    "_MPU_TENSOR_MODEL_PARALLEL_RANK": lambda v: setattr(_state, "tp_rank_override", v),
}


def set_legacy_global(name: str, value: Any) -> bool:
    """Write one of DeepSpeed's private module globals into the state (``groups._DATA_PARALLEL_GROUP =
    None`` resets the DP group, as in DeepSpeed); False for a name that is not writable this way."""
    setter = _LEGACY_SETTERS.get(name)
    if setter is None:
        return False
    setter(value)
    return True


def _w(name: str, *, hot: bool = False):
    """The legacy entry of ``groups.<name>``; its advice is the one table's (:mod:`ds_mesh_advice`)."""
    return legacy_entry(f"{_GROUPS}.{name}", ds_mesh_advice.plain(f"{_GROUPS}.{name}"), hot=hot)


def _legacy_call(entry) -> None:
    """A legacy getter's prologue: refuse while engines with different layouts leave no single grid
    (:class:`~compat.engine_scope.WrongGridError`), else warn once for the getter's call site.
    The hot getters inline it instead (one Python call less on every step, and bounded probing)."""
    if _WRONG_GRID is not None:
        raise _WRONG_GRID.error(f"{entry.legacy_name}()")
    entry.warn(2)  # the getter's caller: this frame, the getter, then its caller


# --- the default mesh ------------------------------------------------------------------------
BOUND_DIMS = ("tp", "dp", "sp", ("dp", "sp"))


def bind_mesh(mesh: Optional[DeepSpeedDeviceMesh]) -> None:
    """Make ``mesh`` the module's default mesh (None: unbind).

    The lettered TP/DP getters, the underscore DP/SP/SDP getters and the expert getters then serve
    from it (its own ``ep`` is registered as ``ep_size_<ep>``). Collective: it resolves the mesh's
    tp, dp, sp and (dp, sp) groups up front, creating those not built yet.
    """
    if mesh is not None and not isinstance(mesh, DeepSpeedDeviceMesh):
        raise TypeError(f"bind_mesh needs a DeepSpeedDeviceMesh or None, got {type(mesh).__name__}: {mesh!r}")
    state = _state
    if mesh is not None and mesh is state.mesh and state.mesh_is_bound:
        return  # already bound (engines re-bind their mesh around every step)
    STATE_MARK[0] = None
    if mesh is None:
        if state.mesh_is_bound:  # back to what _init_tp_mesh_device had set up, if anything
            state.mesh, state.mesh_is_bound, state.bound_groups = None, False, {}
            _set_tp_groups(*(state.tp_source or (None, None)))
        return
    groups = {dims: mesh.ensure_group(dims) for dims in BOUND_DIMS}  # collective, members or not
    if not mesh.is_member:
        raise MeshSpecError(f"rank {mesh.rank} is not a member of {mesh.spec.describe()}; bind a mesh it belongs to")
    state.bound_groups = {
        dims: (groups[dims], mesh.size(dims), mesh.get_local_rank(dims), mesh.get_group_ranks(dims))
        for dims in BOUND_DIMS
    }
    state.mesh, state.mesh_is_bound = mesh, True
    _set_tp_groups(mesh, ("tp", "dp"))
    if mesh.spec.ep > 1:
        expert = mesh.expert_groups()
        _store_expert(f"ep_size_{mesh.spec.ep}", expert.ep_group, expert.ep_ranks, expert.edp_group, expert.edp_ranks)
    for name in list(state.expert_parallel_group):  # groups legacy builders made before this binding
        _mirror_expert(mesh, name)


def bound_mesh() -> Optional[DeepSpeedDeviceMesh]:
    """The mesh bound with :func:`bind_mesh` (None if none is)."""
    return _state.mesh if _state.mesh_is_bound else None


@dataclass(frozen=True)
class ExplicitTP:
    """TP / DP groups built by a replaced ``deepspeed.comm`` function (see :func:`bind_legacy_comm`),
    with the (data_parallel, tensor_parallel) layout's sizes and ranks."""

    tp_group: Any
    dp_group: Any
    tp_size: int
    tp_rank: int
    tp_src: int
    dp_size: int
    dp_rank: int


def _set_tp_groups(mesh: Optional[DeepSpeedDeviceMesh], dims: Any) -> None:
    state = _state
    if isinstance(dims, ExplicitTP):
        state.tp_group, state.dp_group = dims.tp_group, dims.dp_group
        state.tp_size, state.tp_rank, state.tp_src = dims.tp_size, dims.tp_rank, dims.tp_src
        state.dp_size, state.dp_rank = dims.dp_size, dims.dp_rank
        return
    if mesh is None or dims is None:
        state.tp_group = state.dp_group = None
        return
    tp_dims, dp_dims = dims
    state.tp_group, state.dp_group = mesh.get_group(tp_dims), mesh.get_group(dp_dims)
    state.tp_size, state.tp_rank = mesh.size(tp_dims), mesh.get_local_rank(tp_dims)
    state.tp_src = min(mesh.get_group_ranks(tp_dims))
    state.dp_size, state.dp_rank = mesh.size(dp_dims), mesh.get_local_rank(dp_dims)


def _partition(rank_lists: Sequence[Sequence[int]]) -> Any:
    # Layouts that are not the groups of any mesh dim (expert splits over a pipeline stage,
    # world blocks, node-local blocks): a DeepSpeedDeviceMesh for them would also create its own
    # dims' groups, which legacy never creates. The world's registry still shares each rank set.
    group, _ = registry_for_world().partition([list(r) for r in rank_lists])
    return group


def _assert_initialized() -> None:
    assert dist.is_initialized(), "dist is not initialized"


def _divisible(numerator: int, denominator: int) -> None:
    assert numerator % denominator == 0, "{} is not divisible by {}".format(numerator, denominator)


_W_ENSURE = _w("_ensure_divisibility")


def _ensure_divisibility(numerator: int, denominator: int) -> None:
    """Ensure that numerator is divisible by the denominator."""
    # TODOV1: legacy shim
    _W_ENSURE.warn()
    _divisible(numerator, denominator)


_W_INITIALIZE = _w("initialize")


def initialize(ep_size: int = 1, mpu: Any = None) -> None:
    """Deprecated in DeepSpeed itself; always raises."""
    # TODOV1: legacy shim
    _W_INITIALIZE.warn()
    raise DeprecatedException(
        "Please do not use the groups.initialize() API as it is deprecated. Instead, pass the desired ep_size "
        "to deepspeed.moe.layer.MoE(..,ep_size,..)"
    )


# --- teardown --------------------------------------------------------------------------------
_W_RELEASE = _w("_release_process_group_references")


def _release_process_group_references(group: Any = None) -> None:
    """Forget references after a backend destroy: everything for the world (None), else ``group``."""
    # TODOV1: legacy shim
    _W_RELEASE.warn()
    global _state, mpu, mesh_device, expert_tensor_parallel_world_size
    if group is None:
        STATE_MARK[0] = None
        sequence_parallel = sys.modules.get("deepspeed.runtime.sequence_parallel.parallel_state_sp")
        release_sp = getattr(sequence_parallel, "_release_sequence_parallel_groups", None)
        if release_sp is not None:  # 0.19.8 (not 0.19.7 and older, nor the development tree)
            release_sp()
        old = _state
        release_hpz_groups()  # mesh_core keeps the hpZ groups (one set per world and ZeRO domain)
        for mapping in (
            old.expert_parallel_group,
            old.expert_parallel_group_ranks,
            old.expert_data_parallel_group,
            old.expert_data_parallel_group_ranks,
            old.all_to_all,
        ):
            mapping.clear()  # the engine may hold these dicts
        autotp_groups().reset()
        _state = GroupsState(
            expert_parallel_group=old.expert_parallel_group,
            expert_parallel_group_ranks=old.expert_parallel_group_ranks,
            expert_data_parallel_group=old.expert_data_parallel_group,
            expert_data_parallel_group_ranks=old.expert_data_parallel_group_ranks,
        )
        mpu = None
        mesh_device = None
        expert_tensor_parallel_world_size = 1
        _set_wrong_grid(None)
        _SP_MPU_PROBE[:] = [None, False]
        return
    state = _state
    for group_map, rank_map in (
        (state.expert_parallel_group, state.expert_parallel_group_ranks),
        (state.expert_data_parallel_group, state.expert_data_parallel_group_ranks),
    ):
        for name, cached in list(group_map.items()):
            if cached is group:
                del group_map[name]
                rank_map.pop(name, None)
    for name, cached in list(state.all_to_all.items()):
        if cached is group:
            del state.all_to_all[name]
    if state.world_group is group:
        state.world_group = None
    release_hpz_groups(group)
    if state.tp_group is group:
        state.tp_group = None
        state.tp_world_size_override = state.tp_rank_override = None
        state.tp_source = None
    if state.dp_group is group:
        state.dp_group = None
    _forget_destroyed(group)


def _forget_destroyed(group: Any) -> None:
    # The backend already destroyed ``group``; drop it from the registry so no later request for
    # its rank set is served a dead communicator.
    if dist.is_initialized():
        registry_for_world().forget(group)


# --- deepspeed.comm as deepspeed.utils.groups sees it ------------------------------------------
# DeepSpeed's TP/DP builders look up ``dist.get_world_size`` / ``get_rank`` / ``new_group`` /
# ``initialize_mesh_device`` on ``deepspeed.comm`` at call time. Code that replaces one of them
# (DeepSpeed's own unit tests do, with fakes that need no process group) expects its replacement to
# be called in DeepSpeed's order; the installer binds that module here. Every function that is still
# deepspeed's own (or the shim's route) stays unused: the groups come from the mesh.
_legacy_comm: Any = None


def bind_legacy_comm(comm: Any) -> None:
    """Remember ``deepspeed.comm`` (None: forget it, e.g. when the shim is uninstalled)."""
    global _legacy_comm
    _legacy_comm = comm


def _replaced_comm(name: str) -> Optional[Callable[..., Any]]:
    """``deepspeed.comm.<name>`` if code outside deepspeed.comm and compat replaced it, else None."""
    if _legacy_comm is None:
        return None
    fn = getattr(_legacy_comm, name, None)
    module = getattr(fn, "__module__", None) or ""
    own = (_legacy_comm.__name__, __name__.split(".")[0])  # deepspeed.comm's own, or the shim's route
    if fn is None or any(module == m or module.startswith(m + ".") for m in own):
        return None
    return fn


def _comm_world_size() -> int:
    fn = _replaced_comm("get_world_size")
    return fn() if fn is not None else dist.get_world_size()


def _comm_rank() -> int:
    fn = _replaced_comm("get_rank")
    return fn() if fn is not None else dist.get_rank()


# --- tensor / data parallel (AutoTP, "lettered" API) -------------------------------------------
_W_TP_NEW_GROUP = _w("_init_tp_groups_with_new_group")
_W_TP_MESH = _w("_init_tp_mesh_device")


def _tp_mesh(tensor_model_parallel_size: int, data_parallel_size: int) -> tuple[DeepSpeedDeviceMesh, tuple[Any, Any]]:
    """A mesh whose TP groups are consecutive tp-blocks and DP groups every tp-th rank."""
    world = dist.get_world_size()
    mesh = bound_mesh()
    if mesh is not None and list(mesh.spec.ranks) == list(range(world)):
        spec = mesh.spec
        inner = [n for n, s in zip(spec.names, spec.sizes) if s > 1]
        if spec.dim_size("tp") == tensor_model_parallel_size and (
            not inner or inner[-1] == "tp" or tensor_model_parallel_size == 1
        ):
            rest = tuple(n for n in spec.names if n != "tp")
            if rest and math.prod(spec.dim_size(n) for n in rest) == data_parallel_size:
                return mesh, ("tp", rest)
    spec = MeshSpec.build(world, dp=data_parallel_size, tp=tensor_model_parallel_size)
    return DeepSpeedDeviceMesh(spec, device_type=default_device_type()), ("tp", "dp")


def _init_tp_groups_with_new_group(tensor_model_parallel_size: int = 1, data_parallel_size: Optional[int] = None):
    """Build (or re-build) the TP/DP groups of a (data_parallel, tensor_parallel) layout."""
    # TODOV1: legacy shim
    _W_TP_NEW_GROUP.warn()
    return _tp_groups_by_new_group(tensor_model_parallel_size, data_parallel_size)


def _tp_groups_by_new_group(tensor_model_parallel_size: int, data_parallel_size: Optional[int]):
    world_size = _comm_world_size()
    _divisible(world_size, tensor_model_parallel_size)
    if data_parallel_size is None:
        data_parallel_size = world_size // tensor_model_parallel_size
    else:
        assert data_parallel_size * tensor_model_parallel_size == world_size, (
            f"data_parallel_size ({data_parallel_size}) * tensor_model_parallel_size "
            f"({tensor_model_parallel_size}) must equal world_size ({world_size})"
        )
    new_group = _replaced_comm("new_group")
    if new_group is not None:
        return _adopt_explicit_tp(
            _legacy_new_group_layout(new_group, world_size, tensor_model_parallel_size, data_parallel_size)
        )
    return _adopt_tp_mesh(*_tp_mesh(tensor_model_parallel_size, data_parallel_size))


def _legacy_new_group_layout(new_group: Callable[..., Any], world_size: int, tp: int, dp: int) -> ExplicitTP:
    # DeepSpeed's calls, in its order: every DP rank set (tp-strided), then every TP block
    rank = _comm_rank()
    dp_group = tp_group = None
    for tensor_rank in range(tp):
        ranks = list(range(tensor_rank, world_size, tp))
        group = new_group(ranks)
        if rank in ranks:
            dp_group = group
    for data_rank in range(dp):
        ranks = list(range(data_rank * tp, (data_rank + 1) * tp))
        group = new_group(ranks)
        if rank in ranks:
            tp_group = group
    assert dp_group is not None, "data parallel group is not initialized"
    assert tp_group is not None, "tensor parallel group is not initialized"
    return _explicit_tp(tp_group, dp_group, rank, tp, dp)


def _explicit_tp(tp_group: Any, dp_group: Any, rank: int, tp: int, dp: int) -> ExplicitTP:
    return ExplicitTP(
        tp_group, dp_group, tp_size=tp, tp_rank=rank % tp, tp_src=rank - rank % tp, dp_size=dp, dp_rank=rank // tp
    )


def _adopt_tp_mesh(mesh: DeepSpeedDeviceMesh, dims: tuple[Any, Any]):
    if mesh is not bound_mesh():
        _state.tp_source = (mesh, dims)
    _set_tp_groups(mesh, dims)
    return _state.dp_group, _state.tp_group


def _adopt_explicit_tp(record: ExplicitTP):
    _state.tp_source = (None, record)
    _set_tp_groups(None, record)
    return _state.dp_group, _state.tp_group


def _init_tp_mesh_device(tensor_model_parallel_size: int = 1, data_parallel_size: Optional[int] = None):
    """TP/DP groups of a (data_parallel, tensor_parallel) mesh; None if TP groups already exist.

    DeepSpeed's control flow: ``TORCH_DISTRIBUTED_DEBUG=DETAIL`` or a DeviceMesh split error take the
    ``new_group`` path. The groups come from the mesh unless code replaced ``deepspeed.comm``'s
    ``new_group`` / ``initialize_mesh_device`` (then those are called as DeepSpeed calls them).
    """
    # TODOV1: legacy shim
    _W_TP_MESH.warn()
    if autotp_groups().keeps_existing("_init_tp_mesh_device", tensor_model_parallel_size):
        return None
    if data_parallel_size is None:
        data_parallel_size = _comm_world_size() // tensor_model_parallel_size
    if os.environ.get("TORCH_DISTRIBUTED_DEBUG", "").upper() == "DETAIL":
        logger.debug("TORCH_DISTRIBUTED_DEBUG=DETAIL: TP groups by the new_group path")
        return _tp_groups_by_new_group(tensor_model_parallel_size, data_parallel_size)
    initialize_mesh_device = _replaced_comm("initialize_mesh_device")
    if initialize_mesh_device is None and bound_mesh() is None:  # mesh_core's builder: what migrated code calls
        return init_autotp(tensor_model_parallel_size, data_parallel_size, device_type=default_device_type())
    if initialize_mesh_device is None:
        return _adopt_tp_mesh(*_tp_mesh(tensor_model_parallel_size, data_parallel_size))
    try:
        mesh_device = initialize_mesh_device(
            (data_parallel_size, tensor_model_parallel_size), ("data_parallel", "tensor_parallel")
        )
    except RuntimeError as exc:
        if _DEVICE_MESH_SPLIT_UNSUPPORTED not in str(exc):
            raise
        logger.debug("DeviceMesh splitting unsupported: TP groups by the new_group path")
        return _tp_groups_by_new_group(tensor_model_parallel_size, data_parallel_size)
    return _adopt_explicit_tp(
        _explicit_tp(
            mesh_device.get_group(mesh_dim="tensor_parallel"),
            mesh_device.get_group(mesh_dim="data_parallel"),
            _comm_rank(),
            tensor_model_parallel_size,
            data_parallel_size,
        )
    )


_W_GET_TP_GROUP = _w("get_tensor_model_parallel_group")
_W_GET_MP_GROUP = _w("get_model_parallel_group")
_W_GET_DP_GROUP = _w("get_data_parallel_group")
_W_SET_TP_WS = _w("set_tensor_model_parallel_world_size")
_W_GET_TP_WS = _w("get_tensor_model_parallel_world_size")
_W_GET_MP_WS = _w("get_model_parallel_world_size")
_W_SET_TP_RANK = _w("set_tensor_model_parallel_rank")
_W_GET_TP_RANK = _w("get_tensor_model_parallel_rank")
_W_GET_MP_RANK = _w("get_model_parallel_rank")
_W_GET_TP_SRC = _w("get_tensor_model_parallel_src_rank")
_W_GET_DP_WS = _w("get_data_parallel_world_size")
_W_GET_DP_RANK = _w("get_data_parallel_rank")


def get_tensor_model_parallel_group():
    """The tensor model parallel group the caller rank belongs to."""
    _legacy_call(_W_GET_TP_GROUP)  # TODOV1: legacy shim
    return autotp_groups().tensor_parallel_group()


def get_model_parallel_group():
    """The model parallel group (the TP group) the caller rank belongs to."""
    _legacy_call(_W_GET_MP_GROUP)  # TODOV1: legacy shim
    return autotp_groups().model_parallel_group()


def get_data_parallel_group():
    """The data parallel group of the TP layout (no fallback, unlike ``_get_data_parallel_group``)."""
    _legacy_call(_W_GET_DP_GROUP)  # TODOV1: legacy shim
    return autotp_groups().data_parallel_group()


def set_tensor_model_parallel_world_size(world_size: int) -> None:
    # TODOV1: legacy shim
    _W_SET_TP_WS.warn()
    _state.tp_world_size_override = world_size


def get_tensor_model_parallel_world_size() -> int:
    _legacy_call(_W_GET_TP_WS)  # TODOV1: legacy shim
    return autotp_groups().tensor_parallel_world_size()


def get_model_parallel_world_size() -> int:
    _legacy_call(_W_GET_MP_WS)  # TODOV1: legacy shim
    return autotp_groups().tensor_parallel_world_size()


def set_tensor_model_parallel_rank(rank: int) -> None:
    # TODOV1: legacy shim
    _W_SET_TP_RANK.warn()
    _state.tp_rank_override = rank


def get_tensor_model_parallel_rank() -> int:
    _legacy_call(_W_GET_TP_RANK)  # TODOV1: legacy shim
    return autotp_groups().tensor_parallel_rank()


def get_model_parallel_rank() -> int:
    _legacy_call(_W_GET_MP_RANK)  # TODOV1: legacy shim
    return autotp_groups().tensor_parallel_rank()


def get_tensor_model_parallel_src_rank() -> int:
    """Global rank of TP rank 0 (DeepSpeed's consecutive-block formula when a size override is set)."""
    _legacy_call(_W_GET_TP_SRC)  # TODOV1: legacy shim
    return autotp_groups().tensor_parallel_src_rank()


def get_data_parallel_world_size() -> int:
    _legacy_call(_W_GET_DP_WS)  # TODOV1: legacy shim
    return autotp_groups().data_parallel_world_size()


def get_data_parallel_rank() -> int:
    _legacy_call(_W_GET_DP_RANK)  # TODOV1: legacy shim
    return autotp_groups().data_parallel_rank()


_W_CREATE_MP = _w("_create_model_parallel")


def _create_model_parallel(model_parallel_size_: int):
    """(data parallel group, model parallel group) of a (dp, tp) layout; sets no module state."""
    # TODOV1: legacy shim
    _W_CREATE_MP.warn()
    assert dist.is_initialized()
    world_size = dist.get_world_size()
    model_parallel_size = min(model_parallel_size_, world_size)
    _divisible(world_size, model_parallel_size)
    spec = MeshSpec.build(world_size, dp=world_size // model_parallel_size, tp=model_parallel_size)
    mesh = DeepSpeedDeviceMesh(spec, device_type=default_device_type())
    return mesh.get_group("dp"), mesh.get_group("tp")


# --- expert parallel -------------------------------------------------------------------------
_W_CREATE_EP = _w("_create_expert_and_data_parallel")
_W_CREATE_EP_TP = _w("_create_expert_data_and_model_parallel")
_W_EP_RANKS = _w("_get_expert_parallel_ranks")


def _store_expert(name: str, ep_group: Any, ep_ranks: Any, edp_group: Any, edp_ranks: Any) -> None:
    state = _state
    if ep_group is not None:
        state.expert_parallel_group[name] = ep_group
        state.expert_parallel_group_ranks[name] = ep_ranks
    if edp_group is not None:
        state.expert_data_parallel_group[name] = edp_group
        state.expert_data_parallel_group_ranks[name] = edp_ranks
    for mesh in {id(m): m for m in (bound_mesh(), _default_or_none()) if m is not None}.values():
        _mirror_expert(mesh, name)


def _default_or_none() -> Optional[DeepSpeedDeviceMesh]:
    try:
        return default_mesh()
    except MeshSpecError:
        return None


def _mirror_expert(mesh: DeepSpeedDeviceMesh, name: str) -> None:
    """Serve the legacy table's expert groups ``name`` from ``mesh`` too, so that migrated DeepSpeed
    code (``expert_groups_named(model_mesh(self), name)``) reads exactly what the legacy getters read."""
    state = _state
    if name not in state.expert_parallel_group or name not in state.expert_data_parallel_group:
        return
    size = name[len("ep_size_") :]
    groups = ExpertGroups(
        ep_size=int(size) if size.isdigit() else 0,
        ep_group=state.expert_parallel_group[name],
        edp_group=state.expert_data_parallel_group[name],
        ep_ranks=state.expert_parallel_group_ranks[name],
        edp_ranks=state.expert_data_parallel_group_ranks[name],
    )
    register_expert_groups(mesh, name, groups)


def _as_range(ranks: list[int]) -> range:
    """A legacy ``range`` with the same elements as an evenly spaced rank list."""
    step = ranks[1] - ranks[0] if len(ranks) > 1 else 1
    return range(ranks[0], ranks[-1] + 1, step)


def _stage_layout(
    world_size: int, pp: int, ep: int, ranks: Optional[list[int]] = None, dbe: bool = False
) -> MeshLayout:
    """Expert split of each pipeline stage (consecutive world blocks), the stage ranks in ``ranks`` order."""
    return MeshLayout(
        MeshSpec.build(world_size, pp=pp, dp=world_size // pp, ep=ep, ranks=ranks, data_before_expert=dbe)
    )


def _resolve_pp(pp_size: Optional[int]) -> int:
    return pp_size if pp_size is not None else (1 if mpu is None else bwc_pipeline_parallel_world_size(mpu))


def _create_expert_and_data_parallel(
    expert_parallel_size_: int,
    mp_size: Optional[int] = None,
    pp_size: Optional[int] = None,
    mp_mode: str = "tp",
    use_data_before_expert_parallel_: bool = False,
    folding_spec: Any = None,
) -> None:
    """Expert (EP) and expert-data (EDP) groups named ``ep_size_<ep>``, DeepSpeed's layouts."""
    # TODOV1: legacy shim
    _W_CREATE_EP.warn()
    assert dist.is_initialized()
    ep = expert_parallel_size_
    effective_mp = 1 if mp_size is None else mp_size
    world_size = dist.get_world_size()
    pp = _resolve_pp(pp_size)
    if pp < 1 or world_size % pp:
        raise MeshSpecError(f"pipeline size pp={pp} does not divide world_size={world_size}; valid pp values divide it")
    stage = world_size // pp
    _divisible(stage, ep)
    name = f"ep_size_{ep}"
    rank = dist.get_rank()
    state = _state

    if effective_mp <= 1:
        layout = _stage_layout(world_size, pp, ep, dbe=use_data_before_expert_parallel_)
        have_edp = name in state.expert_data_parallel_group
        have_ep = name in state.expert_parallel_group
        edp_group = None if have_edp else _partition(layout.groups("edp"))
        ep_group = None if have_ep else _partition(layout.groups("ep"))
        _store_expert(
            name,
            ep_group,
            None if have_ep else _as_range(layout.group_ranks("ep", rank)),
            edp_group,
            None if have_edp else _as_range(layout.group_ranks("edp", rank)),
        )
        return

    if use_data_before_expert_parallel_:
        raise NotImplementedError("use_data_before_expert_parallel_ is not supported with mp_size > 1")
    if name in state.expert_parallel_group:
        if folding_spec is not None:
            from deepspeed.module_inject.auto_ep_folding import assert_group_matches_spec  # the spec is DeepSpeed's

            assert_group_matches_spec(
                {
                    "ep": [state.expert_parallel_group_ranks[name]],
                    "edp": [state.expert_data_parallel_group_ranks[name]],
                },
                folding_spec,
            )
        return
    if folding_spec is not None:
        from deepspeed.module_inject.auto_ep_folding import expected_folding_group_tables  # the spec is DeepSpeed's

        tables = expected_folding_group_tables(folding_spec)
        ep_lists, edp_lists = _folding_lists(tables, world_size, stage)
    else:
        if mp_mode == "tp" and stage % effective_mp:
            raise MeshSpecError(
                f"mp_size={effective_mp} does not divide the pipeline stage size {stage}; valid mp sizes divide it"
            )
        # TP-strided: each stage reordered lane-major, i.e. a mesh over a permuted rank list
        order = _lane_major(world_size, stage, effective_mp) if mp_mode == "tp" else None
        layout = _stage_layout(world_size, pp, ep, ranks=order)
        ep_lists, edp_lists = layout.groups("ep"), layout.groups("edp")
    ep_group = _partition(ep_lists)
    edp_group = _partition(edp_lists)
    _store_expert(name, ep_group, _member_list(ep_lists, rank), edp_group, _member_list(edp_lists, rank))


def _lane_major(world_size: int, stage: int, mp: int) -> list[int]:
    per_stage = [g * mp + lane for lane in range(mp) for g in range(stage // mp)]
    return [start + r for start in range(0, world_size, stage) for r in per_stage]


def _folding_lists(tables: Any, world_size: int, stage: int) -> tuple[list[list[int]], list[list[int]]]:
    ep_lists: list[list[int]] = []
    edp_lists: list[list[int]] = []
    for start in range(0, world_size, stage):
        members = set(range(start, start + stage))
        ep_lists += [list(g) for g in tables.ep_groups if set(g) <= members]
        edp_lists += [list(g) for g in tables.edp_groups if set(g) <= members]
    return ep_lists, edp_lists


def _member_list(rank_lists: list[list[int]], rank: int) -> Optional[list[int]]:
    return next((list(r) for r in rank_lists if rank in r), None)


def _expert_tp_layout(world_size: int, tp: int, ep: int, pp: int, dbe: bool) -> MeshLayout:
    """DeepSpeed's expert-TP split: EP/EDP carved inside each TP lane's DP group of each stage.

    A mesh (pp, tp, dp) over the ranks permuted so that each (stage, lane) DP group is a row.
    """
    _divisible(world_size, tp * pp)
    dp_world = world_size // (tp * pp)
    _divisible(dp_world, ep)
    stage = world_size // pp
    order: list[int] = []
    for start in range(0, world_size, stage):
        for lane in range(tp):
            if dbe:
                dp_stride = world_size // ep // tp // pp
                for ds in range(dp_stride):
                    order += range(start + lane + ds * tp, start + stage, dp_stride * tp)
            else:
                order += range(start + lane, start + stage, tp)
    return MeshLayout(
        MeshSpec.build(world_size, order=("pp", "tp", "dp"), ranks=order, pp=pp, tp=tp, dp=dp_world, ep=ep)
    )


def _get_expert_parallel_ranks(
    world_size: int,
    tensor_parallel_size_: int,
    expert_parallel_size_: int,
    pipeline_parallel_size_: int = 1,
    use_data_before_expert_parallel_: bool = False,
) -> tuple[list[list[int]], list[list[int]]]:
    """(EP rank lists, EDP rank lists) of the expert-TP layout (pure; creates nothing)."""
    # TODOV1: legacy shim
    _W_EP_RANKS.warn()
    layout = _expert_tp_layout(
        world_size,
        tensor_parallel_size_,
        expert_parallel_size_,
        pipeline_parallel_size_,
        use_data_before_expert_parallel_,
    )
    return layout.groups("ep"), layout.groups("edp")


def _create_expert_data_and_model_parallel(
    expert_parallel_size_: int, mpu: Any, use_data_before_expert_parallel_: bool = False
) -> None:
    """Expert groups for expert tensor parallelism (EP/EDP inside each TP lane), from ``mpu``."""
    # TODOV1: legacy shim
    _W_CREATE_EP_TP.warn()
    assert dist.is_initialized(), "dist is not initialized"
    global expert_tensor_parallel_world_size
    tp = bwc_tensor_model_parallel_world_size(mpu)
    expert_tensor_parallel_world_size = tp
    world_size = dist.get_world_size()
    rank = dist.get_rank()
    dp_world_size = _dp_world_size()
    pp = 1 if mpu is None else bwc_pipeline_parallel_world_size(mpu)
    _divisible(world_size, tp)
    _divisible(dp_world_size, expert_parallel_size_)
    name = f"ep_size_{expert_parallel_size_}"
    state = _state
    if name in state.expert_data_parallel_group or name in state.expert_parallel_group:
        return
    layout = _expert_tp_layout(world_size, tp, expert_parallel_size_, pp, use_data_before_expert_parallel_)
    ep_lists, edp_lists = layout.groups("ep"), layout.groups("edp")
    ep_group = _partition(ep_lists)
    edp_group = _partition(edp_lists)
    _store_expert(name, ep_group, _member_list(ep_lists, rank), edp_group, _member_list(edp_lists, rank))


_W_MAX_SIZE = _w("_get_max_expert_size")
_W_MAX_NAME = _w("_get_max_expert_size_name")
_W_MAX_GROUP = _w("_get_max_expert_parallel_group")
_W_EP_GROUP = _w("_get_expert_parallel_group", hot=True)
_W_EP_GROUP_RANKS = _w("_get_expert_parallel_group_ranks")
_W_EP_DICT = _w("_get_expert_parallel_group_dict")
_W_EDP_GROUP = _w("_get_expert_data_parallel_group", hot=True)
_W_EDP_GROUP_RANKS = _w("_get_expert_data_parallel_group_ranks")
_W_EDP_DICT = _w("_get_expert_data_parallel_group_dict")
_W_EP_BCAST = _w("_get_expert_broadcast_src_rank")
_W_EP_WS = _w("_get_expert_parallel_world_size")
_W_EDP_WS = _w("_get_expert_data_parallel_world_size")
_W_EP_RANK = _w("_get_expert_parallel_rank")
_W_EP_SRC = _w("_get_expert_parallel_src_rank")
_W_EDP_RANK = _w("_get_expert_data_parallel_rank")
_W_EXPERT_MP_WS = _w("_get_expert_model_parallel_world_size")


def _get_max_expert_size() -> Optional[int]:
    """The largest ep size among the created expert groups (None if there are none)."""
    _legacy_call(_W_MAX_SIZE)  # TODOV1: legacy shim
    return _max_expert_size()


def _max_expert_size() -> Optional[int]:
    sizes = [int(key.split("_")[2]) for key in _state.expert_parallel_group]
    return max(sizes) if sizes else None


def _get_max_expert_size_name() -> str:
    _legacy_call(_W_MAX_NAME)  # TODOV1: legacy shim
    return f"ep_size_{_max_expert_size()}"


def _get_max_expert_parallel_group():
    _legacy_call(_W_MAX_GROUP)  # TODOV1: legacy shim
    return _expert_group(f"ep_size_{_max_expert_size()}")


def _expert_group(group_name: str):
    try:
        return _state.expert_parallel_group[group_name]
    except KeyError:
        raise AssertionError("expert parallel group is not initialized") from None


def _expert_data_group(group_name: str):
    try:
        return _state.expert_data_parallel_group[group_name]
    except KeyError:
        raise AssertionError("expert data parallel group is not initialized") from None


_getframe = sys._getframe


def _get_expert_parallel_group(group_name: str):
    """The expert parallel group ``group_name`` (``ep_size_N``) the caller rank belongs to."""
    # TODOV1: legacy shim (hot getter: bounded call-site probing, see compat.deprecation)
    if _WRONG_GRID is not None:
        raise _WRONG_GRID.error("deepspeed.utils.groups._get_expert_parallel_group()")
    if _W_EP_GROUP.budget:
        _W_EP_GROUP.probe(_getframe(1))
    try:
        return _EP_GROUPS[group_name]
    except KeyError:
        raise AssertionError("expert parallel group is not initialized") from None


def _get_expert_parallel_group_ranks(group_name: str):
    _legacy_call(_W_EP_GROUP_RANKS)  # TODOV1: legacy shim
    assert group_name in _state.expert_parallel_group_ranks, "expert parallel group is not initialized"
    return _state.expert_parallel_group_ranks[group_name]


def _get_expert_parallel_group_dict() -> dict:
    _legacy_call(_W_EP_DICT)  # TODOV1: legacy shim
    return _state.expert_parallel_group


def _get_expert_data_parallel_group(group_name: str):
    # TODOV1: legacy shim (hot getter: bounded call-site probing, see compat.deprecation)
    if _WRONG_GRID is not None:
        raise _WRONG_GRID.error("deepspeed.utils.groups._get_expert_data_parallel_group()")
    if _W_EDP_GROUP.budget:
        _W_EDP_GROUP.probe(_getframe(1))
    try:
        return _EDP_GROUPS[group_name]
    except KeyError:
        raise AssertionError("expert data parallel group is not initialized") from None


def _get_expert_data_parallel_group_ranks(group_name: str):
    _legacy_call(_W_EDP_GROUP_RANKS)  # TODOV1: legacy shim
    assert group_name in _state.expert_data_parallel_group_ranks, "expert data parallel group is not initialized"
    return _state.expert_data_parallel_group_ranks[group_name]


def _get_expert_data_parallel_group_dict() -> dict:
    _legacy_call(_W_EDP_DICT)  # TODOV1: legacy shim
    return _state.expert_data_parallel_group


def _get_expert_broadcast_src_rank(group_name: str) -> int:
    _legacy_call(_W_EP_BCAST)  # TODOV1: legacy shim
    _assert_initialized()
    return dist.get_global_rank(_expert_data_group(group_name), 0)


def _get_expert_parallel_world_size(group_name: str) -> int:
    _legacy_call(_W_EP_WS)  # TODOV1: legacy shim
    _assert_initialized()
    return dist.get_world_size(group=_expert_group(group_name))


def _get_expert_data_parallel_world_size(group_name: str) -> int:
    _legacy_call(_W_EDP_WS)  # TODOV1: legacy shim
    _assert_initialized()
    return dist.get_world_size(group=_expert_data_group(group_name))


def _get_expert_parallel_rank(group_name: str) -> int:
    _legacy_call(_W_EP_RANK)  # TODOV1: legacy shim
    _assert_initialized()
    return dist.get_rank(group=_expert_group(group_name))


def _get_expert_parallel_src_rank(group_name: str) -> int:
    """Global rank of EP rank 0 (DeepSpeed's formula assumed consecutive EP groups)."""
    _legacy_call(_W_EP_SRC)  # TODOV1: legacy shim
    _assert_initialized()
    return dist.get_global_rank(_expert_group(group_name), 0)


def _get_expert_data_parallel_rank(group_name: str) -> int:
    _legacy_call(_W_EDP_RANK)  # TODOV1: legacy shim
    _assert_initialized()
    return dist.get_rank(group=_expert_data_group(group_name))


def _get_expert_model_parallel_world_size() -> int:
    _legacy_call(_W_EXPERT_MP_WS)  # TODOV1: legacy shim
    return expert_tensor_parallel_world_size


# --- world clone and all-to-all ------------------------------------------------------------------
_W_CLONE_WORLD = _w("_clone_world_group")
_W_ALL_TO_ALL = _w("_get_local_all_to_all_group")


def _world_group():
    state = _state
    if state.world_group is None:
        _assert_initialized()
        # the registry serves the whole world as WORLD itself: no second communicator
        state.world_group = _partition([range(dist.get_world_size())])
    return state.world_group


def _clone_world_group():
    """A group of every rank (WORLD: get_global_rank works on it in current torch)."""
    # TODOV1: legacy shim
    _W_CLONE_WORLD.warn()
    _assert_initialized()
    return _world_group()


def _devices_per_node() -> int:
    accelerator = sys.modules.get("deepspeed.accelerator")
    if accelerator is not None:  # only if DeepSpeed is already loaded; compat never imports it
        return accelerator.get_accelerator().device_count()
    if torch.cuda.is_available():
        return torch.cuda.device_count()
    return int(os.environ.get("LOCAL_SIZE", 0)) or 1


def _member_group(rank_lists: Sequence[Sequence[int]]) -> Any:
    """The group, or (like ``new_group``) ``GroupMember.NON_GROUP_MEMBER`` for a non-member."""
    group = _partition(rank_lists)
    return dist.GroupMember.NON_GROUP_MEMBER if group is None else group


def _get_local_all_to_all_group() -> dict:
    """``local_i`` (node-local) and ``global_j`` (same local index) groups for ZeRO++ qgZ."""
    # TODOV1: legacy shim
    _W_ALL_TO_ALL.warn()
    assert dist.is_initialized(), "dist is not initialized"
    return local_all_to_all_groups(_devices_per_node())  # mesh_core's one dict


# --- data / model / sequence parallel resolution (engine-facing) ----------------------------------
_SP_MPU_PROBE: list = [None, False]  # (last mpu probed, result): hasattr on a miss is slow


def _is_sp_mpu(candidate: Any) -> bool:
    """DeepSpeed's marker for the Ulysses ``parallel_state_sp`` module used as mpu."""
    if candidate is _SP_MPU_PROBE[0]:
        return _SP_MPU_PROBE[1]
    result = hasattr(candidate, "initialize_sequence_parallel")
    _SP_MPU_PROBE[:] = [candidate, result]
    return result


def _mesh_device_group(dim: str):
    """A group of the legacy ``mesh_device`` (torch DeviceMesh dims or a DeepSpeedDeviceMesh)."""
    if isinstance(mesh_device, DeepSpeedDeviceMesh):
        return mesh_device.get_group({"data_parallel": "dp", "sequence_parallel": "sp"}[dim])
    return mesh_device.get_group(mesh_dim=dim)


_W_DP_GROUP = _w("_get_data_parallel_group", hot=True)
_W_DP_GROUP_RANKS = _w("_get_data_parallel_group_ranks")
_W_BCAST = _w("_get_broadcast_src_rank")
_W_DP_WS = _w("_get_data_parallel_world_size")
_W_MP_WS = _w("_get_model_parallel_world_size")
_W_DP_RANK = _w("_get_data_parallel_rank")
_W_SP_WS = _w("_get_sequence_parallel_world_size")
_W_SP_RANK = _w("_get_sequence_parallel_rank")
_W_SP_GROUP = _w("_get_sequence_parallel_group")
_W_SDP_WS = _w("_get_sequence_data_parallel_world_size")
_W_SDP_RANK = _w("_get_sequence_data_parallel_rank")
_W_SDP_GROUP = _w("_get_sequence_data_parallel_group", hot=True)


def _dp_group():
    if mesh_device is not None:
        return _mesh_device_group("data_parallel")
    bound = _state.bound_groups
    if bound:
        return bound["dp"][0]
    if mpu is not None:
        return None if _is_sp_mpu(mpu) else mpu.get_data_parallel_group()
    return _state.world_group if _state.world_group is not None else _world_group()


def _get_data_parallel_group():
    """The data parallel group the caller rank belongs to (mesh_device, bound mesh, mpu or world)."""
    # TODOV1: legacy shim (hot getter: bounded call-site probing, see compat.deprecation)
    if _WRONG_GRID is not None:
        raise _WRONG_GRID.error("deepspeed.utils.groups._get_data_parallel_group()")
    if _W_DP_GROUP.budget:
        _W_DP_GROUP.probe(_getframe(1))
    if mpu is not None and mesh_device is None and not _state.bound_groups:
        return None if _is_sp_mpu(mpu) else mpu.get_data_parallel_group()
    return _dp_group()


def _get_data_parallel_group_ranks():
    _legacy_call(_W_DP_GROUP_RANKS)  # TODOV1: legacy shim
    _assert_initialized()
    if _state.bound_groups:
        return _state.bound_groups["dp"][3]
    if mpu is not None:
        return mpu.get_data_parallel_group_ranks()
    return range(dist.get_world_size())


def _dp_world_size():
    _assert_initialized()
    if mesh_device is not None:
        return dist.get_world_size(_mesh_device_group("data_parallel"))
    if _state.bound_groups:
        return _state.bound_groups["dp"][1]
    if mpu is not None:
        return None if _is_sp_mpu(mpu) else mpu.get_data_parallel_world_size()
    return dist.get_world_size(group=_dp_group())


def _get_data_parallel_world_size():
    _legacy_call(_W_DP_WS)  # TODOV1: legacy shim
    return _dp_world_size()


def _get_model_parallel_world_size() -> int:
    _legacy_call(_W_MP_WS)  # TODOV1: legacy shim
    if mpu is None or _is_sp_mpu(mpu):
        return 1
    return mpu.get_model_parallel_world_size()


def _dp_rank() -> int:
    _assert_initialized()
    return dist.get_rank(group=_dp_group())


def _get_data_parallel_rank() -> int:
    _legacy_call(_W_DP_RANK)  # TODOV1: legacy shim
    return _dp_rank()


def _get_broadcast_src_rank() -> int:
    _legacy_call(_W_BCAST)  # TODOV1: legacy shim
    _assert_initialized()
    return dist.get_global_rank(_sdp_group(), 0)


def _get_sequence_parallel_world_size() -> int:
    _legacy_call(_W_SP_WS)  # TODOV1: legacy shim
    _assert_initialized()
    if mesh_device is not None:
        return dist.get_world_size(_mesh_device_group("sequence_parallel"))
    if _state.bound_groups:
        return _state.bound_groups["sp"][1]
    if mpu is not None and hasattr(mpu, "get_sequence_parallel_world_size"):
        return mpu.get_sequence_parallel_world_size()
    return 1


def _get_sequence_parallel_rank() -> int:
    _legacy_call(_W_SP_RANK)  # TODOV1: legacy shim
    if mpu is not None and hasattr(mpu, "get_sequence_parallel_rank"):
        return mpu.get_sequence_parallel_rank()
    if mesh_device is not None:
        return dist.get_rank(_mesh_device_group("sequence_parallel"))
    if _state.bound_groups:
        return _state.bound_groups["sp"][2]
    return 0


def _get_sequence_parallel_group():
    _legacy_call(_W_SP_GROUP)  # TODOV1: legacy shim
    if mpu is None or not hasattr(mpu, "get_sequence_parallel_group"):
        if mesh_device is not None:
            return _mesh_device_group("sequence_parallel")
        if _state.bound_groups:
            return _state.bound_groups["sp"][0]
        raise NoSequenceParallelGroupError(
            "no mpu with a sequence-parallel group and no mesh yet (deepspeed.initialize with the config's "
            '"mesh": {"sp": N} makes one)'
        )
    return mpu.get_sequence_parallel_group()


def _get_sequence_data_parallel_world_size():
    _legacy_call(_W_SDP_WS)  # TODOV1: legacy shim
    if mpu is not None and hasattr(mpu, "get_sequence_data_parallel_world_size"):
        return mpu.get_sequence_data_parallel_world_size()
    if mesh_device is None and _state.bound_groups:
        return _state.bound_groups[("dp", "sp")][1]
    return _dp_world_size()


def _get_sequence_data_parallel_rank() -> int:
    _legacy_call(_W_SDP_RANK)  # TODOV1: legacy shim
    if mpu is not None and hasattr(mpu, "get_sequence_data_parallel_rank"):
        return mpu.get_sequence_data_parallel_rank()
    if mesh_device is None and _state.bound_groups:
        return _state.bound_groups[("dp", "sp")][2]
    return _dp_rank()


def _sdp_group():
    if mpu is not None and hasattr(mpu, "get_sequence_data_parallel_group"):
        return mpu.get_sequence_data_parallel_group()
    if mesh_device is None and _state.bound_groups:
        return _state.bound_groups[("dp", "sp")][0]
    return _dp_group()


def _get_sequence_data_parallel_group():
    # TODOV1: legacy shim (hot getter: DeepSpeed calls it on every ZeRO-0 step)
    if _WRONG_GRID is not None:
        raise _WRONG_GRID.error("deepspeed.utils.groups._get_sequence_data_parallel_group()")
    if _W_SDP_GROUP.budget:
        _W_SDP_GROUP.probe(_getframe(1))
    return _sdp_group()


# --- ZeRO++ hpZ (secondary partition) groups ---------------------------------------------------
# The right replacement depends on the mesh: on an HSDP mesh (dp_replicate x dp_shard) the group
# all-gathers stay in is the dp_shard group (sp folded in when sp > 1); a dp-only mesh has no dim for it.
_W_ZP_CREATE = _w("_create_zero_param_parallel_group")
_W_ZP_GROUP = _w("_get_zero_param_intra_parallel_group")
_W_ZP_INIT = _w("_zero_param_parallel_is_initialized")
_W_ZP_RANK = _w("_get_zero_param_intra_parallel_rank_in_mygroup")
_W_ZP_WS = _w("_get_zero_param_intra_parallel_group_world_size")
_W_ZP_RANKS = _w("_get_zero_param_intra_parallel_group_ranks")


def _create_zero_param_parallel_group(group_size: int) -> None:
    """hpZ groups: consecutive world blocks of ``min(group_size, W)`` ranks (DeepSpeed's layout);
    with a bound mesh, that mesh's hpZ groups (see :func:`mesh_core.runtime_hooks.hpz_rank_lists`). Kept in
    mesh_core per world and ZeRO domain, so ``hpz_group(<mesh>)`` (migrated code) sees them too."""
    # TODOV1: legacy shim
    _W_ZP_CREATE.warn()
    assert dist.is_initialized()
    mesh = bound_mesh()
    try:
        _hooks.create_hpz_group(mesh, group_size)
    except _hooks.HpzGroupError as exc:
        if mesh is not None:
            raise
        raise AssertionError(str(exc)) from None  # DeepSpeed's exact type where legacy has no mesh


def _zero_param_group():
    return _hooks.hpz_group(bound_mesh())


def _get_zero_param_intra_parallel_group():
    _legacy_call(_W_ZP_GROUP)  # TODOV1: legacy shim
    return _zero_param_group()


def _zero_param_parallel_is_initialized():
    """DeepSpeed's check, returned as is: False when nothing is set, else None (never True)."""
    _legacy_call(_W_ZP_INIT)  # TODOV1: legacy shim
    if _zero_param_group() is None and _state.dp_group is None:
        return False
    return None


def _get_zero_param_intra_parallel_rank_in_mygroup() -> int:
    _legacy_call(_W_ZP_RANK)  # TODOV1: legacy shim
    return dist.get_rank(group=_zero_param_group())


def _get_zero_param_intra_parallel_group_world_size() -> int:
    _legacy_call(_W_ZP_WS)  # TODOV1: legacy shim
    return dist.get_world_size(group=_zero_param_group())


def _get_zero_param_intra_parallel_group_ranks() -> list[int]:
    _legacy_call(_W_ZP_RANKS)  # TODOV1: legacy shim
    return _hooks.hpz_group_ranks(bound_mesh())  # [] while none is built, as DeepSpeed


sys.modules[__name__].__class__ = _MarkedModule
