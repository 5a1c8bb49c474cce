"""What the DeepSpeed runtime (the shim in :mod:`compat`, or DeepSpeed's own code after the
codemods) uses beside the user API: process-wide roles DeepSpeed keeps in module globals, served
from the mesh.

- the group registry of a world (:func:`registry_for_world`, :class:`GroupRegistry`);
- expert groups by the names MoE layers use and the process-wide expert table
  (:func:`serve_process_experts`, :func:`process_experts`, :func:`expert_tensor_parallel_size`,
  :func:`expert_groups_name`, and the name-keyed functions of :mod:`mesh_core.roles.named_experts`);
- ZeRO++ hpZ groups (:func:`create_hpz_group`, :func:`hpz_group` and friends,
  :func:`release_hpz_groups`);
- AutoTP's groups (:func:`init_autotp`, :func:`autotp_groups`), the node-local all-to-all groups
  and the model-parallel world size of an mpu-backed mesh;
- for the shim: the default mesh's context (:data:`DEFAULT_MESH`, :func:`enter_default_mesh`,
  :func:`leave_default_mesh`), a config's layout sources (:func:`layout_sources`,
  :data:`SECTION_SOURCE`, :func:`autotp_off`), an mpu's spec (:func:`mpu_spec`), the HSDP test
  (:func:`is_hsdp`, :data:`HPZ_DIMS`, :func:`hpz_rank_lists`), the legacy errors DeepSpeed raises
  (:class:`NoSequenceParallelGroupError`, :class:`NoPipelineGroupError`), the absent-rank hints
  (:func:`add_hint`, :func:`remove_hint`, :func:`announce_builder`, :func:`ranks_text`), the shorter
  wait for ranks that announced nothing (:func:`set_quiet_bound`: the shim's own agreement bound) and
  DeepSpeed's coordinate equality (:func:`exact_int`);
- communicators that step aside (colocated RL): :func:`release_communicators`,
  :func:`resume_communicators`, :class:`ReleaseRecord`, :data:`STEP_ASIDE_ATTR` and the reference
  walk :func:`find_references` that rebinds an engine's groups.

``mesh_core``, this module, :mod:`mesh_core.axis_names` (the dim vocabulary) and
:mod:`mesh_core.torch_compat` (the supported torch range) are the faces ``compat`` imports from;
every other module of ``mesh_core`` is an implementation detail (tests/test_structure.py).

Users build and query meshes through :mod:`mesh_core`'s own names; these are for the runtime.
"""
from __future__ import annotations

from .absence import add_hint, remove_hint, set_quiet_bound
from .config import SECTION_SOURCE, autotp_off, layout_sources
from .consistency import announce_builder
from .expert_table import ExpertGroupsNotBuilt, expert_groups_name
from .registry import GroupRegistry, registry_for_world
from .rebind import find_references
from .rendezvous import ranks_text
from .step_aside import ATTR as STEP_ASIDE_ATTR, ReleaseRecord, release_communicators, resume_communicators
from .roles.default import DEFAULT_MESH, enter_default_mesh, leave_default_mesh
from .roles.from_groups import mpu_spec
from .roles.hpz import (
    HPZ_DIMS,
    HpzGroupError,
    create_hpz_group,
    hpz_group,
    hpz_group_rank,
    hpz_group_ranks,
    hpz_group_size,
    hpz_rank_lists,
    is_hsdp,
    release_hpz_groups,
)
from .roles.legacy_state import NoSequenceParallelGroupError
from .roles.mpu_mesh import MpuMesh, NoPipelineGroupError, model_parallel_world_size
from .roles.named_experts import (
    expert_group_names,
    expert_groups_named,
    largest_expert_groups_name,
    named_expert_data_parallel_groups,
    named_expert_parallel_groups,
    register_expert_groups,
)
from .roles.node_groups import all_to_all_groups, local_all_to_all_groups
from .roles.pipe_topology import PipelineTopology, exact_int
from .roles.process_experts import ProcessExperts, expert_tensor_parallel_size, process_experts, serve_process_experts
from .roles.tensor_parallel import AutoTPGroups, autotp_groups, init_autotp

__all__ = [
    "ReleaseRecord",
    "STEP_ASIDE_ATTR",
    "find_references",
    "release_communicators",
    "resume_communicators",
    "AutoTPGroups",
    "DEFAULT_MESH",
    "ExpertGroupsNotBuilt",
    "GroupRegistry",
    "HPZ_DIMS",
    "HpzGroupError",
    "MpuMesh",
    "NoPipelineGroupError",
    "NoSequenceParallelGroupError",
    "PipelineTopology",
    "ProcessExperts",
    "SECTION_SOURCE",
    "add_hint",
    "all_to_all_groups",
    "announce_builder",
    "autotp_groups",
    "autotp_off",
    "create_hpz_group",
    "enter_default_mesh",
    "exact_int",
    "expert_group_names",
    "expert_groups_name",
    "expert_groups_named",
    "expert_tensor_parallel_size",
    "hpz_group",
    "hpz_group_rank",
    "hpz_group_ranks",
    "hpz_group_size",
    "hpz_rank_lists",
    "init_autotp",
    "is_hsdp",
    "largest_expert_groups_name",
    "layout_sources",
    "leave_default_mesh",
    "local_all_to_all_groups",
    "model_parallel_world_size",
    "mpu_spec",
    "named_expert_data_parallel_groups",
    "named_expert_parallel_groups",
    "process_experts",
    "ranks_text",
    "register_expert_groups",
    "registry_for_world",
    "release_hpz_groups",
    "remove_hint",
    "serve_process_experts",
    "set_quiet_bound",
]
