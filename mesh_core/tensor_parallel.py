"""The AutoTP tensor / data parallel groups of this process, for code with no model or engine at hand.

Legacy DeepSpeed keeps AutoTP's groups in ``deepspeed.utils.groups`` module globals
(``_TENSOR_MODEL_PARALLEL_GROUP``, ``_DATA_PARALLEL_GROUP``, the size / rank overrides): AutoTP's
layer replacement, ``TpTrainingManager`` and the compiled TP collectives read them with no engine
or mesh in scope, before any engine exists. :func:`autotp_groups` is that one pointer, held here so
that the legacy getters (the mesh runtime, ``compat.groups``, stores its TP state in it) and
mesh-native code read one state, never two copies.

Why process-global (the one exception to "meshes hold no global state"): AutoTP's model code has
no handle to pass a mesh through, and legacy semantics are one set of TP groups per process (a
second ``_init_tp_mesh_device`` is a no-op while TP groups exist; world teardown clears them).
Whoever builds the groups owns it: :func:`init_autotp`, or the mesh runtime's legacy builders.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, Optional

import torch.distributed as dist

if TYPE_CHECKING:
    from .device_mesh import DeepSpeedDeviceMesh

logger = logging.getLogger(__name__)

_TP_MISSING = "intra_layer_model parallel group is not initialized"
_MP_MISSING = "model parallel group is not initialized"
_DP_MISSING = "data parallel group is not initialized"


@dataclass
class AutoTPGroups:
    """The process's AutoTP groups (``None`` until built) with this rank's sizes and ranks in them.

    The getters have legacy ``deepspeed.utils.groups``' meaning and errors: an ``AssertionError``
    while no TP groups exist, the size / rank overrides (``set_tensor_model_parallel_world_size`` /
    ``_rank``) winning over the groups."""

    tp_group: Any = None
    dp_group: Any = None
    tp_size: int = 0
    tp_rank: int = 0
    tp_src: int = 0  # global rank of TP rank 0
    dp_size: int = 0
    dp_rank: int = 0
    tp_world_size_override: Optional[int] = None
    tp_rank_override: Optional[int] = None
    tp_source: Any = None  # owner's record of what built the groups (restored after a temporary binding)

    def reset(self) -> None:
        """Forget every group and override (world teardown)."""
        for item in fields(self):
            setattr(self, item.name, item.default)

    def adopt(self, mesh: "DeepSpeedDeviceMesh", tp_dims: Any = "tp", dp_dims: Any = "dp") -> None:
        """Serve ``mesh``'s ``tp_dims`` / ``dp_dims`` groups (both resolved now)."""
        self.tp_group, self.dp_group = mesh.get_group(tp_dims), mesh.get_group(dp_dims)
        self.tp_size, self.tp_rank = mesh.size(tp_dims), mesh.get_rank(tp_dims)
        self.tp_src = min(mesh.get_group_ranks(tp_dims))
        self.dp_size, self.dp_rank = mesh.size(dp_dims), mesh.get_rank(dp_dims)

    @property
    def initialized(self) -> bool:
        return self.tp_group is not None

    def keeps_existing(self, builder: str, tensor_model_parallel_size: int) -> bool:
        """Whether TP groups already exist, so ``builder`` must build nothing (legacy's early
        return); warns when the requested size differs from theirs."""
        if self.tp_group is None:
            return False
        if self.tp_size != tensor_model_parallel_size:
            logger.warning(
                "%s(tensor_model_parallel_size=%s) ignored: TP groups of size %s already exist",
                builder,
                tensor_model_parallel_size,
                self.tp_size,
            )
        return True

    # --- legacy deepspeed.utils.groups meaning ------------------------------------------------
    def tensor_parallel_group(self) -> Any:
        """``get_tensor_model_parallel_group()``."""
        assert self.tp_group is not None, _TP_MISSING
        return self.tp_group

    def model_parallel_group(self) -> Any:
        """``get_model_parallel_group()`` (the TP group)."""
        assert self.tp_group is not None, _MP_MISSING
        return self.tp_group

    def data_parallel_group(self) -> Any:
        """``get_data_parallel_group()``: the DP group of the TP layout (no world fallback)."""
        assert self.dp_group is not None, _DP_MISSING
        return self.dp_group

    def tensor_parallel_world_size(self) -> int:
        """``get_tensor_model_parallel_world_size()`` / ``get_model_parallel_world_size()``."""
        if self.tp_world_size_override is not None:
            return self.tp_world_size_override
        assert self.tp_group is not None, _TP_MISSING
        return self.tp_size

    def tensor_parallel_rank(self) -> int:
        """``get_tensor_model_parallel_rank()`` / ``get_model_parallel_rank()``."""
        if self.tp_rank_override is not None:
            return self.tp_rank_override
        assert self.tp_group is not None, _TP_MISSING
        return self.tp_rank

    def tensor_parallel_src_rank(self) -> int:
        """``get_tensor_model_parallel_src_rank()``: global rank of TP rank 0 (legacy's
        consecutive-block formula while a size override is set)."""
        if self.tp_world_size_override is not None:
            local = self.tp_world_size_override
            return (dist.get_rank() // local) * local
        assert self.tp_group is not None, _TP_MISSING
        return self.tp_src

    def data_parallel_world_size(self) -> int:
        """``get_data_parallel_world_size()``."""
        assert self.dp_group is not None, _DP_MISSING
        return self.dp_size

    def data_parallel_rank(self) -> int:
        """``get_data_parallel_rank()``."""
        assert self.dp_group is not None, _DP_MISSING
        return self.dp_rank


_AUTOTP = AutoTPGroups()


def autotp_groups() -> AutoTPGroups:
    """The process's AutoTP groups (the same object for the life of the process)."""
    return _AUTOTP



def _device_type() -> str:
    # the device the default group's collectives run on (legacy builds its TP mesh on the accelerator)
    if dist.get_backend() in ("fake", "gloo"):
        return "cpu"
    return dist.distributed_c10d._get_object_coll_device(None).type  # type: ignore[attr-defined]


def init_autotp(
    tensor_model_parallel_size: int = 1,
    data_parallel_size: Optional[int] = None,
    *,
    device_type: Optional[str] = None,
) -> Optional[tuple[Any, Any]]:
    """Build the AutoTP groups of a (data_parallel, tensor_parallel) mesh over the whole world, as
    legacy ``groups._init_tp_mesh_device`` does: TP groups are consecutive blocks of
    ``tensor_model_parallel_size`` ranks, DP groups every tp-th rank; returns ``(dp group, tp group)``.

    A no-op returning None while TP groups exist (legacy's early return; a warning if the sizes
    differ). Bad sizes raise :class:`~mesh_core.MeshSpecError` before any group is created."""
    from .device_mesh import DeepSpeedDeviceMesh
    from .spec import MeshSpec, MeshSpecError

    state = _AUTOTP
    if state.keeps_existing("init_autotp", tensor_model_parallel_size):
        return None
    if not dist.is_available() or not dist.is_initialized():
        raise MeshSpecError("init_autotp needs torch.distributed initialised (init_process_group first)")
    if isinstance(tensor_model_parallel_size, bool) or not isinstance(tensor_model_parallel_size, int) \
            or tensor_model_parallel_size < 1:
        raise MeshSpecError(
            f"tensor_model_parallel_size must be a positive int dividing the world size, got {tensor_model_parallel_size!r}")
    world = dist.get_world_size()
    if data_parallel_size is None:
        data_parallel_size = world // tensor_model_parallel_size
    spec = MeshSpec.build(world, dp=data_parallel_size, tp=tensor_model_parallel_size)
    mesh = DeepSpeedDeviceMesh(spec, device_type=device_type or _device_type())
    state.tp_source = (mesh, ("tp", "dp"))
    state.adopt(mesh)
    return state.dp_group, state.tp_group
