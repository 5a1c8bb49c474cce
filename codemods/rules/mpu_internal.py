"""Codemod: ``mpu.get_*()`` and ``bwc_*(mpu)`` calls inside DeepSpeed's own package → queries on
``mesh_of(mpu)`` (``mesh_core.roles.mpu_mesh``).

Inside DeepSpeed the mpu is a run-time value (``self.mpu``, a parameter, ``groups.mpu``, a module
global) of several kinds, so no static mesh can replace it. ``mesh_of(mpu)`` answers every query
with the mpu's own getter (or from the mesh the mpu is), so a rewritten call returns what the
legacy call returned wherever the legacy call returned:

- ``<mpu>.get_data_parallel_group()`` → ``mesh_of(<mpu>).get_group("dp")`` (likewise ``_world_size``
  → ``size``, ``_rank`` → ``get_local_rank``, ``get_data_parallel_group_ranks`` → ``get_group_ranks``);
  ``tensor_model_parallel`` → ``"tp"``, ``pipeline_model_parallel`` → ``"pp"``,
  ``sequence_parallel`` → ``"sp"``, ``model_parallel`` → ``("pp", "tp")``. Only getters that come
  first in ``mesh_of``'s probe order for their dim are rewritten (``None.get_*()`` and
  ``mesh_of(None).*`` both raise ``AttributeError``).
- ``bwc_tensor_model_parallel_rank(<mpu>)`` → ``mesh_of(<mpu>).get_local_rank("tp") if <mpu> is not None
  else 0`` (world size: ``1``, group: ``None``; the pipeline helpers likewise with ``"pp"``), only
  for an ``<mpu>`` that is a plain name or attribute (it is evaluated twice); inside a guard
  ``<mpu> is None or ...`` / ``... if <mpu> is not None else ...`` the None branch is not repeated.

Everything else (getters later in the probe order, ``get_tensor_model_parallel_src_rank``, calls
with arguments, a ``bwc_*`` argument that is an arbitrary expression) stays with a ``# TODOV1:``.
The getters are rewritten only in modules of the ``deepspeed`` package (outside it an ``mpu`` is the
user's own object; :mod:`codemods.rules.mpu_calls` handles the one passed to ``deepspeed.initialize``);
the ``bwc_*`` helpers everywhere but ``deepspeed.utils.bwc``, which defines them.
"""

from __future__ import annotations

from typing import Optional, Union

import libcst as cst

from .._engine.base import MigrationCommand, arg_by
from . import _mpu_exact as mpu_exact
from ._mesh_of import GETTERS, MANUAL

KIND = "mpu/bwc call"

BWC_MODULES = ("deepspeed.utils.bwc", "deepspeed.runtime.utils")  # runtime.utils re-exports them
# bwc function -> (query on mesh_of(mpu), what it returns for mpu=None)
BWC: dict[str, tuple[str, str]] = {
    "bwc_tensor_model_parallel_rank": ('get_local_rank("tp")', "0"),
    "bwc_tensor_model_parallel_world_size": ('size("tp")', "1"),
    "bwc_tensor_model_parallel_group": ('get_group("tp")', "None"),
    "bwc_pipeline_parallel_world_size": ('size("pp")', "1"),
    "bwc_pipeline_parallel_group": ('get_group("pp")', "None"),
}

_NO_PARENS = (cst.Arg, cst.Assign, cst.AnnAssign, cst.Return, cst.Expr, cst.DictElement, cst.Element)


def code(node: cst.CSTNode) -> str:
    return cst.Module([]).code_for_node(node)


def plain(node: cst.BaseExpression) -> bool:
    """A name or a chain of attributes on a name (cheap, side-effect free to evaluate twice)."""
    while isinstance(node, cst.Attribute):
        node = node.value
    return isinstance(node, cst.Name) and not node.lpar


def is_mpu(node: cst.BaseExpression) -> bool:
    """``mpu`` or ``<plain>.mpu`` (``self.mpu``, ``groups.mpu``)."""
    if isinstance(node, cst.Name):
        return node.value == "mpu"
    return isinstance(node, cst.Attribute) and node.attr.value == "mpu" and plain(node)


