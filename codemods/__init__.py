"""libcst codemods that rewrite legacy DeepSpeed process-group call sites to the mesh API.

Run ``python -m codemods.migrate PATH...``. Each transform is its own codemod command (usable with
``python -m libcst.tool codemod`` too), applied in this order by :func:`pipeline.migrate_code`:

- :class:`~codemods.groups_getters.GroupsGettersCommand` — ``deepspeed.utils.groups`` getters;
- :class:`~codemods.topology.TopologyCommand` — ``PipelineParallelGrid`` / topology construction;
- :class:`~codemods.initialize.InitializeCommand` — ``deepspeed.initialize(mpu=, mesh_param=)``;
- :class:`~codemods.mpu_calls.MpuCallsCommand` — calls on an ``mpu`` passed to ``deepspeed.initialize``;
- :class:`~codemods.legacy_imports.LegacyImportsCommand` — drop unused legacy imports.

A big file is migrated a group of top-level definitions at a time (:mod:`codemods.chunks`) where
that gives the whole-file path's bytes.

The codemods only write code that references ``mesh_core``; they import neither it nor deepspeed.
"""
from .groups_getters import GroupsGettersCommand
from .initialize import InitializeCommand
from .legacy_imports import LegacyImportsCommand
from .mpu_calls import MpuCallsCommand
from .pipeline import CODEMODS, Migration, migrate_code
from .topology import TopologyCommand

__all__ = [
    "CODEMODS",
    "GroupsGettersCommand",
    "InitializeCommand",
    "LegacyImportsCommand",
    "Migration",
    "MpuCallsCommand",
    "TopologyCommand",
    "migrate_code",
]
