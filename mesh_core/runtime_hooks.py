"""What the DeepSpeed runtime (the shim in :mod:`compat`, or DeepSpeed's own code after the
codemods) uses beside the user API: process-wide roles DeepSpeed keeps in module globals, served
from the mesh. They take the mesh as their first argument; they are not methods of the mesh.

``mesh_core``, this module, :mod:`mesh_core.axis_names` (the dim vocabulary) and
:mod:`mesh_core.torch_compat` (the supported torch range) are the faces ``compat`` imports from;
every other module of ``mesh_core`` is an implementation detail. Each name below has a user outside
``mesh_core`` ("migrated" = DeepSpeed's code as the codemods rewrite it, ``codemods._engine.base``'s
``RUNTIME_HOOK_NAMES``); tests/test_structure.py holds the count, so a name added here comes with
its line:

- ``registry_for_world`` — compat.groups, .initialize, .topology, .comm_routes, .subworld_pipe
- ``GroupRegistry`` — the type ``registry_for_world`` returns (annotations)
- ``PipelineTopology`` — compat.topology (``ProcessTopology``'s base)
- ``exact_int`` — compat.subworld_pipe (DeepSpeed's coordinate equality)
- ``MpuMesh`` — what ``mesh_of`` gives for a foreign mpu (MIGRATION.md, the catalog)
- ``mpu_spec`` — compat.engine_spec (an mpu's layout)
- ``model_parallel_world_size`` — migrated DeepSpeed
- ``NoPipelineGroupError`` — compat.mpu (DeepSpeed's error for a grid without pipeline groups)
- ``NoSequenceParallelGroupError`` — compat.groups (DeepSpeed's error without SP groups)
- ``DEFAULT_MESH`` — compat.engine_scope (the default mesh's context variable)
- ``enter_default_mesh`` — compat.engine_scope
- ``leave_default_mesh`` — compat.engine_scope
- ``layout_sources`` — compat.engine_spec (a config's layout keys and where each came from)
- ``SECTION_SOURCE`` — compat.engine_spec (the source name of the ``"mesh"`` section)
- ``autotp_off`` — compat.layout_config (``autotp_size`` 0 / 1)
- ``serve_process_experts`` — compat.process_experts (the process-wide expert table)
- ``process_experts`` — compat.process_experts
- ``ProcessExperts`` — the protocol ``serve_process_experts`` takes
- ``expert_tensor_parallel_size`` — migrated DeepSpeed
- ``register_expert_groups`` — compat.groups (the groups legacy builders make)
- ``expert_groups_named`` — migrated DeepSpeed
- ``expert_group_names`` — users of the named views (MIGRATION.md, docs/API.md)
- ``expert_groups_name`` — the name size-N expert groups are registered under (docs/API.md)
- ``largest_expert_groups_name`` — migrated DeepSpeed
- ``named_expert_parallel_groups`` — migrated DeepSpeed
- ``named_expert_data_parallel_groups`` — migrated DeepSpeed
- ``ExpertGroupsNotBuilt`` — what ``expert_groups_named`` raises, caught by name (MIGRATION.md)
- ``create_hpz_group`` — compat.groups, migrated DeepSpeed (ZeRO++ hpZ)
- ``hpz_group`` — compat.groups, migrated DeepSpeed
- ``hpz_group_ranks`` — compat.groups, migrated DeepSpeed
- ``hpz_group_rank`` — migrated DeepSpeed
- ``hpz_group_size`` — migrated DeepSpeed
- ``release_hpz_groups`` — compat.groups
- ``hpz_rank_lists`` — compat.groups
- ``HPZ_DIMS`` — compat.groups, compat.hsdp
- ``is_hsdp`` — compat.groups, .hsdp, .engine_banner (the HSDP test)
- ``HpzGroupError`` — compat.groups
- ``init_autotp`` — compat.groups, migrated DeepSpeed (AutoTP's groups)
- ``autotp_groups`` — compat.groups, migrated DeepSpeed
- ``AutoTPGroups`` — the type ``autotp_groups`` returns
- ``all_to_all_groups`` — compat.groups (the node-local all-to-all groups)
- ``local_all_to_all_groups`` — compat.groups, migrated DeepSpeed
- ``add_hint`` — compat.install (the absent-rank hints)
- ``remove_hint`` — compat.install
- ``announce_builder`` — compat.mixed_world
- ``set_quiet_bound`` — compat.install (the shim's own bound on the wait for a rank off the shim)
- ``ranks_text`` — compat.mixed_world
- ``release_communicators`` — compat.engine_step_aside (colocated RL, docs/colocated.md)
- ``resume_communicators`` — compat.engine_step_aside
- ``ReleaseRecord`` — compat.engine_step_aside (what a release returns)
- ``STEP_ASIDE_ATTR`` — compat.engine_step_aside (the engine attribute holding it)
- ``find_references`` — compat.engine_step_aside (the walk that rebinds an engine's groups)

Users build and query meshes through :mod:`mesh_core`'s own names; these are for the runtime.
"""

from __future__ import annotations

from .absence import add_hint, remove_hint, set_quiet_bound
from .config import SECTION_SOURCE, autotp_off, layout_sources
from .consistency import announce_builder
from .expert_table import ExpertGroupsNotBuilt, expert_groups_name
from .rebind import find_references
from .registry import GroupRegistry, registry_for_world
from .rendezvous import ranks_text
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
from .roles.process_experts import expert_tensor_parallel_size, process_experts, serve_process_experts
from .roles.state import ProcessExperts
from .roles.tensor_parallel import AutoTPGroups, autotp_groups, init_autotp
from .step_aside import ATTR as STEP_ASIDE_ATTR
from .step_aside import ReleaseRecord, release_communicators, resume_communicators

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
