"""The topology codemod's planning of a file's grids (``<name> = PipelineParallelGrid(...)``): which
become ``DeepSpeedDeviceMesh.build(...)``, how each use reads on the mesh, and why the others are kept.

Shared by the topology codemod (:mod:`codemods.rules.topology`, which rewrites what is planned) and
the groups codemod (:mod:`codemods.rules._expert_grid` asks whether an expert-TP builder's
``mpu=<grid>`` will become a mesh before moving its expert groups onto it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import libcst as cst

from .._engine import legacy_names as ln
from .._engine.base import MigrationCommand, arg_by, find_all, has_star_args
from . import _grid_api as grid_api
from . import _mpu_class as mpu_class

DEFAULT_ORDER = ("pp", "dp", "tp")
EXPERT_TP_BUILDER = "_create_expert_data_and_model_parallel"
# mesh_core reads of a mesh's named expert groups (codemods/rules/_expert_grid.py writes them on a grid
# it converts)
EXPERT_MESH_CALLS = frozenset({"expert_groups", "size"})
NAMED_READS = frozenset(
    {
        "expert_groups_named",
        "named_expert_parallel_groups",
        "named_expert_data_parallel_groups",
        "largest_expert_groups_name",
    }
)


@dataclass
class Layout:
    """Mesh dim sizes (as code) in topology axis order."""

    dims: list[tuple[str, str]] = field(default_factory=list)

    def build_args(self) -> list[str]:
        names = [d for d, _ in self.dims]
        args = [f"{d}={size}" for d, size in self.dims]
        if names != [d for d in DEFAULT_ORDER if d in names]:
            args.append("order=[" + ", ".join(f'"{d}"' for d in names) + "]")
        return args


def code(node: cst.CSTNode) -> str:
    return cst.Module([]).code_for_node(node)


def _is_pure(node: cst.BaseExpression) -> bool:
    """Re-evaluating ``node`` has no side effects (a literal or a dotted name)."""
    if isinstance(node, (cst.Integer, cst.Name)):
        return True
    return isinstance(node, cst.Attribute) and _is_pure(node.value)


def topology_layout(kind: str, call: cst.Call) -> Optional[Layout]:
    """The layout a topology construction describes, or None if it cannot be read statically."""
    if has_star_args(call):
        return None
    if kind == ln.PIPE_MODEL_DATA_TOPOLOGY:
        pp, mp, dp = (arg_by(call, i, k) for i, k in enumerate(("num_pp", "num_mp", "num_dp")))
        if None in (pp, mp, dp) or len(call.args) != 3:
            return None
        return Layout([("pp", code(pp.value)), ("dp", code(dp.value)), ("tp", code(mp.value))])
    if kind == ln.PIPE_DATA_TOPOLOGY:
        pp, dp = arg_by(call, 0, "num_pp"), arg_by(call, 1, "num_dp")
        if None in (pp, dp) or len(call.args) != 2:
            return None
        return Layout([("pp", code(pp.value)), ("dp", code(dp.value))])
    if kind == ln.PROCESS_TOPOLOGY:
        axes, dims = arg_by(call, 0, "axes"), arg_by(call, 1, "dims")
        if axes is None or dims is None or len(call.args) != 2:
            return None
        if not isinstance(axes.value, cst.List) or not isinstance(dims.value, cst.List):
            return None
        names = []
        for element in axes.value.elements:
            value = element.value
            if not isinstance(value, cst.SimpleString) or value.evaluated_value not in grid_api.AXIS_TO_DIM:
                return None
            names.append(grid_api.AXIS_TO_DIM[value.evaluated_value])
        sizes = [e.value for e in dims.value.elements]
        if len(sizes) != len(names) or any(isinstance(e, cst.StarredElement) for e in dims.value.elements):
            return None
        return Layout([(n, code(s)) for n, s in zip(names, sizes)])
    return None


class GridPlan:
    """One file's grid plan, made with ``command``'s metadata (parents, scopes, qualified names).

    ``expert_mpu_is_mesh_use``: ``mpu=<grid>`` of ``groups._create_expert_data_and_model_parallel``
    counts as a mesh use (what :mod:`codemods.rules._expert_grid` makes of it: ``<grid>.expert_groups(N)``)."""

    def __init__(self, command: MigrationCommand, expert_mpu_is_mesh_use: bool = False) -> None:
        self.command = command
        self.expert_mpu_is_mesh_use = expert_mpu_is_mesh_use
        self.replacements: dict[int, str] = {}  # id(node) -> the mesh name (or, for the grid, its build arguments)
        self.converted_grids: set[int] = set()
        self.kept_grids: dict[int, str] = {}
        self.used_topologies: set[int] = set()
        self.kept_topologies: set[int] = set()  # read by a converted grid, but also used elsewhere
        self.removed_statements: set[int] = set()
        self.wrappers: dict = {}

    def plan(self, module: cst.Module) -> "GridPlan":
        """Plan every grid of ``module``; a grid kept while read as a mesh raises ValueError (the file fails whole)."""
        self.wrappers = mpu_class.module_wrappers(module)
        for assign in find_all(module, cst.Assign):
            if (
                isinstance(assign.value, cst.Call)
                and self.command.could_be(assign.value.func, {"PipelineParallelGrid"})
                and self.command.legacy_name(assign.value.func, {ln.GRID})
            ):
                reason = self._plan_grid(assign)
                if reason is not None:
                    self.kept_grids[id(assign.value)] = reason
                    self._check_no_mesh_use(assign, reason)
        return self

    def _plan_grid(self, assign: cst.Assign) -> Optional[str]:
        """Plan the conversion of ``<name> = PipelineParallelGrid(...)``; the reason it cannot be, or None."""
        call: cst.Call = assign.value  # type: ignore[assignment]
        if len(assign.targets) != 1 or not isinstance(assign.targets[0].target, cst.Name):
            return "the grid is not bound to a single local name"
        target: cst.Name = assign.targets[0].target
        scope = self.command.scope_of(target)
        if scope is None or self.command.top_level_assign(target, scope) is not assign:
            return "the grid is not assigned at the top level of its scope"
        bindings = scope.assignments[target.value]
        if len(bindings) != 1:
            return f"{target.value} is assigned more than once"
        topo_arg = arg_by(call, 0, "topology")
        if topo_arg is None or has_star_args(call):
            return "the grid has no explicit topology (the default deals the world's prime factors to pp and dp)"
        layout, topo_statement, topo_call = self._resolve_topology(topo_arg.value, scope)
        if layout is None:
            return "its topology cannot be read statically"
        mesh = target.value
        uses: dict[int, str] = {}
        needs_pp_tp = mpu_use = False
        references = sorted(next(iter(bindings)).references, key=lambda a: self.command.position(a.node))
        for access in references:
            if self._handed_to_mpu_class(access.node):
                continue  # the class queries it through mesh_of (codemods.rules.grid_users): a mesh answers alike
            planned = self._plan_use(mesh, access.node)
            if planned is None:
                parent = self.command.parent(access.node)
                if isinstance(parent, cst.Arg) and parent.keyword is not None and parent.keyword.value == "mpu":
                    return f"mpu={mesh} needs a config dict the initialize codemod can add the layout to"
                use = parent if isinstance(parent, cst.Attribute) else access.node
                return f"{code(use)} has no mesh equivalent"
            key, replacement, pp_tp = planned
            needs_pp_tp |= pp_tp
            mpu_use |= key is None
            if key is not None:
                uses[key] = replacement
        if mpu_use and not all(_is_pure(cst.parse_expression(size)) for _, size in layout.dims):
            return "the grid is passed as mpu= but its sizes are not plain names or literals"
        args = layout.build_args()
        if needs_pp_tp:
            args.append('flatten=[("pp", "tp")]')
        self.replacements[id(call)] = ", ".join(args)  # of DeepSpeedDeviceMesh.build
        self.replacements.update(uses)
        self.converted_grids.add(id(call))
        if topo_statement is not None:
            self.removed_statements.add(id(topo_statement))
        elif isinstance(topo_arg.value, cst.Name):
            self.kept_topologies.add(id(topo_call))  # still used elsewhere: flagged like in a rerun
        return None

    def _handed_to_mpu_class(self, name: cst.CSTNode) -> bool:
        """``name`` is the grid argument of ``C(...)``, ``C`` a hand-written mpu class over a grid
        (:mod:`codemods.rules._mpu_class`) whose every instance gets a local grid."""
        arg = self.command.parent(name)
        call = self.command.parent(arg) if isinstance(arg, cst.Arg) else None
        if not (isinstance(call, cst.Call) and isinstance(call.func, cst.Name) and call.func.value in self.wrappers):
            return False
        wrapper = self.wrappers[call.func.value]
        if not any(mpu_class.grid_argument(wrapper, call, attr) is name for attr in wrapper.params):
            return False
        return mpu_class.instances_get_grids(self.command, wrapper, self._local_grid)

    def _local_grid(self, name: cst.Name) -> bool:
        value = self.command.bound_value(name)
        return isinstance(value, cst.Call) and ln.GRID in self.command.legacy_names(value.func)

    def _check_no_mesh_use(self, assign: cst.Assign, reason: str) -> None:
        """A grid kept here must not be read as a mesh (what codemods/rules/_expert_grid.py writes where it
        planned the grid to become one): the file then fails whole (left as it is), never half migrated."""
        target = assign.targets[0].target if len(assign.targets) == 1 else None
        scope = self.command.scope_of(target) if isinstance(target, cst.Name) else None
        if scope is None:
            return
        for binding in scope.assignments[target.value]:
            for access in binding.references:
                parent = self.command.parent(access.node)
                if (
                    isinstance(parent, cst.Attribute)
                    and parent.value is access.node
                    and parent.attr.value == "expert_groups"
                ) or (isinstance(parent, cst.Arg) and self._reads_mesh_by_name(parent)):
                    raise ValueError(f"the grid {target.value} is read as a mesh (expert groups) but kept: {reason}")

    def _resolve_topology(self, value: cst.BaseExpression, scope):
        """(layout, the topology's statement to drop or None, the topology call) of a grid's
        topology argument."""
        if isinstance(value, cst.Call):
            kind = self.command.legacy_name(value.func, ln.TOPOLOGY_CLASSES)
            layout = topology_layout(kind, value) if kind else None
            if layout is not None:
                self.used_topologies.add(id(value))
            return layout, None, value
        if not isinstance(value, cst.Name):
            return None, None, None
        bindings = scope.assignments[value.value]
        if len(bindings) != 1:
            return None, None, None
        binding = next(iter(bindings))
        target = getattr(binding, "node", None)
        if not isinstance(target, cst.Name):
            return None, None, None
        assign = self.command.top_level_assign(target, scope)
        if assign is None or not isinstance(assign.value, cst.Call) or len(assign.targets) != 1:
            return None, None, None
        if assign.targets[0].target is not target or self.command.line_of(assign) >= self.command.line_of(value):
            return None, None, None
        kind = self.command.legacy_name(assign.value.func, ln.TOPOLOGY_CLASSES)
        layout = topology_layout(kind, assign.value) if kind else None
        if layout is None:
            return None, None, None
        self.used_topologies.add(id(assign.value))
        line = self.command.parent(assign)
        if len(binding.references) == 1 and isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1:
            return layout, line, assign.value
        if not all(_is_pure(cst.parse_expression(size)) for _, size in layout.dims):
            return None, None, None
        return layout, None, assign.value

    def _plan_use(self, mesh: str, name: cst.CSTNode):
        """(id of the node to replace or None, replacement, needs ("pp","tp")) for one use, or None."""
        parent = self.command.parent(name)
        if isinstance(parent, cst.Arg) and parent.keyword is None and self._reads_mesh_by_name(parent):
            return (
                ("expert groups", id(parent)),
                mesh,
                False,
            )  # a mesh use (groups codemod, codemods/rules/_expert_grid.py)
        if isinstance(parent, cst.Arg) and self.expert_mpu_is_mesh_use:
            call = self.command.parent(parent)
            if (
                isinstance(call, cst.Call)
                and parent is arg_by(call, 1, "mpu")
                and f"{ln.GROUPS}.{EXPERT_TP_BUILDER}" in self.command.legacy_names(call.func)
            ):
                return ("expert groups", id(parent)), mesh, False
        if isinstance(parent, cst.Arg) and parent.keyword is not None and parent.keyword.value == "mpu":
            call = self.command.parent(parent)
            # the initialize codemod moves the layout into the config, which it must be able to find
            if isinstance(call, cst.Call) and ln.INITIALIZE in self.command.legacy_names(call.func):
                if self.command.config_dict(call) is not None:
                    return None, "", False
            return None
        if not isinstance(parent, cst.Attribute) or parent.value is not name:
            return None
        holder = self.command.parent(parent)
        if isinstance(holder, (cst.AssignTarget, cst.AugAssign, cst.Del)):
            return None
        call = holder if isinstance(holder, cst.Call) and holder.func is parent else None
        if parent.attr.value in EXPERT_MESH_CALLS and call is not None:  # a mesh use (codemods/rules/_expert_grid.py)
            return ("expert groups", id(call)), mesh, False
        if grid_api.rewrite_use(mesh, parent, call) is None:
            return None
        return id(call or parent), mesh, parent.attr.value in grid_api.NEEDS_PP_TP

    def _reads_mesh_by_name(self, arg: cst.Arg) -> bool:
        """``arg`` is the mesh argument of a mesh_core read of named expert groups."""
        call = self.command.parent(arg)
        if not (
            isinstance(call, cst.Call)
            and call.args
            and call.args[0] is arg
            and self.command.could_be(call.func, NAMED_READS)
        ):
            return False
        return any(
            n.startswith("mesh_core.") and n.rpartition(".")[2] in NAMED_READS
            for n in self.command.legacy_names(call.func)
        )
