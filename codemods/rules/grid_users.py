"""Codemod: a pipeline engine's grid used by user code → ``mesh_of(<grid>).<mesh query>``.

Code outside DeepSpeed reaches a ``PipelineParallelGrid`` through the engine (``engine.grid``, a
``PipelineEngine`` subclass's ``self.grid``) or as a parameter annotated ``PipelineParallelGrid``.
``mesh_core.mesh_of(grid)`` answers each mesh query with the grid's own getter (a legacy grid, or
the mesh runtime's), so ``engine.grid.get_slice_parallel_group()`` becomes
``mesh_of(engine.grid).get_group("tp")`` and computes the same with and without
``compat.install()``. Only queries ``mesh_of`` answers from a grid getter are rewritten
(:data:`MESH_OF`); ``stage_to_global``, the rank-list tables and the topology stay, with a TODOV1.

The receiver must provably hold a pipeline engine's grid: ``self.grid`` in a ``PipelineEngine``
subclass, ``<x>.grid`` inside ``if isinstance(<x>, PipelineEngine):``, ``<engine>.grid`` after
``<engine>, ... = deepspeed.initialize(...)``, or a name annotated ``PipelineParallelGrid``. Any
other ``<x>.grid.<grid query>`` gets a TODOV1 with the rewrite to apply once ``<x>`` is known to be
a pipeline engine.
"""

from __future__ import annotations

from typing import Optional

import libcst as cst
from libcst.metadata import FunctionScope

from .._engine import legacy_names as ln
from .._engine.base import MigrationCommand
from . import _grid_api as grid_api
from . import _mpu_class as mpu_class

KIND = "engine grid"
HOLDERS = frozenset({"grid", "_grid"})
PIPE_ENGINES = frozenset(
    {
        "deepspeed.PipelineEngine",
        "deepspeed.runtime.pipe.engine.PipelineEngine",
        "deepspeed.runtime.pipe.PipelineEngine",
    }
)
# grid queries mesh_of answers with the same-named (or, on a legacy grid, an equal) grid getter:
# mesh_core.roles.mpu_mesh's probe order on a PipelineParallelGrid
_MESH_OF_TEMPLATES = ("get_local_rank(", "get_rank(", "size(", "get_group(", "get_group_ranks(", ".rank")
MESH_OF = frozenset(
    name
    for name, template in {**grid_api.METHODS, **grid_api.ATTRIBUTES}.items()
    if any(t in template for t in _MESH_OF_TEMPLATES)
    and "spec" not in template
    and "layout" not in template
    and "get_all_group_ranks" not in template
)
GRID_QUERIES = frozenset({*grid_api.METHODS, *grid_api.ATTRIBUTES, *grid_api.MANUAL, "stage_to_global"})


def code(node: cst.CSTNode) -> str:
    return cst.Module([]).code_for_node(node)


