"""The one owner of DeepSpeed's process-wide roles state: :data:`PROCESS_ROLES`.

Legacy DeepSpeed keeps its roles in process globals that code with no engine or mesh at hand reads
(``deepspeed.utils.groups``: the AutoTP groups, the node all-to-all dict, the hpZ group; MoE's
name-keyed expert table). The mesh keeps no global state of its own; these roles are the exception,
and all of them live in one object, :class:`ProcessRoles`, so there is one place to read, reset and
reason about them:

- ``autotp`` (:class:`AutoTPGroups`) and ``all_to_all`` (a dict): one object each for the life of
  the process — legacy callers hold them, so a runtime empties them *in place* at world teardown
  (``AutoTPGroups.reset()``, ``dict.clear()``), never replaces them;
- ``experts``: the runtime that serves DeepSpeed's expert table and expert-TP size
  (:func:`mesh_core.runtime_hooks.serve_process_experts`); None unless one is served; may be set before
  ``torch.distributed`` is initialised;
- hpZ groups: per world and ZeRO domain (:meth:`ProcessRoles.hpz_store`), keyed weakly by the
  world's :class:`~mesh_core.runtime_hooks.GroupRegistry`, so a new world starts empty and a dead world's entries
  go with it; :func:`mesh_core.runtime_hooks.release_hpz_groups` drops them explicitly.

Lifetime: :data:`PROCESS_ROLES` is created when :mod:`mesh_core` is imported and lives as long as the
process (one object per process; its per-world part is the hpZ store). The role modules
(:mod:`~mesh_core.roles.tensor_parallel`, :mod:`~mesh_core.roles.node_groups`, :mod:`~mesh_core.roles.process_experts`,
:mod:`~mesh_core.roles.hpz`) read and fill it; nothing else holds roles state.
"""

from __future__ import annotations

import logging
import weakref
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, Mapping, Optional, Protocol

import torch.distributed as dist

from ..registry import GroupRegistry, registry_for_world

if TYPE_CHECKING:
    from ..device_mesh import DeepSpeedDeviceMesh


class ProcessExperts(Protocol):
    """What a runtime serves: its live name-keyed expert groups and its expert tensor-parallel size
    (:func:`mesh_core.roles.process_experts.serve_process_experts`)."""

    def named_expert_groups(self) -> Mapping[str, Any]: ...

    def expert_tensor_parallel_size(self) -> int: ...


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
        self.tp_size, self.tp_rank = mesh.size(tp_dims), mesh.get_local_rank(tp_dims)
        self.tp_src = min(mesh.get_group_ranks(tp_dims))
        self.dp_size, self.dp_rank = mesh.size(dp_dims), mesh.get_local_rank(dp_dims)

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


@dataclass
class ProcessRoles:
    """DeepSpeed's process-wide roles state (see the module docstring for each part's lifetime)."""

    autotp: AutoTPGroups = field(default_factory=AutoTPGroups)
    all_to_all: dict[str, Any] = field(default_factory=dict)
    experts: Optional["ProcessExperts"] = None
    hpz_by_world: "weakref.WeakKeyDictionary[GroupRegistry, dict[Any, Any]]" = field(
        default_factory=weakref.WeakKeyDictionary
    )

    def hpz_store(self) -> dict[Any, Any]:
        """The current world's hpZ groups by ZeRO domain (created empty on first use)."""
        registry = registry_for_world()
        store = self.hpz_by_world.get(registry)
        if store is None:
            store = self.hpz_by_world[registry] = {}
        return store


PROCESS_ROLES = ProcessRoles()
"""The process's one :class:`ProcessRoles` (never replaced)."""
