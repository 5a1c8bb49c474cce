"""Codemod: the pipeline grid's methods inside DeepSpeed's own pipeline package → calls on the grid's mesh.

DeepSpeed's pipeline engine, module and p2p code call its ``PipelineParallelGrid`` (``self.grid``,
``self._grid``, the p2p module's ``_grid``). Under the mesh runtime every grid is compat's, built
on a :class:`~mesh_core.DeepSpeedDeviceMesh` that it exposes as ``grid.mesh`` (the engine's mesh),
and its methods ARE mesh queries: ``get_stage_id()`` is the pp coordinate, ``get_slice_parallel_group()``
the mesh's ``tp`` group, ``get_model_parallel_group()`` its flattened ``("pp", "tp")`` group (the
very group objects the grid built and the mesh caches: nothing is created). So
``self.grid.get_slice_parallel_group()`` becomes ``self.grid.mesh.get_group("tp")``.

Only the receivers listed in :data:`GRID_RECEIVERS` are rewritten (names that provably hold the
grid in those modules); a call with arguments other than ``stage_to_global``'s is left with a TODOV1.
"""

from __future__ import annotations

from typing import Optional

import libcst as cst

from .._engine.base import MigrationCommand
from . import _grid_api as grid_api

KIND = "grid method/attribute"

# module -> receivers (code) that hold the module's PipelineParallelGrid
GRID_RECEIVERS: dict[str, frozenset[str]] = {
    "deepspeed.runtime.pipe.engine": frozenset({"self.grid"}),
    "deepspeed.runtime.pipe.module": frozenset({"self._grid"}),
    "deepspeed.runtime.pipe.p2p": frozenset({"_grid"}),
}


def code(node: cst.CSTNode) -> str:
    return cst.Module([]).code_for_node(node)


class GridInternalCommand(MigrationCommand):
    DESCRIPTION = "PipelineParallelGrid calls inside DeepSpeed's pipeline package -> the grid's mesh"
    IDENTIFIERS = (frozenset({"grid", "_grid"}),)
    MARKERS = (("grid",),)

    def visit_Module(self, node: cst.Module) -> Optional[bool]:
        self._receivers = GRID_RECEIVERS.get(self.context.full_module_name or "", frozenset())
        return super().visit_Module(node) if self._receivers else False

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        func = original_node.func
        if not isinstance(func, cst.Attribute) or code(func.value) not in self._receivers:
            return updated_node
        name = func.attr.value
        if name not in grid_api.METHODS and name != "stage_to_global":
            return updated_node
        replacement = grid_api.rewrite_use(f"{code(func.value)}.mesh", func, original_node)
        if replacement is None:
            self.flag(
                KIND,
                f"{code(func)}(...) with these arguments has no mesh call; write the mesh call by hand "
                "(ds-migrate --explain grid-use)",
            )
            return updated_node
        self.keep_comments(original_node)
        self.record(KIND)
        new = cst.parse_expression(replacement)
        return new.with_changes(lpar=original_node.lpar, rpar=original_node.rpar) if original_node.lpar else new
