"""libcst codemods that rewrite legacy DeepSpeed process-group call sites to the mesh API.

Run ``ds-migrate PATH...`` (``python -m codemods.migrate``). Each rule is its own codemod command
(usable with ``python -m libcst.tool codemod`` too), applied in this order by
:func:`pipeline.migrate_code` (:data:`pipeline.CODEMODS`):

- :class:`~codemods.groups_getters.GroupsGettersCommand` — ``deepspeed.utils.groups`` functions;
- :class:`~codemods.grid_internal.GridInternalCommand` — a pipeline engine's grid inside DeepSpeed;
- :class:`~codemods.grid_users.GridUsersCommand` — a pipeline engine's grid in user code;
- :class:`~codemods.topology.TopologyCommand` — ``PipelineParallelGrid`` / topology construction;
- :class:`~codemods.initialize.InitializeCommand` — ``deepspeed.initialize(mpu=, mesh_param=)``;
- :class:`~codemods.mpu_internal.MpuInternalCommand` — ``mpu.get_*()`` / ``bwc_*(mpu)`` inside DeepSpeed;
- :class:`~codemods.mpu_calls.MpuCallsCommand` — calls on an ``mpu`` passed to ``deepspeed.initialize``;
- :class:`~codemods.legacy_imports.LegacyImportsCommand` — drop unused legacy imports;

and, with ``--comm-to-torch``, :class:`~codemods.comm_to_torch.CommToTorchCommand`. The engine
around them: :mod:`~codemods.pipeline` (the order, one file), :mod:`~codemods.runner` (files, jobs,
reports), :mod:`~codemods.metadata` / :mod:`~codemods.walk` (lazy, pruned libcst metadata),
:mod:`~codemods.chunks` (a big file a group of top-level definitions at a time, where that gives the
whole-file path's bytes), :mod:`~codemods.cache` (``--check`` / rerun cache). The rewrite templates
and the ``TODOV1`` advice come from the catalog of legacy APIs (:mod:`ds_mesh_advice`), which
``ds-migrate --explain <code>`` prints.

The codemods only write code that references ``mesh_core``; they import neither it nor deepspeed.
"""
from .rules.groups_getters import GroupsGettersCommand
from .rules.initialize import InitializeCommand
from .rules.legacy_imports import LegacyImportsCommand
from .rules.mpu_calls import MpuCallsCommand
from ._engine.pipeline import CODEMODS, Migration, migrate_code
from .rules.topology import TopologyCommand

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
