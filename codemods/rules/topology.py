"""Codemod: ``PipelineParallelGrid(topology=...)`` construction → ``DeepSpeedDeviceMesh.build(...)``.

A grid bound to a local variable whose every use is a known grid method or attribute (or
``mpu=grid`` of ``deepspeed.initialize``, which the initialize codemod turns into the config
``"mesh"`` section) becomes a mesh, and each use becomes the mesh call. The topology it was built
from (``PipeModelDataParallelTopology`` / ``PipeDataParallelTopology`` / ``ProcessTopology`` with
literal axes) is dropped when nothing else uses it. Anything else is left with a ``# TODOV1:``.
"""

from __future__ import annotations

from typing import Optional, Sequence

import libcst as cst

from .._engine import legacy_names as ln
from .._engine.base import MigrationCommand, has_star_args
from . import _grid_api as grid_api
from ._grid_plan import GridPlan, code, topology_layout

KIND_GRID = "grid construction"
KIND_PIPE_TOPOLOGY = "pipeline topology"
_PIPE_TOPOLOGY_TODO = (
    "topology kept: hand PipelineModule(topology=mesh_core.pipeline_topology(pp=, dp=, tp=)) (tp= only for "
    "PipeModelDataParallelTopology; the same axes and answers, pure rank math)"
)
# advice for a kept topology whose uses are not all known
_KEPT_TOPOLOGY = {
    "same": "topology kept: use {call}: the same topology (axes and answers, what PipelineModule needs)",
    "groups only": "topology kept: use DeepSpeedDeviceMesh.build({args}) for its groups; no mesh form where code "
    "needs the topology object",
    "none": "topology kept: no mesh form (axes or sizes not readable here); keep the ProcessTopology",
}
PIPELINE_MODULES = frozenset(
    {
        "deepspeed.pipe.PipelineModule",
        "deepspeed.runtime.pipe.PipelineModule",
        "deepspeed.runtime.pipe.module.PipelineModule",
    }
)
PIPE_TOPOLOGY_ARGS = {  # legacy class -> its parameters (in order) -> pipeline_topology's keywords
    ln.PIPE_MODEL_DATA_TOPOLOGY: (("num_pp", "pp"), ("num_mp", "tp"), ("num_dp", "dp")),
    ln.PIPE_DATA_TOPOLOGY: (("num_pp", "pp"), ("num_dp", "dp")),
}
KIND_USE = "grid method/attribute"
# ProcessTopology methods whose answers mesh_core.pipeline_topology's object gives unchanged
TOPOLOGY_METHODS = frozenset(
    {
        "get_rank",
        "get_axis_names",
        "get_rank_repr",
        "get_dim",
        "get_coord",
        "get_axis_comm_lists",
        "filter_match",
        "get_axis_list",
        "world_size",
    }
)


def _handed_on_todo(callee: str, replacement: Optional[str]) -> str:
    """The advice for a topology another API reads (a Megatron mpu's ``initialize_model_parallel``,
    a model class that hands it to ``PipelineModule``): it needs a topology object, not a mesh."""
    target = replacement or "mesh_core.pipeline_topology(pp=, dp=, tp=) (tp= only for PipeModelDataParallelTopology)"
    return (
        f"topology kept: {callee}(...) reads it as a ProcessTopology (a Megatron mpu's initialize_model_parallel "
        "and PipelineModule call its get_axis_comm_lists / get_coord / get_dim), so keep handing it a topology, "
        f"not a mesh; hand it {target}; the same axes and answers, unless the callee isinstance-checks "
        "ProcessTopology"
    )


CLASS_NAMES = {name.rpartition(".")[2] for name in (ln.GRID, *ln.TOPOLOGY_CLASSES)}


