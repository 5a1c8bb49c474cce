"""Expert tensor parallelism moved whole: ``groups._create_expert_data_and_model_parallel(N, mpu=grid)``,
its readers and the grid they read, onto one mesh.

Legacy builds a file's expert-TP groups from the sizes of the grid passed as ``mpu=`` (world,
tensor, pipeline: ``groups._get_expert_parallel_ranks``) into one name-keyed table. The mesh the
topology codemod makes of that grid (``DeepSpeedDeviceMesh.build(pp=, dp=, tp=)``) builds the same
groups with ``<grid>.expert_groups(N)`` (same members, every size and order: compared with deepspeed
0.19.8 in tests/codemods/test_codemods_expert_grid.py), and its own table serves them by name. So
in a file (outside DeepSpeed) whose expert builders all take ``mpu=<grid>``:

- :class:`codemods.rules.groups_getters.GroupsGettersCommand` leaves every expert site alone
  (:func:`defers`);
- :class:`ExpertGridCommand` (right before the topology codemod) moves them all, or none: the
  builders become ``<grid>.expert_groups(N)``, the readers ``<grid>.expert_groups(N).ep_group``
  etc. (a literal ``"ep_size_N"`` / ``f"ep_size_{n}"``) or ``expert_groups_named(<grid>, name)``
  (any other name), when the topology codemod will turn the grid into a mesh (asked of its own
  planning, :class:`GridPlanner`) and every other condition of the file holds; else each site
  keeps its code with a ``TODOV1`` naming the one thing that blocks the move;
- the topology codemod then converts the grid (``<grid>.expert_groups`` is a mesh use of it).
"""
from __future__ import annotations

from typing import Optional

import libcst as cst
from libcst.codemod.visitors import AddImportsVisitor

from .._engine import legacy_names as ln
from . import _legacy_state as ls
from .._engine.base import arg_by, fill_hooks, has_star_args
from .groups_getters import (
    EXPERT, EXPERT_MANUAL, EXPERT_RELATED, KIND, NAMED_EXPERT, NAMED_NO_ARGS, GroupsGettersCommand, code, expert_size,
    in_deepspeed,
)
from .topology import TopologyCommand

BUILDER = "_create_expert_data_and_model_parallel"
PLAIN_BUILDER = "_create_expert_and_data_parallel"
# expert sites with no literal size that the grid's mesh serves by name (its own table holds every
# size this file's builders build), and the expert TP size the builder records
NAMED_HERE = frozenset(NAMED_NO_ARGS) | {"_get_expert_model_parallel_world_size"}
TP_SIZE = "_get_expert_model_parallel_world_size"
NEXT_STEP = 'use "mesh": {"tp": T, "ep": N} (or the grid as DeepSpeedDeviceMesh.build(pp=P, dp=D, tp=T)) and <mesh>.expert_groups(N)'


def defers(command: GroupsGettersCommand) -> bool:
    """The groups codemod leaves this file's expert sites to :class:`ExpertGridCommand`
    (:meth:`GroupsGettersCommand._defers_experts`)."""
    return GroupsGettersCommand._defers_experts(command)


def builder_stuck(command: GroupsGettersCommand, call: cst.Call) -> str:
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


class GridPlanner(TopologyCommand):
    """The topology codemod's planning of this file's grids, where ``mpu=<grid>`` of an expert-TP
    builder counts as the mesh use :class:`ExpertGridCommand` makes of it (``<grid>.expert_groups(N)``)."""

    def _plan_use(self, mesh: str, name: cst.CSTNode):
        parent = self.parent(name)
        call = self.parent(parent) if isinstance(parent, cst.Arg) else None
        if isinstance(call, cst.Call) and parent is arg_by(call, 1, "mpu") \
                and f"{ln.GROUPS}.{BUILDER}" in self.legacy_names(call.func):
            return ("expert groups", id(parent)), mesh, False
        return super()._plan_use(mesh, name)


