"""One DeviceMesh-based process-group layout per model: DP (or HSDP), TP, PP, SP and EP.

- :class:`MeshSpec` — a frozen, validated layout description (pure data);
- :class:`MeshLayout` — rank ↔ coordinate and group math over a spec, no torch.distributed;
- :class:`DeepSpeedDeviceMesh` — the process groups, on top of ``torch.distributed.DeviceMesh``;
- :func:`spec_from_config` — a spec from a DeepSpeed config (``"mesh"`` section or legacy keys).
"""
import importlib
from typing import Any

# public name -> the module defining it; each loads on first use (PEP 562), so `import mesh_core`
# (and `mesh --help`, `mesh show`) imports no torch until a name that needs it is used
_HOME: dict[str, str] = {
    "AbsentRanksError": ".absence",
    "UnsupportedTorchError": ".torch_compat",
    "spec_from_config": ".config",
    "current_mesh": ".roles.current",
    "model_mesh": ".roles.current",
    "default_mesh": ".roles.default",
    "set_default_mesh": ".roles.default",
    "use_mesh": ".roles.default",
    "DeepSpeedDeviceMesh": ".device_mesh",
    "ExpertGroups": ".device_mesh",
    "ExpertGroupsNotBuilt": ".device_mesh",
    "expert_groups_name": ".device_mesh",
    "HpzGroupError": ".roles.hpz",
    "release_hpz_groups": ".roles.hpz",
    "MeshLayout": ".layout",
    "MpuMesh": ".roles.mpu_mesh",
    "mesh_of": ".roles.mpu_mesh",
    "model_parallel_world_size": ".roles.mpu_mesh",
    "all_to_all_groups": ".roles.node_groups",
    "local_all_to_all_groups": ".roles.node_groups",
    "PipelineTopology": ".roles.pipe_topology",
    "pipeline_topology": ".roles.pipe_topology",
    "ProcessExperts": ".roles.process_experts",
    "expert_tensor_parallel_size": ".roles.process_experts",
    "process_experts": ".roles.process_experts",
    "serve_process_experts": ".roles.process_experts",
    "GroupRegistry": ".registry",
    "registry_for_world": ".registry",
    "DEFAULT_ORDER": ".spec",
    "MESH_DIMS": ".spec",
    "MeshSpec": ".spec",
    "MeshSpecError": ".spec",
    "AutoTPGroups": ".roles.tensor_parallel",
    "autotp_groups": ".roles.tensor_parallel",
    "init_autotp": ".roles.tensor_parallel",
}


def __getattr__(name: str) -> Any:
    """Load a public name (or a submodule) on first use; torch is imported only then."""
    home = _HOME.get(name)
    if home is not None:
        value = getattr(importlib.import_module(home, __name__), name)
    else:
        try:
            value = importlib.import_module(f".{name}", __name__)
        except ModuleNotFoundError as err:
            if err.name != f"{__name__}.{name}":
                raise
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


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