class TopologyCommand(MigrationCommand):
    DESCRIPTION = "PipelineParallelGrid / topology construction -> DeepSpeedDeviceMesh.build"
    IDENTIFIERS = (frozenset(CLASS_NAMES),)
    MARKERS = (("PipelineParallelGrid", "Topology"),)

    def __init__(self, context) -> None:
        super().__init__(context)
        self._replacements: dict[int, str] = {}  # id(node) -> the mesh name (or, for the grid, its build arguments)
        self._converted_grids: set[int] = set()
        self._kept_grids: dict[int, str] = {}
        self._used_topologies: set[int] = set()
        self._kept_topologies: set[int] = set()  # read by a converted grid, but also used elsewhere
        self._removed_statements: set[int] = set()

    # --- planning -----------------------------------------------------------------------------
    def visit_Module(self, node: cst.Module) -> Optional[bool]:
        super().visit_Module(node)
        plan = GridPlan(self).plan(node)
        self._replacements, self._converted_grids, self._kept_grids = (
            plan.replacements,
            plan.converted_grids,
            plan.kept_grids,
        )
        self._used_topologies, self._kept_topologies = plan.used_topologies, plan.kept_topologies
        self._removed_statements, self._wrappers = plan.removed_statements, plan.wrappers
        return True

    # --- rewriting ----------------------------------------------------------------------------
    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        planned = self._replacements.get(id(original_node))
        if planned is not None:
            self.keep_comments(original_node)
            if id(original_node) in self._converted_grids:
                self.record(KIND_GRID)
                return cst.parse_expression(f"{self.mesh_ref('DeepSpeedDeviceMesh')}.build({planned})")
            self.record(KIND_USE)
            return cst.parse_expression(grid_api.rewrite_use(planned, updated_node.func, updated_node))
        if not self.could_be(original_node.func, CLASS_NAMES):
            return updated_node
        kind = self.legacy_name(original_node.func, {ln.GRID, *ln.TOPOLOGY_CLASSES})
        if kind == ln.GRID:
            reason = self._kept_grids.get(id(original_node), "the grid is not bound to a local variable")
            self.flag(
                KIND_GRID, f"PipelineParallelGrid kept: {reason}; use DeepSpeedDeviceMesh.build(pp=P, dp=D, tp=T)"
            )
        elif (
            kind is not None
            and (id(original_node) not in self._used_topologies or id(original_node) in self._kept_topologies)
            and self._only_pipeline_module_topology(original_node)
        ):
            replacement = self._pipeline_topology(kind, original_node)
            if replacement is not None:
                self.keep_comments(original_node)
                self.record(KIND_PIPE_TOPOLOGY)
                return replacement
            self.flag(KIND_PIPE_TOPOLOGY, self._kept_topology_todo(kind, original_node))
        elif (
            kind is not None
            and (id(original_node) not in self._used_topologies or id(original_node) in self._kept_topologies)
            and self._reaches_pipeline_module(original_node)
        ):
            self.flag(KIND_PIPE_TOPOLOGY, _PIPE_TOPOLOGY_TODO + "; bind it once and use that name only as the argument")
        elif kind is not None and (
            id(original_node) not in self._used_topologies or id(original_node) in self._kept_topologies
        ):
            callee = self._topology_callee(original_node)
            if callee is not None:
                rewritten = self._pipeline_topology(
                    kind, original_node, func="mesh_core.pipeline_topology"
                )  # no import
                self.flag(
                    KIND_PIPE_TOPOLOGY, _handed_on_todo(callee, code(rewritten) if rewritten is not None else None)
                )
            elif not self._feeds_pipeline_module(original_node):
                self.flag(KIND_GRID, self._kept_topology_todo(kind, original_node))
        return updated_node

    def leave_Attribute(self, original_node: cst.Attribute, updated_node: cst.Attribute) -> cst.BaseExpression:
        mesh = self._replacements.get(id(original_node))
        if mesh is None:
            return updated_node
        self.record(KIND_USE)
        return cst.parse_expression(grid_api.rewrite_use(mesh, updated_node, None))

    def leave_Module(self, original_node: cst.Module, updated_node: cst.Module) -> cst.Module:
        return updated_node.with_changes(body=self._without_removed(original_node.body, updated_node.body))

    def leave_IndentedBlock(
        self, original_node: cst.IndentedBlock, updated_node: cst.IndentedBlock
    ) -> cst.IndentedBlock:
        return updated_node.with_changes(body=self._without_removed(original_node.body, updated_node.body))

    def _without_removed(self, original: Sequence[cst.CSTNode], updated: Sequence[cst.CSTNode]) -> list:
        """``updated`` minus the dropped topology statements; their blank/comment lines move down."""
        if not any(id(o) in self._removed_statements for o in original):
            return list(updated)
        out: list = []
        carried: list[cst.EmptyLine] = []
        for orig, stmt in zip(original, updated):
            if id(orig) in self._removed_statements:
                carried += list(stmt.leading_lines)
                continue
            if carried:
                stmt = stmt.with_changes(leading_lines=[*carried, *stmt.leading_lines])
                carried = []
            out.append(stmt)
        return out

    def _kept_topology_todo(self, kind: str, call: cst.Call) -> str:
        """Advice for a topology kept whose uses are not all known (it may reach a PipelineModule or a
        Megatron mpu, which need a topology object): a replacement that is right either way, or none."""
        rewritten = self._pipeline_topology(kind, call, func="mesh_core.pipeline_topology")  # no import
        if rewritten is not None:
            return _KEPT_TOPOLOGY["same"].format(call=code(rewritten))
        layout = topology_layout(kind, call) if kind == ln.PROCESS_TOPOLOGY else None
        if layout is not None:
            if [d for d, _ in layout.dims] in (["pp", "dp"], ["pp", "dp", "tp"]):  # pipeline_topology's axes
                sizes = ", ".join(f"{d}={size}" for d, size in layout.dims)
                return _KEPT_TOPOLOGY["same"].format(call=f"mesh_core.pipeline_topology({sizes})")
            return _KEPT_TOPOLOGY["groups only"].format(args=", ".join(layout.build_args()))
        if kind in PIPE_TOPOLOGY_ARGS:  # a pipeline topology whose sizes are not readable here (*args)
            return _PIPE_TOPOLOGY_TODO
        return _KEPT_TOPOLOGY["none"]

    def _pipeline_topology(self, kind: str, call: cst.Call, func: Optional[str] = None) -> Optional[cst.Call]:
        """``pipeline_topology(pp=..., [tp=...,] dp=...)`` with the legacy arguments in their order
        (so they are evaluated in the same order), or None for other argument shapes."""
        params = PIPE_TOPOLOGY_ARGS.get(kind)
        if params is None or has_star_args(call) or len(call.args) != len(params):
            return None
        names = [name for name, _ in params]
        keywords = dict(params)
        args = []
        for position, arg in enumerate(call.args):
            name = arg.keyword.value if arg.keyword is not None else names[position]
            if name not in keywords:
                return None
            args.append(
                cst.Arg(
                    keyword=cst.Name(keywords.pop(name)),
                    value=arg.value,
                    equal=cst.AssignEqual(cst.SimpleWhitespace(""), cst.SimpleWhitespace("")),
                    comma=arg.comma,
                    whitespace_after_arg=arg.whitespace_after_arg,
                )
            )
        if keywords:
            return None
        func_node = cst.parse_expression(func or self.mesh_ref("pipeline_topology"))
        return call.with_changes(func=func_node, args=args)

    def _bound_name(self, call: cst.Call):
        """``(name, scope, bindings)`` when ``call`` is assigned to one plain name, else None."""
        parent = self.parent(call)
        if not (
            isinstance(parent, cst.Assign)
            and len(parent.targets) == 1
            and isinstance(parent.targets[0].target, cst.Name)
        ):
            return None
        target = parent.targets[0].target
        scope = self.scope_of(target)
        return target, scope, (scope.assignments[target.value] if scope is not None else ())

    def _uses(self, call: cst.Call) -> Optional[tuple[list, Optional[tuple]]]:
        """The nodes through which ``call``'s value is used: ``call`` itself when it is an argument,
        else the references of the name it is assigned to (with that binding); None otherwise."""
        if isinstance(self.parent(call), cst.Arg):
            return [call], None
        bound = self._bound_name(call)
        if bound is None:
            return None
        return [r.node for b in bound[2] for r in b.references], bound

    def _is_topology_use(self, node: cst.CSTNode) -> bool:
        parent = self.parent(node)
        return isinstance(parent, cst.Arg) and (
            self._is_pipeline_module_topology_arg(parent) or self._is_super_init_topology_arg(parent)
        )

    def _is_rank_math_use(self, node: cst.CSTNode) -> bool:
        """``node`` is the receiver of a call of a topology method :func:`mesh_core.pipeline_topology`'s
        object answers the same (``topo.get_coord(rank=r)``, ``topo.get_dim("pipe")``)."""
        attribute = self.parent(node)
        if not (
            isinstance(attribute, cst.Attribute)
            and attribute.value is node
            and attribute.attr.value in TOPOLOGY_METHODS
        ):
            return False
        call = self.parent(attribute)
        return isinstance(call, cst.Call) and call.func is attribute

    def _is_super_init_topology_arg(self, arg: cst.Arg) -> bool:
        """``arg`` is the topology of ``super().__init__(...)`` in ``__init__`` of a class whose first
        base is ``PipelineModule`` (so the call is ``PipelineModule.__init__``)."""
        call = self.parent(arg)
        if not (
            isinstance(call, cst.Call) and isinstance(call.func, cst.Attribute) and call.func.attr.value == "__init__"
        ):
            return False
        sup = call.func.value
        if not (
            isinstance(sup, cst.Call) and isinstance(sup.func, cst.Name) and sup.func.value == "super" and not sup.args
        ):
            return False
        node: Optional[cst.CSTNode] = call
        while node is not None and not isinstance(node, cst.FunctionDef):
            node = self.parent(node)
        if node is None or node.name.value != "__init__":
            return False
        block = self.parent(node)
        cls = self.parent(block) if block is not None else None
        if not isinstance(cls, cst.ClassDef) or not cls.bases or cls.bases[0].keyword is not None:
            return False
        if not self.legacy_names(cls.bases[0].value) & PIPELINE_MODULES or arg.star:
            return False
        if arg.keyword is not None:
            return arg.keyword.value == "topology"
        positional = [a for a in call.args if a.keyword is None and not a.star]
        return not has_star_args(call) and len(positional) > 2 and positional[2] is arg

    def _only_pipeline_module_topology(self, call: cst.Call) -> bool:
        """``call`` is only ever the ``topology`` of a ``PipelineModule`` (or of ``super().__init__``
        in its subclass) or the receiver of topology rank math: passed inline, or bound once to a
        name whose every use is one of those (a grid this run converts may read it too, beside a
        ``PipelineModule``)."""
        uses = self._uses(call)
        if uses is None:
            return False
        nodes, bound = uses
        if bound is None:
            return self._is_topology_use(call)
        target, scope, bindings = bound
        if len(bindings) != 1 or self.top_level_assign(target, scope) is not self.parent(call):
            return False
        module_args = [n for n in nodes if self._is_topology_use(n)]
        # a grid this run turns into a mesh no longer reads the topology
        converted = [
            n
            for n in nodes
            if isinstance(self.parent(n), cst.Arg) and id(self.parent(self.parent(n))) in self._converted_grids
        ]
        rank_math = [n for n in nodes if self._is_rank_math_use(n)]
        if not module_args and not rank_math:
            return False
        return len(module_args) + len(converted) + len(rank_math) == len(nodes)

    def _reaches_pipeline_module(self, call: cst.Call) -> bool:
        """Some use of ``call``'s value (inline, or through the name it is assigned to) is a
        ``PipelineModule`` topology argument."""
        uses = self._uses(call)
        return uses is not None and any(self._is_topology_use(n) for n in uses[0])

    def _is_pipeline_module_topology_arg(self, arg: cst.Arg) -> bool:
        call = self.parent(arg)
        if not isinstance(call, cst.Call) or arg.star or not self.legacy_names(call.func) & PIPELINE_MODULES:
            return False
        if arg.keyword is not None:
            return arg.keyword.value == "topology"
        positional = [a for a in call.args if a.keyword is None and not a.star]
        return not has_star_args(call) and len(positional) > 2 and positional[2] is arg

    def _topology_callee(self, call: cst.Call) -> Optional[str]:
        """The callee (code) a topology is handed to as an argument (inline or through the one name
        it is bound to), other than a grid this run converts; None when it is handed to none."""
        uses = self._uses(call)
        if uses is None:
            return None
        for node in uses[0]:
            arg = self.parent(node)
            holder = self.parent(arg) if isinstance(arg, cst.Arg) else None
            if isinstance(holder, cst.Call) and id(holder) not in self._converted_grids:
                return code(holder.func)
        return None

    def _feeds_pipeline_module(self, call: cst.Call) -> bool:
        """A topology passed (inline or through a name) to ``PipelineModule(topology=...)`` stays."""
        parent = self.parent(call)
        if isinstance(parent, cst.Arg):
            return True
        if (
            isinstance(parent, cst.Assign)
            and len(parent.targets) == 1
            and isinstance(parent.targets[0].target, cst.Name)
        ):
            target = parent.targets[0].target
            scope = self.scope_of(target)
            bindings = scope.assignments[target.value] if scope is not None else ()
            refs = [r for b in bindings for r in b.references]
            return bool(refs) and all(isinstance(self.parent(r.node), cst.Arg) for r in refs)
        return False
