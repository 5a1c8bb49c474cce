"""Expert tensor parallelism moved whole: ``groups._create_expert_data_and_model_parallel(N, mpu=grid)``,
its readers and the grid they read, onto one mesh.

Legacy builds a file's expert-TP groups from the sizes of the grid passed as ``mpu=`` (world,
tensor, pipeline: ``groups._get_expert_parallel_ranks``) into one name-keyed table. The mesh the
topology codemod makes of that grid (``DeepSpeedDeviceMesh.build(pp=, dp=, tp=)``) builds the same
groups with ``<grid>.expert_groups(N)`` (same members, every size and order: compared with deepspeed
0.19.8 in tests/codemods/test_codemods_expert_grid.py), and its own table serves them by name. So
in a file (outside DeepSpeed) whose expert builders all take ``mpu=<grid>``, the groups codemod
(:class:`codemods.rules.groups_getters.GroupsGettersCommand`) moves every expert site, or none:

- the builders become ``<grid>.expert_groups(N)``, the readers ``<grid>.expert_groups(N).ep_group``
  etc. (a literal ``"ep_size_N"`` / ``f"ep_size_{n}"``) or ``expert_groups_named(<grid>, name)``
  (any other name), when the topology codemod will turn the grid into a mesh (asked of its own
  planning, :class:`codemods.rules._grid_plan.GridPlan`) and every other condition of the file
  holds (:meth:`ExpertGrid.blocker`);
- else each site keeps its code with a ``TODOV1`` naming the one thing that blocks the move;
- the topology codemod then converts the grid (``<grid>.expert_groups`` is a mesh use of it).
"""

from __future__ import annotations

from typing import Mapping, Optional

import libcst as cst
from libcst.codemod.visitors import AddImportsVisitor

from .._engine import legacy_names as ln
from .._engine.base import MigrationCommand, arg_by, fill_hooks, has_star_args
from ._grid_plan import EXPERT_TP_BUILDER as BUILDER
from ._grid_plan import GridPlan, code

PLAIN_BUILDER = "_create_expert_and_data_parallel"
# the expert TP size the builder records
TP_SIZE = "_get_expert_model_parallel_world_size"
NEXT_STEP = 'use "mesh": {"tp": T, "ep": N} (or the grid as DeepSpeedDeviceMesh.build(pp=P, dp=D, tp=T)) and <mesh>.expert_groups(N)'


def expert_size(call: cst.Call) -> Optional[cst.BaseExpression]:
    """N of a literal ``"ep_size_N"`` or ``f"ep_size_{N}"`` group-name argument, else None."""
    arg = arg_by(call, 0, "group_name")
    if arg is None or len(call.args) != 1:
        return None
    value = arg.value
    if isinstance(value, cst.SimpleString):
        text = value.evaluated_value
        if isinstance(text, str) and text.startswith("ep_size_") and text[8:].isdigit():
            return cst.Integer(str(int(text[8:])))
    if isinstance(value, cst.FormattedString) and len(value.parts) == 2:
        head, expr = value.parts
        if (
            isinstance(head, cst.FormattedStringText)
            and head.value == "ep_size_"
            and isinstance(expr, cst.FormattedStringExpression)
            and expr.conversion is None
            and expr.format_spec is None
        ):
            return expr.expression
    return None


def builder_stuck(command: MigrationCommand, call: cst.Call) -> str:
    """Why this expert-TP builder call has no mesh form by itself ("": it has one)."""
    if not isinstance(command.parent(call), cst.Expr):
        return "its result is used"
    if has_star_args(call):
        return "it takes *args"
    ep, mpu = arg_by(call, 0, "expert_parallel_size_"), arg_by(call, 1, "mpu")
    dbe = arg_by(call, 2, "use_data_before_expert_parallel_")
    if ep is None or mpu is None or len(call.args) != 2 + (dbe is not None):
        return "it has other arguments"
    if dbe is not None and not (isinstance(dbe.value, cst.Name) and dbe.value.value == "False"):
        return "use_data_before_expert_parallel_ is a mesh option (DeepSpeedDeviceMesh.build(..., data_before_expert=True))"
    if not isinstance(mpu.value, cst.Name) or mpu.value.value == "None":
        return f"mpu={code(mpu.value)} is not a name"
    return ""


