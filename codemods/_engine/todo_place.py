"""Where a ``# TODOV1:`` comment goes: at the end of its statement's line when the line stays within
:data:`~codemods._engine.todo_links.MAX_COMMENT` characters, else on its own line directly above the statement
(same indentation; wrapped onto ``#   `` continuation lines where the indentation would take that line
past the limit: :mod:`codemods._engine.todo_wrap`), and above a statement written across lines. A comment above the statement counts as there for every
later run (idempotent)."""

from __future__ import annotations

from typing import Optional, Sequence

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider

from .todo_links import MAX_COMMENT, TODO_TAG
from .todo_wrap import wrap

_TAG = f"# {TODO_TAG}:"
_DEFS = (cst.FunctionDef, cst.ClassDef)
_HEADED = (
    cst.If,
    cst.While,
    cst.For,
    cst.With,
    cst.FunctionDef,
    cst.ClassDef,
    cst.ExceptHandler,
    cst.ExceptStarHandler,
    cst.Match,
    cst.MatchCase,
    cst.Try,
    cst.TryStar,
)


def _lines_above(node: cst.CSTNode) -> Sequence[cst.EmptyLine]:
    if isinstance(node, _DEFS) and node.decorators:
        return node.lines_after_decorators
    return getattr(node, "leading_lines", ())


def todo_above(node: cst.CSTNode, header: Sequence[cst.EmptyLine] = ()) -> bool:
    """Whether a ``# TODOV1:`` comment stands on the comment lines directly above ``node`` (above a
    module's first statement, libcst keeps those lines in the module's ``header``)."""
    lines = list(_lines_above(node)) or list(header)
    for line in reversed(lines):
        if line.comment is None:
            return False
        if TODO_TAG in line.comment.value:
            return True
    return False


def _header(node: cst.CSTNode) -> Optional[cst.TrailingWhitespace]:
    """The trailing whitespace of the line a site's comment is written on (see codemods._engine.base)."""
    if isinstance(node, cst.SimpleStatementLine):
        return node.trailing_whitespace
    if isinstance(node, cst.Match):
        return node.whitespace_after_colon
    body = getattr(node, "body", None)
    if isinstance(body, cst.IndentedBlock):
        return body.header
    if isinstance(body, cst.SimpleStatementSuite):
        return body.trailing_whitespace
    return None


def _with_header(node: cst.CSTNode, ws: cst.TrailingWhitespace) -> cst.CSTNode:
    if isinstance(node, cst.SimpleStatementLine):
        return node.with_changes(trailing_whitespace=ws)
    if isinstance(node, cst.Match):
        return node.with_changes(whitespace_after_colon=ws)
    body = node.body  # type: ignore[attr-defined]
    if isinstance(body, cst.IndentedBlock):
        return node.with_changes(body=body.with_changes(header=ws))
    return node.with_changes(body=body.with_changes(trailing_whitespace=ws))


class _Lift(cst.CSTTransformer):
    def __init__(self, moving: set[int], positions=None) -> None:
        super().__init__()
        self.moving = moving
        self.positions = positions or {}

    def on_leave(self, original_node, updated_node):  # type: ignore[override]
        if not isinstance(updated_node, (cst.SimpleStatementLine, *_HEADED)):
            return updated_node
        ws = _header(updated_node)
        if ws is None or ws.comment is None or id(ws.comment) not in self.moving:
            return updated_node
        text = ws.comment.value
        at = text.index(_TAG)
        kept = text[:at].rstrip()
        ws = (
            ws.with_changes(comment=cst.Comment(kept))
            if kept
            else ws.with_changes(whitespace=cst.SimpleWhitespace(""), comment=None)
        )
        updated_node = _with_header(updated_node, ws)
        position = self.positions.get(original_node)
        indent = position.start.column if position is not None else 0  # the statement's (and the comment's)
        lines = [
            cst.EmptyLine(indent=True, whitespace=cst.SimpleWhitespace(""), comment=cst.Comment(part))
            for part in wrap(text[at:], indent)
        ]
        if isinstance(updated_node, _DEFS) and updated_node.decorators:
            return updated_node.with_changes(lines_after_decorators=[*updated_node.lines_after_decorators, *lines])
        return updated_node.with_changes(leading_lines=[*updated_node.leading_lines, *lines])


def place_todos(parsed: cst.Module, tree: cst.Module) -> cst.Module:
    """``tree`` (the codemods' output for ``parsed``) with each ``# TODOV1:`` comment the codemods
    added at the end of a line longer than :data:`MAX_COMMENT` moved onto its own line above its
    statement. Comments of the input stay where they are."""
    if tree is parsed:
        return tree
    old = {id(c) for c in _comments(parsed)}
    new = [c for c in _comments(tree) if id(c) not in old and _TAG in c.value]
    if not new:
        return tree
    wrapper = MetadataWrapper(tree, unsafe_skip_copy=True)
    positions = wrapper.resolve(PositionProvider)
    lines = tree.code.splitlines()
    moving = {id(c) for c in new if len(lines[positions[c].start.line - 1]) > MAX_COMMENT}
    # a statement written across lines: its comment would trail the last line (a closing bracket)
    # rather than stand by the code it is about
    starts = _statement_starts(tree)
    moving |= {id(c) for c in new if id(c) in starts and positions[starts[id(c)]].start.line < positions[c].start.line}
    return tree.visit(_Lift(moving, positions)) if moving else tree


def _statement_starts(tree: cst.Module) -> dict[int, cst.SimpleStatementLine]:
    """id(comment ending a simple statement's last line) -> that statement."""
    found: dict[int, cst.SimpleStatementLine] = {}

    class _Find(cst.CSTVisitor):
        def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> None:
            if node.trailing_whitespace.comment is not None:
                found[id(node.trailing_whitespace.comment)] = node

    tree.visit(_Find())
    return found


def _comments(tree: cst.Module) -> list[cst.Comment]:
    found: list[cst.Comment] = []

    class _Find(cst.CSTVisitor):
        def visit_Comment(self, node: cst.Comment) -> None:
            found.append(node)

    tree.visit(_Find())
    return found
