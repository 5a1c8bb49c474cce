"""The mesh migrated code uses where it has no engine at hand.

:func:`current_mesh` is the default mesh (:func:`mesh_core.set_default_mesh` / ``use_mesh``; the
compat layer sets it to the mesh of the engine ``deepspeed.initialize`` built last, as legacy
DeepSpeed's process-global ``groups.mpu``). With none set, and the real DeepSpeed holding an mpu or a
device mesh of its own (``deepspeed.initialize(mpu=...)`` without the mesh runtime), it is a view that
answers with DeepSpeed's own getters (:mod:`mesh_core.roles.legacy_state`). Otherwise it is the
data-parallel mesh over the whole world, which is what legacy ``deepspeed.utils.groups`` falls back
to with no mpu (its data parallel group is a world clone; its expert groups are built over the world
as data parallel; it has no sequence-parallel group: ``get_group("sp")`` raises legacy's
``KeyError``, see :mod:`mesh_core.roles.legacy_state`).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import torch.distributed as dist

from ..spec import MeshSpecError
from .default import live_default_mesh
from .legacy_state import legacy_groups_view

if TYPE_CHECKING:
    from ..device_mesh import DeepSpeedDeviceMesh

logger = logging.getLogger(__name__)

# the world mesh of the current default process group (a new init_process_group gets a new one);
# the group object itself is kept so that identity, not a reusable id(), decides
_world_mesh: list = [None, None]  # [default group, mesh]


def current_mesh() -> "DeepSpeedDeviceMesh":
    """The default mesh if one is set; else, where legacy DeepSpeed recorded an mpu (or device mesh),
    a :class:`~mesh_core.roles.legacy_state.LegacyGroupsView` of it; else the data-parallel world mesh."""
    mesh = live_default_mesh()
    if mesh is not None:
        return mesh
    legacy = legacy_groups_view(_world_dp_mesh)
    if legacy is not None:
        return legacy  # type: ignore[return-value]  (answers the same queries)
    return _world_dp_mesh()


def _world_dp_mesh() -> "DeepSpeedDeviceMesh":
    if not dist.is_available() or not dist.is_initialized():
        raise MeshSpecError(
            "no default mesh is set and torch.distributed is not initialised; call "
            "torch.distributed.init_process_group (or deepspeed.init_distributed) first"
        )
    world = dist.group.WORLD
    group, mesh = _world_mesh
    if group is not world or mesh is None or getattr(mesh, "_destroyed", False):
        from .legacy_state import world_mesh_class

        # a DeepSpeedDeviceMesh whose SP group query raises legacy's KeyError (no SP layout yet)
        mesh = world_mesh_class().build(dp=dist.get_world_size(), verify=False)
        _world_mesh[:] = [world, mesh]
        logger.info("no default mesh is set; using the data-parallel world mesh %s", mesh.spec.describe())
    return mesh


def model_mesh(owner: object) -> "DeepSpeedDeviceMesh":
    """The mesh of the model ``owner`` (an engine) serves: its ``mesh_device`` once that is a
    :class:`DeepSpeedDeviceMesh` (the mesh runtime sets it when ``deepspeed.initialize`` returns),
    else :func:`current_mesh` (while the engine is being built, the runtime makes its mesh current).

    What migrated DeepSpeed engine code calls where it used to call ``deepspeed.utils.groups``."""
    from ..device_mesh import DeepSpeedDeviceMesh

    mesh = getattr(owner, "mesh_device", None)
    if isinstance(mesh, DeepSpeedDeviceMesh):
        return mesh
    return current_mesh()