class MpuInternalCommand(MigrationCommand):
    DESCRIPTION = "mpu.get_*() / bwc_*(mpu) inside the deepspeed package -> mesh_of(mpu) queries (or TODOV1)"
    MARKERS = (("mpu",),)

    def visit_Module(self, node: cst.Module) -> Optional[bool]:
        super().visit_Module(node)
        module = self.context.full_module_name or ""
        # the bwc helpers are DeepSpeed API anywhere; an ``mpu`` outside DeepSpeed is the user's own
        # object (codemods.rules.mpu_calls handles the one passed to deepspeed.initialize)
        self._inside = module.startswith("deepspeed.") and module != "deepspeed.utils.bwc"
        self._active = self._inside or module != "deepspeed.utils.bwc"
        return self._active

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        if not self._active:
            return updated_node
        func = original_node.func
        if self._inside and isinstance(func, cst.Attribute) and is_mpu(func.value):
            return self._getter(original_node, updated_node)
        if self.could_be(func, BWC):
            return self._bwc(original_node, updated_node)
        return updated_node

    def _getter(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        method = original_node.func.attr.value  # type: ignore[attr-defined]
        receiver = code(updated_node.func.value)  # type: ignore[attr-defined]
        query = GETTERS.get(method)
        if query is not None and not original_node.args:
            self.record(KIND)
            return self._expr(f"{self.mesh_ref('mesh_of')}({receiver}).{query}", original_node)
        exact = mpu_exact.mpu_getter(self, original_node, receiver, method) if query is None else None
        if exact is not None:  # exact for the mpus that reach this site
            self.record(KIND)
            return self._expr(exact, original_node)
        if query is not None:
            self.flag(KIND, f"{receiver}.{method}() takes no args; use mesh_of({receiver}).{query}")
        elif method in MANUAL:
            self.flag(KIND, f"{receiver}.{method}(): {MANUAL[method]}")
        return updated_node

    def _bwc(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        name = self._bwc_name(original_node.func)
        if name is None:
            return updated_node
        query, default = BWC[name]
        arg = arg_by(original_node, 0, "mpu")
        if arg is None or len(original_node.args) != 1 or arg.star:
            self.flag(KIND, f"{name}() with these arguments: pass the mpu alone, then use mesh_of(mpu).{query}")
            return updated_node
        mpu = arg.value
        if not plain(mpu):
            self.flag(
                KIND,
                f"{name}({code(mpu)}): bind the mpu to a name first, then use "
                f"mesh_of(mpu).{query} if mpu is not None else {default}",
            )
            return updated_node
        target = code(mpu)
        call = f"{self.mesh_ref('mesh_of')}({target}).{query}"
        self.record(KIND)
        if self._guarded(original_node, target):
            return self._expr(call, original_node)
        return self._expr(f"{call} if {target} is not None else {default}", original_node)

    def _bwc_name(self, func: cst.BaseExpression) -> Optional[str]:
        for full in self.legacy_names(func):
            module, _, name = full.rpartition(".")
            if module in BWC_MODULES and name in BWC:
                return name
        return None

    def _guarded(self, call: cst.Call, target: str) -> bool:
        """The call only runs when ``target`` is not None: ``target is None or <call>``,
        ``target is not None and <call>``, ``<a> if target is None else <call>``,
        ``<call> if target is not None else <a>`` (the call a direct operand)."""
        parent = self.parent(call)
        operand: cst.CSTNode = call
        if isinstance(parent, cst.Comparison) and parent.left is call:  # target is None or bwc(target) == 1
            operand, parent = parent, self.parent(parent)
        if isinstance(parent, cst.BooleanOperation) and parent.right is operand:
            wanted = cst.Is if isinstance(parent.operator, cst.Or) else cst.IsNot
            return _compares_none(parent.left, target, wanted)
        if isinstance(parent, cst.IfExp):
            if parent.orelse is call:
                return _compares_none(parent.test, target, cst.Is)
            if parent.body is call:
                return _compares_none(parent.test, target, cst.IsNot)
        return False

    def _expr(self, text: str, original: cst.Call) -> cst.BaseExpression:
        expr = cst.parse_expression(text)
        if isinstance(expr, cst.IfExp) and not isinstance(self.parent(original), _NO_PARENS):
            expr = expr.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
        return expr.with_changes(lpar=[*expr.lpar, *original.lpar], rpar=[*expr.rpar, *original.rpar])


def _compares_none(test: cst.BaseExpression, target: str, operator: Union[type, tuple]) -> bool:
    if not isinstance(test, cst.Comparison) or len(test.comparisons) != 1 or test.lpar:
        return False
    target_node = test.comparisons[0]
    return (
        code(test.left) == target
        and isinstance(target_node.operator, operator)
        and isinstance(target_node.comparator, cst.Name)
        and target_node.comparator.value == "None"
    )
