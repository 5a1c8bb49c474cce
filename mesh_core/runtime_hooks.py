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
  and the model-parallel world size of an mpu-backed mesh.

Users build and query meshes through :mod:`mesh_core`'s own names; these are for the runtime.
"""
from __future__ import annotations

from .expert_table import ExpertGroupsNotBuilt, expert_groups_name
from .registry import GroupRegistry, registry_for_world
from .roles.hpz import (
    HpzGroupError,
    create_hpz_group,
    hpz_group,
    hpz_group_rank,
    hpz_group_ranks,
    hpz_group_size,
    release_hpz_groups,
)
from .roles.mpu_mesh import MpuMesh, model_parallel_world_size
from .roles.named_experts import (
    expert_group_names,
    expert_groups_named,
    largest_expert_groups_name,
    named_expert_data_parallel_groups,
    named_expert_parallel_groups,
    register_expert_groups,
)
from .roles.node_groups import all_to_all_groups, local_all_to_all_groups
from .roles.pipe_topology import PipelineTopology
from .roles.process_experts import ProcessExperts, expert_tensor_parallel_size, process_experts, serve_process_experts
from .roles.tensor_parallel import AutoTPGroups, autotp_groups, init_autotp

__all__ = [
    "AutoTPGroups",
    "ExpertGroupsNotBuilt",
    "GroupRegistry",
    "HpzGroupError",
    "MpuMesh",
    "PipelineTopology",
    "ProcessExperts",
    "all_to_all_groups",
    "autotp_groups",
    "create_hpz_group",
    "expert_group_names",
    "expert_groups_name",
    "expert_groups_named",
    "expert_tensor_parallel_size",
    "hpz_group",
    "hpz_group_rank",
    "hpz_group_ranks",
    "hpz_group_size",
    "init_autotp",
    "largest_expert_groups_name",
    "local_all_to_all_groups",
    "model_parallel_world_size",
    "named_expert_data_parallel_groups",
    "named_expert_parallel_groups",
    "process_experts",
    "register_expert_groups",
    "registry_for_world",
    "release_hpz_groups",
    "serve_process_experts",
]
