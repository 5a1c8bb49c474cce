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
Whoever builds the groups fills it: :func:`init_autotp`, or the mesh runtime's legacy builders; the
object itself is held by :data:`mesh_core.roles.state.PROCESS_ROLES`.
"""

from __future__ import annotations

from typing import Any, Optional

import torch.distributed as dist

from .. import torch_compat
from .state import PROCESS_ROLES, AutoTPGroups

__all__ = ["AutoTPGroups", "autotp_groups", "init_autotp"]


def autotp_groups() -> AutoTPGroups:
    """The process's AutoTP groups (the same object for the life of the process)."""
    return PROCESS_ROLES.autotp


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
    from ..device_mesh import DeepSpeedDeviceMesh
    from ..spec import MeshSpec, MeshSpecError

    state = PROCESS_ROLES.autotp
    if state.keeps_existing("init_autotp", tensor_model_parallel_size):
        return None
    if not dist.is_available() or not dist.is_initialized():
        raise MeshSpecError("init_autotp needs torch.distributed initialised (init_process_group first)")
    if (
        isinstance(tensor_model_parallel_size, bool)
        or not isinstance(tensor_model_parallel_size, int)
        or tensor_model_parallel_size < 1
    ):
        raise MeshSpecError(
            f"tensor_model_parallel_size must be a positive int dividing the world size, got {tensor_model_parallel_size!r}"
        )
    world = dist.get_world_size()
    if data_parallel_size is None:
        data_parallel_size = world // tensor_model_parallel_size
    spec = MeshSpec.build(world, dp=data_parallel_size, tp=tensor_model_parallel_size)
    mesh = DeepSpeedDeviceMesh(spec, device_type=device_type or torch_compat.default_device_type())
    state.tp_source = (mesh, ("tp", "dp"))
    state.adopt(mesh)
    return state.dp_group, state.tp_group
