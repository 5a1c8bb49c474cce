"""libcst codemods that rewrite legacy DeepSpeed process-group call sites to the mesh API.

Run ``ds-migrate PATH...`` (``python -m codemods.migrate``), or :func:`migrate_code` on one file's
source (a :class:`~codemods._engine.pipeline.Migration`: the new code and its counts). The package is split by role, as libcst's own ``codemod`` package is: this module and
:mod:`codemods.migrate` (the CLI) are the faces; ``codemods/_engine/`` is private; the rules are
``codemods/rules/``, one module per codemod command (each usable alone with ``python -m
libcst.tool codemod -x codemods.rules.<rule>.<Command>``), a rule's helpers underscore modules
beside it. :data:`CODEMODS` applies them in this order:

- :class:`~codemods.rules.groups_getters.GroupsGettersCommand` — ``deepspeed.utils.groups`` functions;
- :class:`~codemods.rules.grid_internal.GridInternalCommand` — a pipeline engine's grid inside DeepSpeed;
- :class:`~codemods.rules.grid_users.GridUsersCommand` — a pipeline engine's grid in user code;
- :class:`~codemods.rules.topology.TopologyCommand` — ``PipelineParallelGrid`` / topology construction;
- :class:`~codemods.rules.initialize.InitializeCommand` — ``deepspeed.initialize(mpu=, mesh_param=)``;
- :class:`~codemods.rules.mpu_internal.MpuInternalCommand` — ``mpu.get_*()`` / ``bwc_*(mpu)`` inside DeepSpeed;
- :class:`~codemods.rules.mpu_calls.MpuCallsCommand` — calls on an ``mpu`` passed to ``deepspeed.initialize``;
- :class:`~codemods.rules.legacy_imports.LegacyImportsCommand` — drop unused legacy imports;

and, with ``--comm-to-torch``, :class:`~codemods.rules.comm_to_torch.CommToTorchCommand`. The engine
around them (``codemods._engine``): ``pipeline`` (the order on one file, and the passes after the
rules: added imports placed, the mesh runtime activated, ``TODOV1`` comments placed), ``runner``
(files, jobs, reports), ``metadata`` / ``walk`` (lazy, pruned libcst metadata), ``chunks`` (a big
file a group of top-level definitions at a time, where that gives the whole-file path's bytes),
``cache`` (``--check`` / rerun cache), ``base`` (the rules' base class; ``realign`` keeps continuation
lines aligned with a bracket a rewrite moved), ``import_place`` (added imports where isort would put
them), ``todo_wrap`` (``TODOV1`` comments within 100 characters) and ``libcst_private`` (every
private libcst name the codemods use). The engine imports a rule only in ``pipeline``'s list. The
rewrite templates and the ``TODOV1`` advice come from the catalog of legacy APIs
(:mod:`ds_mesh_advice`), which ``ds-migrate --explain <code>`` prints.

The codemods only write code that references ``mesh_core``; they import neither it nor deepspeed.
"""

from ._engine.pipeline import CODEMODS, Migration, migrate_code
from .rules.groups_getters import GroupsGettersCommand
from .rules.initialize import InitializeCommand
from .rules.legacy_imports import LegacyImportsCommand
from .rules.mpu_calls import MpuCallsCommand
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
