"""libcst's traversal for read-only visitors without rebuilding the tree.

``node.visit(visitor)`` in libcst rebuilds every node it visits (``_visit_and_replace_children``
constructs and validates a copy), also for a ``CSTVisitor``, whose result is the node itself. Scope
analysis alone walks a tree four times that way (the expression-context and scope visitors, each
under libcst's batched visitor), plus the import passes' gathering visitors.

Within :func:`fast_visits`, a ``CSTVisitor`` gets the very same calls, in the same order
(``on_visit``, then per field ``on_visit_attribute``, the field's nodes, ``on_leave_attribute``,
then ``on_leave``), without the copies: the order of a node type's fields is read once from the
source of its ``_visit_and_replace_children`` where that method is a plain
``return <Node>(field=visit_*(self, "field", self.field, visitor), ...)``; any other shape (a field
visited under a condition, say) keeps libcst's own traversal for that node. Transformers always
take libcst's path.
"""

from __future__ import annotations

import ast
import inspect
import logging
import re
import textwrap
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Generator, Optional

import libcst as cst

from .libcst_private import VISIT_AND_REPLACE_CHILDREN, CSTTypedBaseFunctions

logger = logging.getLogger(__name__)

_VISIT_HELPERS = frozenset(
    {
        "visit_required",
        "visit_optional",
        "visit_sentinel",
        "visit_sequence",
        "visit_iterable",
        "visit_body_sequence",
        "visit_body_iterable",
    }
)

_ORDERS: dict[type, Optional[tuple[str, ...]]] = {}
_ENABLED: ContextVar[bool] = ContextVar("codemods_fast_visits", default=False)
ALLOWED = True  # False: fast_visits enables nothing (libcst's traversal everywhere; tests compare the two)
_LIBCST_VISIT = cst.CSTNode.visit


def _visited_field(call: ast.expr, aliases: dict[str, str]) -> Optional[str]:
    """The field a ``visit_*(self, "field", self.field, visitor)`` call visits, or None for any
    other call shape."""
    if not (
        isinstance(call, ast.Call)
        and isinstance(call.func, ast.Name)
        and call.func.id in _VISIT_HELPERS
        and len(call.args) == 4
        and not call.keywords
    ):
        return None
    owner, name, value, visitor = call.args
    if not (
        isinstance(owner, ast.Name)
        and owner.id == "self"
        and isinstance(visitor, ast.Name)
        and visitor.id == "visitor"
        and isinstance(name, ast.Constant)
        and isinstance(name.value, str)
    ):
        return None
    field = name.value
    if isinstance(value, ast.Attribute) and isinstance(value.value, ast.Name) and value.value.id == "self":
        return field if value.attr == field else None
    if isinstance(value, ast.Name) and aliases.get(value.id) == field:
        return field
    return None


def _calls_a_helper(node: ast.AST) -> bool:
    return any(
        isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in _VISIT_HELPERS for n in ast.walk(node)
    )


def field_order(node_type: type) -> Optional[tuple[str, ...]]:
    """The fields ``node_type``'s ``_visit_and_replace_children`` visits, in order, each one
    unconditionally; None when its source has any other shape (then libcst's traversal is used)."""
    if node_type in _ORDERS:
        return _ORDERS[node_type]
    order = None
    try:
        source = textwrap.dedent(inspect.getsource(getattr(node_type, VISIT_AND_REPLACE_CHILDREN)))
        function = ast.parse(source).body[0]
        order = _parse_order(function)
    except (OSError, TypeError, SyntaxError, IndexError, AttributeError):
        logger.debug("no field order for %s", node_type.__name__, exc_info=True)
    _ORDERS[node_type] = order
    return order


def _parse_order(function: ast.AST) -> Optional[tuple[str, ...]]:
    """The visited fields of a ``_visit_and_replace_children`` definition (see :func:`field_order`)."""
    if not isinstance(function, ast.FunctionDef) or [a.arg for a in function.args.args] != ["self", "visitor"]:
        return None
    *assigns, last = function.body
    if not assigns and isinstance(last, ast.Return) and isinstance(last.value, ast.Name) and last.value.id == "self":
        return ()  # a leaf (whitespace, a comment): nothing below it
    aliases: dict[str, str] = {}
    for statement in assigns:  # only ``name = self.field``
        if not (
            isinstance(statement, ast.Assign)
            and len(statement.targets) == 1
            and isinstance(statement.targets[0], ast.Name)
            and isinstance(statement.value, ast.Attribute)
            and isinstance(statement.value.value, ast.Name)
            and statement.value.value.id == "self"
        ):
            return None
        aliases[statement.targets[0].id] = statement.value.attr
    if not (isinstance(last, ast.Return) and isinstance(last.value, ast.Call) and not last.value.args):
        return None
    order = []
    for keyword in last.value.keywords:
        field = _visited_field(keyword.value, aliases)
        if field is not None:
            order.append(field)
        elif _calls_a_helper(keyword.value):  # visited in some other way (e.g. under a condition)
            return None
    return tuple(order)