class ExpertGridCommand(GroupsGettersCommand):
    """The expert sites :func:`defers` left: moved onto the grid's mesh together, or kept together."""

    DESCRIPTION = "expert-TP groups over a grid (mpu=grid) and their readers -> <grid>.expert_groups(N)"

    def visit_Module(self, node: cst.Module) -> Optional[bool]:
        self._active = False
        self._grid: Optional[str] = None
        return super().visit_Module(node)  # plans through _expert_blocker / _builder_stuck below

    def _defers_experts(self) -> bool:
        return False

    # --- planning -----------------------------------------------------------------------------
    def _expert_blocker(self, module: cst.Module) -> Optional[str]:
        self._active = defers(self)
        if not self._active:
            return None
        calls = [c for c in self._calls if self.could_be(c.func, EXPERT_RELATED)]
        named = [(c, self.function_of(c.func)) for c in calls]
        named = [(c, f) for c, f in named if f is not None]
        grids: dict[str, cst.Name] = {}
        for call, fname in named:
            caught = self._caught_legacy_exception(call)
            if caught is not None:
                return f"groups.{fname} is inside try/except {caught} (code may wait for the legacy exception)"
            if has_star_args(call):
                return f"groups.{fname}(*args)"
            if fname == PLAIN_BUILDER:
                return (f"groups.{PLAIN_BUILDER} (line {self.line_of(call)}) builds expert groups over the world "
                        "without the grid's TP, which no mesh of the grid gives")
            if fname == BUILDER:
                stuck = builder_stuck(self, call)
                if stuck:
                    return f"groups.{BUILDER} (line {self.line_of(call)}): {stuck}"
                grid = arg_by(call, 1, "mpu").value  # type: ignore[union-attr]
                grids.setdefault(grid.value, grid)  # type: ignore[union-attr]
            elif fname in EXPERT_MANUAL and fname not in NAMED_HERE:
                return f"groups.{fname} has no mesh equivalent"
            elif fname in NAMED_EXPERT and expert_size(call) is None and len(call.args) != 1:
                return f"groups.{fname} takes other arguments than a group name"
            elif fname in NAMED_HERE and call.args:
                return f"groups.{fname} takes arguments"
        if len(grids) != 1:
            return "the expert-TP builders take different mpu= values: " + ", ".join(sorted(grids))
        name, node = next(iter(grids.items()))
        binding = self._grid_binding(node)
        if isinstance(binding, str):
            return binding
        planner = GridPlanner(self.context)
        planner.metadata = self.metadata
        planner.visit_Module(module)
        if id(binding) not in planner._converted_grids:
            why = planner._kept_grids.get(id(binding), "it is not bound to a local variable")
            return f"the grid {name} passed as mpu= is kept as a grid ({why})"
        for call, fname in named:
            scope = self.scope_of(call)
            if scope is None or self._single(scope, name) is not self._single(self.scope_of(node), name):
                return f"groups.{fname} (line {self.line_of(call)}) does not see the grid {name}"
        self._grid = name
        return None

    def _single(self, scope, name: str):
        try:
            found = list(scope[name])
        except (KeyError, TypeError):
            return None
        return found[0] if len(found) == 1 else None

    def _grid_binding(self, node: cst.Name):
        """The ``PipelineParallelGrid(...)`` call bound once to ``node``'s name, or why there is none."""
        scope = self.scope_of(node)
        assignment = self._single(scope, node.value) if scope is not None else None
        target = getattr(assignment, "node", None)
        assign = self.top_level_assign(target, assignment.scope) if isinstance(target, cst.Name) else None
        value = assign.value if assign is not None else None
        if not (isinstance(value, cst.Call) and self.legacy_name(value.func, {ln.GRID})):
            return (f"mpu={node.value} is not a PipelineParallelGrid bound once in this file (keep the mesh of "
                    f"DeepSpeedDeviceMesh.from_mpu({node.value}) and call its .expert_groups(N))")
        return value

    def _builder_stuck(self, call: cst.Call, fname: str) -> str:
        if fname == BUILDER:
            return builder_stuck(self, call)
        return super()._builder_stuck(call, fname)

    # --- the other sites are the groups codemod's ---------------------------------------------
    def visit_ImportFrom(self, node: cst.ImportFrom) -> Optional[bool]:
        return False

    def _check_reference(self, node: cst.BaseExpression) -> None:
        return None

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        if not self._active:
            return updated_node
        fname = self.function_of(original_node.func)
        if fname not in EXPERT_RELATED:
            return updated_node
        if self._held:
            holding = self._held.get(ls.state_of_reader(fname))
            if ls.state_of_builder(fname) in self._held or (holding is not None and holding.holds(fname)):
                return super().leave_Call(original_node, updated_node)  # flagged as the groups codemod does
        if self._experts_blocked:
            self.flag(KIND, f"groups.{fname} kept (all expert sites of this file are): {self._experts_blocked}; "
                      f"to move them together: {NEXT_STEP}")
            return updated_node
        return self._moved(original_node, updated_node, fname)

    def _moved(self, call: cst.Call, updated: cst.Call, fname: str) -> cst.BaseExpression:
        grid = self._grid
        if fname == BUILDER:
            return self._replace(call, f"{grid}.expert_groups({code(arg_by(call, 0, 'expert_parallel_size_').value)})")
        if fname == TP_SIZE:
            return self._replace(call, f'{grid}.size("tp")')
        if fname in NAMED_NO_ARGS:
            return self._replace(call, fill_hooks(NAMED_NO_ARGS[fname], self.mesh_ref, mesh=grid))
        size = expert_size(call)
        if fname in EXPERT and size is not None:
            return self._replace(call, EXPERT[fname].format(mesh=grid, n=code(size)))
        arg = arg_by(updated, 0, "group_name")
        if "torch.distributed" in NAMED_EXPERT[fname]:
            AddImportsVisitor.add_needed_import(self.context, "torch.distributed")
        return self._replace(call, fill_hooks(NAMED_EXPERT[fname], self.mesh_ref, mesh=grid, name=code(arg.value)))

