"""Continuation lines stay aligned with their opening bracket when a rewrite moves the bracket.

PEP 8's "aligned with opening delimiter" style puts a call's (subscript's, literal's) continuation
lines under the first character after its open bracket. When a rule rewrites text before such a
bracket on its line (``PipelineParallelGrid(topology=t,`` becomes ``pipeline_grid(topology=t,``; a
getter before ``max(`` on the same line becomes a shorter expression), the lines that were aligned
with the bracket move by the same number of columns. Hanging indents (nothing after the bracket on
its line) and lines that were not aligned with the bracket are left as they are.

:func:`realign` compares a statement before and after a rewrite token by token (the brackets that
both have are found by a sequence match, each with its matching close); the statement is printed
on its own (its continuation lines relative to its block's indentation, as libcst keeps them) and
parsed back only when a line moves.
"""

from __future__ import annotations

import difflib
import io
import tokenize
from dataclasses import dataclass
from typing import Optional, TypeVar

import libcst as cst

_EMPTY = cst.Module([])
_OPEN, _CLOSE = "([{", ")]}"
_SKIP = (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER)
_HEADED = (cst.If, cst.While, cst.For, cst.With)
_PLACEHOLDER = cst.IndentedBlock(body=[cst.SimpleStatementLine([cst.Pass()])])

Statement = TypeVar("Statement", bound=cst.BaseStatement)


@dataclass
class _Bracket:
    index: int  # token index of the open bracket
    row: int
    col: int
    close: int  # token index of its matching close bracket (-1 when unmatched)
    visual: bool  # something follows the bracket on its line and the bracket closes on a later line


def _tokens(code: str) -> Optional[list[tokenize.TokenInfo]]:
    try:
        return [t for t in tokenize.generate_tokens(io.StringIO(code).readline) if t.type not in _SKIP]
    except (tokenize.TokenError, SyntaxError, IndentationError):
        return None


def _brackets(tokens: list[tokenize.TokenInfo]) -> tuple[dict[int, _Bracket], dict[int, int]]:
    """The open brackets (by token index), and for each token the innermost open bracket it is in
    (a close bracket counts as inside its own)."""
    found: dict[int, _Bracket] = {}
    inside: dict[int, int] = {}
    stack: list[int] = []
    for i, token in enumerate(tokens):
        if token.type == tokenize.OP and token.string in _CLOSE and stack:
            opened = stack.pop()
            inside[i] = opened
            found[opened].close = i
            found[opened].visual = found[opened].visual and token.start[0] > found[opened].row
            continue
        if stack:
            inside[i] = stack[-1]
        if token.type == tokenize.OP and token.string in _OPEN:
            after = tokens[i + 1] if i + 1 < len(tokens) else None
            visual = after is not None and after.start[0] == token.start[0] and after.type != tokenize.COMMENT
            found[i] = _Bracket(i, token.start[0], token.start[1], -1, visual)
            stack.append(i)
    return found, inside


def _same_brackets(
    old: list[tokenize.TokenInfo],
    new: list[tokenize.TokenInfo],
    old_brackets: dict[int, _Bracket],
    new_brackets: dict[int, _Bracket],
) -> dict[int, int]:
    """new open bracket -> old open bracket, for brackets the two token sequences share (the open
    and the close bracket both matched)."""
    matcher = difflib.SequenceMatcher(
        None, [(t.type, t.string) for t in old], [(t.type, t.string) for t in new], autojunk=False
    )
    to_old: dict[int, int] = {}
    for block in matcher.get_matching_blocks():
        for k in range(block.size):
            to_old[block.b + k] = block.a + k
    pairs = {}
    for j, bracket in new_brackets.items():
        i = to_old.get(j)
        if i is None or i not in old_brackets or bracket.close < 0:
            continue
        if to_old.get(bracket.close) == old_brackets[i].close >= 0:
            pairs[j] = i
    return pairs


