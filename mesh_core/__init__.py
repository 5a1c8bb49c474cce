"""One DeviceMesh-based process-group layout per model: DP (or HSDP), TP, PP, SP and EP.

- :class:`MeshSpec` — a frozen, validated layout description (pure data);
- :class:`MeshLayout` — rank ↔ coordinate and group math over a spec, no torch.distributed;
- :class:`DeepSpeedDeviceMesh` — the process groups, on top of ``torch.distributed.DeviceMesh``;
- :func:`spec_from_config` — a spec from a DeepSpeed config (``"mesh"`` section or legacy keys).
"""
from .absence import AbsentRanksError
from .config import spec_from_config
from .roles.current import current_mesh, model_mesh
from .roles.default import default_mesh, set_default_mesh, use_mesh
from .device_mesh import DeepSpeedDeviceMesh, ExpertGroups, ExpertGroupsNotBuilt, expert_groups_name
from .roles.hpz import HpzGroupError, release_hpz_groups
from .layout import MeshLayout
from .roles.mpu_mesh import MpuMesh, mesh_of, model_parallel_world_size
from .roles.node_groups import all_to_all_groups, local_all_to_all_groups
from .roles.pipe_topology import PipelineTopology, pipeline_topology
from .roles.process_experts import ProcessExperts, expert_tensor_parallel_size, process_experts, serve_process_experts
from .registry import GroupRegistry, registry_for_world
from .spec import DEFAULT_ORDER, MESH_DIMS, MeshSpec, MeshSpecError
from .roles.tensor_parallel import AutoTPGroups, autotp_groups, init_autotp
from .torch_compat import UnsupportedTorchError

__all__ = [
    "AbsentRanksError",
    "DEFAULT_ORDER",
    "MESH_DIMS",
    "DeepSpeedDeviceMesh",
    "ExpertGroups",
    "ExpertGroupsNotBuilt",
    "expert_groups_name",
    "GroupRegistry",
    "HpzGroupError",
    "MeshLayout",
    "MeshSpec",
    "MeshSpecError",
    "MpuMesh",
    "UnsupportedTorchError",
    "PipelineTopology",
    "ProcessExperts",
    "current_mesh",
    "default_mesh",
    "expert_tensor_parallel_size",
    "mesh_of",
    "model_mesh",
    "pipeline_topology",
    "release_hpz_groups",
    "process_experts",
    "registry_for_world",
    "serve_process_experts",
    "set_default_mesh",
    "spec_from_config",
    "use_mesh",
    "AutoTPGroups",
    "autotp_groups",
    "init_autotp",
    "model_parallel_world_size",
    "all_to_all_groups",
    "local_all_to_all_groups",
]