class GridUsersCommand(MigrationCommand):
    DESCRIPTION = "a pipeline engine's grid in user code -> mesh_of(grid) mesh queries"
    IDENTIFIERS = (frozenset({*HOLDERS, "PipelineParallelGrid"}),)
    MARKERS = (("grid", "Grid"),)

    def visit_Module(self, node: cst.Module) -> Optional[bool]:
        module = self.context.full_module_name or ""
        if module == "deepspeed" or module.startswith("deepspeed."):
            return False  # DeepSpeed's own package runs on the mesh runtime: codemods.rules.grid_internal
        # hand-written mpu classes over a grid -> whether every instance of one gets a local grid
        self._wrappers: dict[str, tuple[mpu_class.GridWrapper, bool]] = {}
        result = super().visit_Module(node)
        for name, wrapper in mpu_class.module_wrappers(node, MESH_OF).items():
            self._wrappers[name] = (wrapper, mpu_class.instances_get_grids(self, wrapper, self._local_grid))
        return result

    def _local_grid(self, name: cst.Name) -> bool:
        value = self.bound_value(name)
        return isinstance(value, cst.Call) and ln.GRID in self.legacy_names(value.func)

    def _wrapper_getter(self, node: cst.BaseExpression):
        """(the class, whether proven, the getter) for ``self.<grid>`` inside a getter of a
        hand-written mpu class over a grid; None elsewhere."""
        if not self._wrappers or not isinstance(node, cst.Attribute) or not isinstance(node.value, cst.Name):
            return None
        current: Optional[cst.CSTNode] = node
        while current is not None and not isinstance(current, cst.FunctionDef):
            current = self.parent(current)
        cls = self.parent(self.parent(current)) if current is not None else None
        if not isinstance(cls, cst.ClassDef) or cls.name.value not in self._wrappers:
            return None
        wrapper, proven = self._wrappers[cls.name.value]
        if (
            wrapper.node is not cls
            or current.name.value not in wrapper.getters
            or wrapper.getters[current.name.value][0] != node.attr.value
        ):
            return None
        return wrapper, proven, current.name.value

    # --- the receiver -------------------------------------------------------------------------
    def _grid_receiver(self, node: cst.BaseExpression) -> Optional[str]:
        """``"proven"`` when ``node`` holds a pipeline engine's grid, ``"maybe"`` for ``<x>.grid``
        of unknown ``<x>``, else None."""
        if isinstance(node, cst.Name):
            return "proven" if self._annotated_grid(node) else None
        if not isinstance(node, cst.Attribute) or node.attr.value not in HOLDERS:
            return None
        owner = node.value
        if isinstance(owner, cst.Name) and node.attr.value == "grid":
            if self._pipe_engine_self(owner) or self._isinstance_guarded(owner) or self._engine_var(owner):
                return "proven"
        return "maybe"

    def _annotated_grid(self, name: cst.Name) -> bool:
        """``name`` is a parameter (or the one binding) annotated ``PipelineParallelGrid``."""
        target = self.single_binding(name)
        annotation = None
        if isinstance(target, cst.Param):
            annotation = target.annotation
        else:
            holder = self.parent(target) if target is not None else None
            if isinstance(holder, cst.AnnAssign) and holder.target is target:
                annotation = holder.annotation
        return annotation is not None and ln.GRID in self.legacy_names(annotation.annotation)

    def _pipe_engine_self(self, owner: cst.Name) -> bool:
        scope = self.scope_of(owner)
        if not isinstance(scope, FunctionScope) or self._engine_self(scope) != owner.value:
            return False
        cls = self.parent(self.parent(scope.node))
        return isinstance(cls, cst.ClassDef) and any(self.legacy_names(b.value) & PIPE_ENGINES for b in cls.bases)

    def _engine_var(self, owner: cst.Name) -> bool:
        return self.engine_bound_at(owner, owner.value)

    def _isinstance_guarded(self, owner: cst.Name) -> bool:
        """``owner`` is read in the body of ``if isinstance(<owner>, PipelineEngine):`` (same
        function, not rebound in that body)."""
        node: Optional[cst.CSTNode] = owner
        while node is not None and not isinstance(node, (cst.FunctionDef, cst.ClassDef, cst.Module)):
            parent = self.parent(node)
            if isinstance(parent, cst.If) and node is parent.body and self._is_engine_test(parent.test, owner.value):
                return not self._rebinds(parent.body, owner.value, before=owner)
            node = parent
        return False

    def _is_engine_test(self, test: cst.BaseExpression, name: str) -> bool:
        if not (isinstance(test, cst.Call) and isinstance(test.func, cst.Name) and test.func.value == "isinstance"):
            return False
        if len(test.args) != 2 or any(a.keyword or a.star for a in test.args):
            return False
        subject, classes = test.args[0].value, test.args[1].value
        return (
            isinstance(subject, cst.Name) and subject.value == name and bool(self.legacy_names(classes) & PIPE_ENGINES)
        )

    def _rebinds(self, block: cst.CSTNode, name: str, before: cst.CSTNode) -> bool:
        from .._engine.base import find_all

        line = self.line_of(before)
        for assign in find_all(block, cst.Assign, cst.AugAssign, cst.AnnAssign, cst.For, cst.With, cst.NamedExpr):
            targets = (
                [t.target for t in assign.targets]
                if isinstance(assign, cst.Assign)
                else [getattr(assign, "target", None)]
            )
            if isinstance(assign, cst.With):
                targets = [i.asname.name for i in assign.items if i.asname is not None]
            for target in targets:
                if target is not None and any(
                    isinstance(n, cst.Name) and n.value == name for n in find_all(target, cst.Name)
                ):
                    if self.line_of(assign) <= line:
                        return True
        return False

    # --- rewriting ----------------------------------------------------------------------------
    def _use(self, attribute: cst.Attribute) -> Optional[tuple[cst.CSTNode, Optional[cst.Call]]]:
        """(the node to replace, the call) for a read ``<grid>.<query>`` / call ``<grid>.<query>(...)``."""
        holder = self.parent(attribute)
        if isinstance(holder, (cst.AssignTarget, cst.AugAssign, cst.Del)):
            return None
        if isinstance(holder, cst.Call) and holder.func is attribute:
            return holder, holder
        return attribute, None

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        func = original_node.func
        if not isinstance(func, cst.Attribute) or func.attr.value not in GRID_QUERIES:
            return updated_node
        return self._rewrite(func, original_node, updated_node)

    def leave_Attribute(self, original_node: cst.Attribute, updated_node: cst.Attribute) -> cst.BaseExpression:
        if original_node.attr.value not in GRID_QUERIES:
            return updated_node
        holder = self.parent(original_node)
        if isinstance(holder, cst.Call) and holder.func is original_node:
            return updated_node  # the call is rewritten as a whole
        if isinstance(holder, (cst.AssignTarget, cst.AugAssign, cst.Del)):
            return updated_node
        if isinstance(holder, cst.Attribute) and holder.value is original_node and original_node.attr.value in HOLDERS:
            return updated_node
        return self._rewrite(original_node, None, updated_node)

    def _rewrite(
        self, attribute: cst.Attribute, call: Optional[cst.Call], updated: cst.BaseExpression
    ) -> cst.BaseExpression:
        name = attribute.attr.value
        if call is None and name not in grid_api.ATTRIBUTES and name not in grid_api.MANUAL:
            return updated  # a method read without a call (a bound method handed on)
        if (
            call is not None
            and name not in grid_api.METHODS
            and name != "stage_to_global"
            and name not in grid_api.MANUAL
        ):
            return updated
        grid = code(attribute.value)
        held = self._wrapper_getter(attribute.value)
        proof = self._grid_receiver(attribute.value) if held is None else ("proven" if held[1] else "class")
        if proof is None:
            return updated
        if proof == "class":  # not every instance is proven to get a grid: the getter's own advice
            self.flag(KIND, mpu_class.getter_advice(held[0], held[2], grid))
            return updated
        mesh = f"{self.mesh_ref('mesh_of')}({grid})" if proof == "proven" else f"mesh_of({grid})"
        replacement = grid_api.rewrite_use(mesh, attribute, call) if name in MESH_OF else None
        if replacement is None:
            target = f"{grid}.{name}" + ("(...)" if call is not None else "")
            self.flag(
                KIND, f"{target} kept: mesh_of(grid) has no form of it for a legacy grid; " + _manual_hint(name, grid)
            )
            return updated
        if proof != "proven":
            self.flag(
                KIND,
                f"{grid}.{name} kept: {grid} is not proven a pipeline engine's grid; once it is, "
                f"write {replacement}; mesh_core.mesh_of answers with the grid's own getter, with or without compat.install()",
            )
            return updated
        self.keep_comments(call if call is not None else attribute)
        self.record(KIND)
        new = cst.parse_expression(replacement)
        original = call if call is not None else attribute
        return new.with_changes(lpar=original.lpar, rpar=original.rpar) if original.lpar else new


def _manual_hint(name: str, grid: str) -> str:
    if name == "stage_to_global":
        return (
            "with compat.install() the engine's mesh answers it: <engine>.mesh_device.stage_to_global(stage, dp=, tp=); "
            "without the mesh runtime keep the grid call"
        )
    if name in grid_api.MANUAL:
        return grid_api.MANUAL[name]
    template = grid_api.ATTRIBUTES.get(name) or grid_api.METHODS.get(name, "")
    return (
        f"with compat.install() use {template.format(m='<engine>.mesh_device')}; "
        "without the mesh runtime keep the grid attribute"
    )