class ExpertGrid:
    """One file's expert sites over a grid, for the groups codemod ``command`` (its ``function_of``,
    ``_calls``, ``_replace``), with its templates: ``expert`` (readers of ``"ep_size_N"``, ``{mesh}``
    / ``{n}``), ``named_expert`` (readers of any name, ``{name}``), ``named_no_args`` (the table's
    readers), ``manual`` (expert sites with no mesh form)."""

    def __init__(
        self,
        command,
        expert: Mapping[str, str],
        named_expert: Mapping[str, str],
        named_no_args: Mapping[str, str],
        manual: frozenset,
    ) -> None:
        self.command = command
        self.expert, self.named_expert, self.named_no_args, self.manual = expert, named_expert, named_no_args, manual
        # expert sites with no literal size that the grid's mesh serves by name (its own table holds
        # every size this file's builders build)
        self.named_here = frozenset(named_no_args) | {TP_SIZE}
        self.grid: Optional[str] = None

    def blocker(self, module: cst.Module, related: frozenset) -> Optional[str]:
        """Why this file's expert sites (``related`` functions) stay as they are (None: they move onto the grid)."""
        c = self.command
        named = [(call, c.function_of(call.func)) for call in c._calls if c.could_be(call.func, related)]
        named = [(call, f) for call, f in named if f is not None]
        grids: dict[str, cst.Name] = {}
        for call, fname in named:
            caught = c._caught_legacy_exception(call)
            if caught is not None:
                return f"groups.{fname} is inside try/except {caught} (code may wait for the legacy exception)"
            if has_star_args(call):
                return f"groups.{fname}(*args)"
            if fname == PLAIN_BUILDER:
                return (
                    f"groups.{PLAIN_BUILDER} (line {c.line_of(call)}) builds expert groups over the world "
                    "without the grid's TP, which no mesh of the grid gives"
                )
            if fname == BUILDER:
                stuck = builder_stuck(c, call)
                if stuck:
                    return f"groups.{BUILDER} (line {c.line_of(call)}): {stuck}"
                grid = arg_by(call, 1, "mpu").value  # type: ignore[union-attr]
                grids.setdefault(grid.value, grid)  # type: ignore[union-attr]
            elif fname in self.manual and fname not in self.named_here:
                return f"groups.{fname} has no mesh equivalent"
            elif fname in self.named_expert and expert_size(call) is None and len(call.args) != 1:
                return f"groups.{fname} takes other arguments than a group name"
            elif fname in self.named_here and call.args:
                return f"groups.{fname} takes arguments"
        if len(grids) != 1:
            return "the expert-TP builders take different mpu= values: " + ", ".join(sorted(grids))
        name, node = next(iter(grids.items()))
        binding = self._grid_binding(node)
        if isinstance(binding, str):
            return binding
        plan = GridPlan(c, expert_mpu_is_mesh_use=True).plan(module)
        if id(binding) not in plan.converted_grids:
            why = plan.kept_grids.get(id(binding), "it is not bound to a local variable")
            return f"the grid {name} passed as mpu= is kept as a grid ({why})"
        for call, fname in named:
            scope = c.scope_of(call)
            if scope is None or self._single(scope, name) is not self._single(c.scope_of(node), name):
                return f"groups.{fname} (line {c.line_of(call)}) does not see the grid {name}"
        self.grid = name
        return None

    @staticmethod
    def _single(scope, name: str):
        try:
            found = list(scope[name])
        except (KeyError, TypeError):
            return None
        return found[0] if len(found) == 1 else None

    def _grid_binding(self, node: cst.Name):
        """The ``PipelineParallelGrid(...)`` call bound once to ``node``'s name, or why there is none."""
        c = self.command
        scope = c.scope_of(node)
        assignment = self._single(scope, node.value) if scope is not None else None
        target = getattr(assignment, "node", None)
        assign = c.top_level_assign(target, assignment.scope) if isinstance(target, cst.Name) else None
        value = assign.value if assign is not None else None
        if not (isinstance(value, cst.Call) and c.legacy_name(value.func, {ln.GRID})):
            return (
                f"mpu={node.value} is not a PipelineParallelGrid bound once in this file (keep the mesh of "
                f"DeepSpeedDeviceMesh.from_mpu({node.value}) and call its .expert_groups(N))"
            )
        return value

    def moved(self, call: cst.Call, updated: cst.Call, fname: str) -> cst.BaseExpression:
        """``call`` (of ``groups.<fname>``) on the grid's mesh (:meth:`blocker` said they move)."""
        c, grid = self.command, self.grid
        if fname == BUILDER:
            return c._replace(call, f"{grid}.expert_groups({code(arg_by(call, 0, 'expert_parallel_size_').value)})")
        if fname == TP_SIZE:
            return c._replace(call, f'{grid}.size("tp")')
        if fname in self.named_no_args:
            return c._replace(call, fill_hooks(self.named_no_args[fname], c.mesh_ref, mesh=grid))
        size = expert_size(call)
        if fname in self.expert and size is not None:
            return c._replace(call, self.expert[fname].format(mesh=grid, n=code(size)))
        arg = arg_by(updated, 0, "group_name")
        if "torch.distributed" in self.named_expert[fname]:
            AddImportsVisitor.add_needed_import(c.context, "torch.distributed")
        return c._replace(call, fill_hooks(self.named_expert[fname], c.mesh_ref, mesh=grid, name=code(arg.value)))
