"""One DeviceMesh-based process-group layout per model: DP (or HSDP), TP, PP, SP and EP.

- :class:`MeshSpec` — a frozen, validated layout description (pure data);
- :class:`MeshLayout` — rank ↔ coordinate and group math over a spec, no torch.distributed;
- :class:`DeepSpeedDeviceMesh` — the process groups, on top of ``torch.distributed.DeviceMesh``;
- :func:`spec_from_config` — a spec from a DeepSpeed config (``"mesh"`` section or legacy keys);
- :class:`ExpertGroups` — one expert-parallel size's groups (``DeepSpeedDeviceMesh.expert_groups``);
- :func:`transfer_weights` — move a model's weights between two layouts;
- the current / default mesh (:func:`current_mesh`, :func:`model_mesh`, :func:`default_mesh`,
  :func:`set_default_mesh`, :func:`use_mesh`), :func:`mesh_of` (the mesh of an mpu or grid) and
  :func:`pipeline_topology` (a ``PipelineModule``'s ``topology=`` in mesh dims);
- the errors :class:`MeshSpecError` and :class:`AbsentRanksError`.

What the DeepSpeed runtime uses beside these (group registries, expert groups by name, hpZ,
AutoTP's groups...) is in :mod:`mesh_core.runtime_hooks`; the dim names (the ``MeshDim`` enum and
the legacy names for them) in :mod:`mesh_core.axis_names`; the supported torch range in
:mod:`mesh_core.torch_compat`. These four modules are the faces other packages import from
(docs/architecture.md); the rest is implementation (the rank ↔ coordinate equation in
:mod:`mesh_core.row_major`, the spec's constants in :mod:`mesh_core.spec`, ...).
"""

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what a type checker reads: the names _HOME loads on first use (a test holds the two equal)
    from . import axis_names as axis_names
    from . import runtime_hooks as runtime_hooks
    from . import torch_compat as torch_compat
    from .absence import AbsentRanksError
    from .config import spec_from_config
    from .device_mesh import DeepSpeedDeviceMesh
    from .expert_table import ExpertGroups
    from .layout import MeshLayout
    from .roles.current import current_mesh, model_mesh
    from .roles.default import default_mesh, set_default_mesh, use_mesh
    from .roles.mpu_mesh import mesh_of
    from .roles.pipe_topology import pipeline_topology
    from .spec import MeshSpec, MeshSpecError
    from .transfer import transfer_weights

# public name -> the module defining it; each loads on first use (PEP 562), so `import mesh_core`
# (and `mesh --help`, `mesh show`) imports no torch until a name that needs it is used
_HOME: dict[str, str] = {
    "AbsentRanksError": ".absence",
    "DeepSpeedDeviceMesh": ".device_mesh",
    "ExpertGroups": ".expert_table",
    "MeshLayout": ".layout",
    "MeshSpec": ".spec",
    "MeshSpecError": ".spec",
    "current_mesh": ".roles.current",
    "default_mesh": ".roles.default",
    "mesh_of": ".roles.mpu_mesh",
    "model_mesh": ".roles.current",
    "pipeline_topology": ".roles.pipe_topology",
    "set_default_mesh": ".roles.default",
    "spec_from_config": ".config",
    "transfer_weights": ".transfer",
    "use_mesh": ".roles.default",
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
