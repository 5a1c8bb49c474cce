"""Expert facts a runtime keeps once per process, served to every mesh.

DeepSpeed's MoE layers name their expert groups per *process* (``"ep_size_N"``: every layer, model
and engine of the process shares one name-keyed table) and record one expert tensor-parallel size
per process (the TP size of the expert-TP groups built last; MoE gating reads it with no mesh at
hand, even before ``torch.distributed`` is initialised). Code that reads those facts through a mesh
(``expert_groups_named(current_mesh(), name)``) must see them whichever mesh is current: an engine's,
the default, or the world mesh.

So a runtime that builds groups under those names (the compat layer, for DeepSpeed's builders)
serves them here with :func:`serve_process_experts`; this is one explicit, opt-in pointer (held by
:data:`mesh_core.roles.state.PROCESS_ROLES`) (like :func:`mesh_core.set_default_mesh`), None unless a runtime set it. Every
:class:`~mesh_core.DeepSpeedDeviceMesh` serves the names of that source before its own
(:func:`mesh_core.runtime_hooks.expert_groups_named`), and :func:`expert_tensor_parallel_size`
answers its size. Without a source a mesh serves only the groups registered on it, and the expert
tensor-parallel size is 1 (experts are not tensor-parallel).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Mapping, Optional

from .state import PROCESS_ROLES, ProcessExperts

if TYPE_CHECKING:
    from ..expert_table import ExpertGroups


def serve_process_experts(source: Optional[ProcessExperts]) -> None:
    """Serve ``source``'s expert groups and expert tensor-parallel size to every mesh (None: stop)."""
    if source is not None and not all(
        callable(getattr(source, name, None)) for name in ("named_expert_groups", "expert_tensor_parallel_size")
    ):
        raise TypeError(
            f"a process experts source has named_expert_groups() and expert_tensor_parallel_size(), got {source!r}"
        )
    PROCESS_ROLES.experts = source


def process_experts() -> Optional[ProcessExperts]:
    """The source set by :func:`serve_process_experts` (None if none is)."""
    return PROCESS_ROLES.experts


def process_expert_groups() -> Optional[Mapping[str, "ExpertGroups"]]:
    """The served name-keyed expert groups (None when no runtime serves any)."""
    source = PROCESS_ROLES.experts
    return None if source is None else source.named_expert_groups()


def expert_tensor_parallel_size() -> int:
    """How many ranks each expert is tensor-parallel over in this process: the served size (DeepSpeed's
    ``_get_expert_model_parallel_world_size()``: the TP size of the expert-TP groups built last, 1 once
    released), or 1 when no runtime serves one. Needs no mesh and no initialised process group."""
    source = PROCESS_ROLES.experts
    return 1 if source is None else int(source.expert_tensor_parallel_size())
