"""One DeviceMesh-based process-group layout per model: DP (or HSDP), TP, PP, SP and EP.

- :class:`MeshSpec` — a frozen, validated layout description (pure data);
- :class:`MeshLayout` — rank ↔ coordinate and group math over a spec, no torch.distributed;
- :class:`DeepSpeedDeviceMesh` — the process groups, on top of ``torch.distributed.DeviceMesh``;
- :func:`spec_from_config` — a spec from a DeepSpeed config (``"mesh"`` section or legacy keys);
- :func:`transfer_weights` — move a model's weights between two layouts;
- the current / default mesh (:func:`current_mesh`, :func:`model_mesh`, :func:`default_mesh`,
  :func:`set_default_mesh`, :func:`use_mesh`), :func:`mesh_of` (the mesh of an mpu or grid) and
  :func:`pipeline_topology` (a ``PipelineModule``'s ``topology=`` in mesh dims).

What the DeepSpeed runtime uses beside these (group registries, expert groups by name, hpZ,
AutoTP's groups...) is in :mod:`mesh_core.runtime_hooks`.
"""
from .config import spec_from_config
from .device_mesh import DeepSpeedDeviceMesh, ExpertGroups
from .layout import MeshLayout
from .roles.current import current_mesh, model_mesh
from .roles.default import default_mesh, set_default_mesh, use_mesh
from .roles.mpu_mesh import mesh_of
from .roles.pipe_topology import pipeline_topology
from .spec import MESH_DIMS, MeshSpec, MeshSpecError
from .transfer_engines import transfer_weights

__all__ = [
    "MESH_DIMS",
    "DeepSpeedDeviceMesh",
    "ExpertGroups",
    "MeshLayout",
    "MeshSpec",
    "MeshSpecError",
    "current_mesh",
    "default_mesh",
    "mesh_of",
    "model_mesh",
    "pipeline_topology",
    "set_default_mesh",
    "spec_from_config",
    "transfer_weights",
    "use_mesh",
]