def _silent_attributes(visitor: cst.CSTVisitor) -> bool:
    """``visitor``'s ``on_visit_attribute`` / ``on_leave_attribute`` are libcst's and find only the
    do-nothing stubs of libcst's typed visitor (no attribute hook on its class or on itself)."""
    cls = type(visitor)
    silent = _SILENT.get(cls)
    if silent is None:
        silent = _SILENT[cls] = (
            cls.on_visit_attribute is cst.CSTVisitor.on_visit_attribute
            and cls.on_leave_attribute is cst.CSTVisitor.on_leave_attribute
            and not has_attribute_hooks(cls)
        )
    return silent and not any(_ATTRIBUTE_HOOK.match(name) for name in getattr(visitor, "__dict__", ()))


_SILENT: dict[type, bool] = {}
_ATTRIBUTE_HOOK = re.compile(r"(visit|leave)_[A-Z][A-Za-z]*_")
_TYPED_STUBS = CSTTypedBaseFunctions.__module__


def has_attribute_hooks(cls: type) -> bool:
    """``cls`` defines a ``visit_<Node>_<field>`` / ``leave_<Node>_<field>`` hook other than libcst's
    do-nothing stubs."""
    return any(
        _ATTRIBUTE_HOOK.match(name) for base in cls.__mro__ if base.__module__ != _TYPED_STUBS for name in vars(base)
    )


_IS_VISITOR: dict[type, bool] = {}
_UNKNOWN = object()  # the order of a node type not seen yet


def _visit(self: cst.CSTNode, visitor):
    """``CSTNode.visit``: for a ``CSTVisitor`` within :func:`fast_visits`, libcst's calls without
    rebuilding nodes; otherwise libcst's own."""
    if not _ENABLED.get():
        return _LIBCST_VISIT(self, visitor)
    is_visitor = _IS_VISITOR.get(type(visitor))
    if is_visitor is None:
        is_visitor = _IS_VISITOR[type(visitor)] = issubclass(type(visitor), cst.CSTVisitor)
    if not is_visitor or _overrides_visit(type(self)):  # (an override's ``super().visit``: libcst's)
        return _LIBCST_VISIT(self, visitor)
    _walk(self, visitor, _silent_attributes(visitor))
    return self


_OVERRIDES: dict[type, bool] = {}


def _overrides_visit(node_type: type) -> bool:
    """``node_type`` has a ``visit`` of its own (``Module``, a subclass of a node type)."""
    found = _OVERRIDES.get(node_type)
    if found is None:
        found = _OVERRIDES[node_type] = node_type.visit is not _visit
    return found


def _walk(node: cst.CSTNode, visitor: cst.CSTVisitor, silent: bool) -> None:
    """libcst's calls of ``visitor`` for ``node`` and its subtree (the attribute calls left out
    where ``silent``: they would call nothing)."""
    node_type = type(node)
    if _overrides_visit(node_type):
        node.visit(visitor)  # its own visit first, as in libcst
        return
    order = _ORDERS.get(node_type, _UNKNOWN)
    if order is _UNKNOWN:
        order = field_order(node_type)
    if order is None:
        _LIBCST_VISIT(node, visitor)  # its children come back through _visit
        return
    if visitor.on_visit(node):
        for name in order:
            value = getattr(node, name)
            if not silent:
                visitor.on_visit_attribute(node, name)
            if type(value) is tuple or type(value) is list:
                for child in value:
                    _walk(child, visitor, silent)
            elif value is not None and type(value) is not cst.MaybeSentinel:
                _walk(value, visitor, silent)
            if not silent:
                visitor.on_leave_attribute(node, name)
    visitor.on_leave(node)


cst.CSTNode.visit = _visit  # type: ignore[method-assign]  # libcst's unless enabled below


@contextmanager
def fast_visits(enabled: bool = True) -> Generator[None, None, None]:
    """Within this block (this context), read-only visitors walk trees without copying them."""
    token = _ENABLED.set(enabled and ALLOWED)
    try:
        yield
    finally:
        _ENABLED.reset(token)