def realign_code(old: str, new: str) -> str:
    """``new`` (a rewrite of the code ``old``) with each line that ``old`` aligned with an open
    bracket moved to stay aligned with that bracket where the rewrite moved it; ``new`` itself when
    nothing moves (or either does not tokenize)."""
    if "\n" not in new.rstrip("\n") or old == new:
        return new
    old_tokens, new_tokens = _tokens(old), _tokens(new)
    if not old_tokens or not new_tokens:
        return new
    old_brackets, _ = _brackets(old_tokens)
    new_brackets, inside = _brackets(new_tokens)
    pairs = _same_brackets(old_tokens, new_tokens, old_brackets, new_brackets)
    lines = new.split("\n")
    covered = {row for t in new_tokens for row in range(t.start[0] + 1, t.end[0] + 1)}  # inside a multi-line token
    shift: dict[int, int] = {}  # row -> columns its line moved
    for i, token in enumerate(new_tokens):
        row, col = token.start
        if row in shift or row in covered or (i > 0 and new_tokens[i - 1].end[0] == row) or i not in inside:
            continue
        bracket = new_brackets[inside[i]]
        if not bracket.visual or bracket.row == row:
            continue
        if inside[i] in pairs:
            before = old_brackets[pairs[inside[i]]]
            if not before.visual:
                continue
            was = before.col
        elif shift.get(bracket.row):
            was = bracket.col  # a bracket the rewrite wrote on a line that moved
        else:
            continue
        now = bracket.col + shift.get(bracket.row, 0)
        text = lines[row - 1]
        indent = text[: len(text) - len(text.lstrip(" \t"))]
        if now == was or col != was + 1 or "\t" in indent or len(indent) != col:
            continue
        lines[row - 1] = " " * (now + 1) + text[col:]
        shift[row] = now - was
    return "\n".join(lines) if shift else new


def _header_only(node: cst.CSTNode) -> cst.CSTNode:
    changes = {"body": _PLACEHOLDER, "leading_lines": ()}
    if isinstance(node, (cst.If, cst.While, cst.For)):
        changes["orelse"] = None
    return node.with_changes(**changes)


def realign(before: cst.BaseStatement, after: Statement) -> Statement:
    """``after`` (a rule's rewrite of the statement ``before``) with its continuation lines that were
    aligned with an open bracket moved with that bracket (see the module docstring); ``after``
    itself when nothing moves. A compound statement's header only (its body's statements are
    statements of their own)."""
    if after is before:
        return after
    if isinstance(after, cst.SimpleStatementLine) and isinstance(before, cst.SimpleStatementLine):
        old_node, new_node = before.with_changes(leading_lines=()), after.with_changes(leading_lines=())
    elif isinstance(after, _HEADED) and type(before) is type(after):
        old_node, new_node = _header_only(before), _header_only(after)
    else:
        return after
    if any(not w.indent for w in (*_whitespace(old_node), *_whitespace(new_node))):
        return after  # a line less indented than its block: printed on its own, it would not read back the same
    old, new = _EMPTY.code_for_node(old_node), _EMPTY.code_for_node(new_node)
    moved = realign_code(old, new)
    if moved == new:
        return after
    try:
        parsed = cst.parse_statement(moved)
    except cst.ParserSyntaxError:
        return after
    if _EMPTY.code_for_node(parsed) != moved or type(parsed) is not type(new_node):
        return after
    if isinstance(after, cst.SimpleStatementLine):  # (its end-of-line comment: the same node, moved or not later)
        return parsed.with_changes(leading_lines=after.leading_lines, trailing_whitespace=after.trailing_whitespace)
    changes = {"body": after.body, "leading_lines": after.leading_lines}
    if isinstance(after, (cst.If, cst.While, cst.For)):
        changes["orelse"] = after.orelse
    return parsed.with_changes(**changes)


def _whitespace(node: cst.CSTNode) -> list[cst.ParenthesizedWhitespace]:
    found: list[cst.ParenthesizedWhitespace] = []

    class _Find(cst.CSTVisitor):
        def visit_ParenthesizedWhitespace(self, ws: cst.ParenthesizedWhitespace) -> None:
            found.append(ws)

        def visit_IndentedBlock(self, block: cst.IndentedBlock) -> bool:
            return False

    node.visit(_Find())
    return found
