"""Big files in pieces: the pre-scan that cuts a module into its header and groups of top-level
definitions, and the splicing of the pieces' migrations back into one text.

A whole-module libcst tree takes ~475x the source in memory, so a big file is migrated a group of
top-level ``def`` / ``class`` statements at a time, each group parsed behind a copy of the module's
header (its leading imports and simple statements). This module only finds the pieces and the facts
about them that decide whether that gives the whole-file path's bytes (:func:`plan` answers None
for a file whose shape it does not vouch for); the driver that runs the codemods on them and checks
what they did is ``codemods._engine.pipeline``. Nothing here holds more than one piece's ``ast`` at a time:
the cuts come from a ``tokenize`` stream over the text.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from dataclasses import dataclass, field
from typing import Callable, Optional

import libcst as cst

from .base import ast_identifiers

# Only files at least this big take the piecewise path (smaller ones cost little either way).
MIN_BYTES = 150_000
# A header longer than this (it is parsed again with every group) sends the file down the whole-file path.
HEADER_BYTES = 60_000
# Source bytes per group of definitions migrated together (a group ends at the first cut after this many).
GROUP_BYTES = 12_000

_DEFINITION_STARTS = ("def", "class", "@", "async")
_SKIPPED = (tokenize.NL, tokenize.COMMENT, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENCODING)


@dataclass
class Piece:
    """A run of top-level statements: its text (exact slice of the source) and what ``ast`` finds in it."""

    text: str
    statements: int
    names: set[str] = field(default_factory=set)  # identifiers, as codemods._engine.base.identifiers finds them
    binds: set[str] = field(default_factory=set)  # a superset of the names bound anywhere in it
    defs: list[str] = field(default_factory=list)  # names of its top-level functions and classes
    call_names: set[str] = field(default_factory=set)  # plain names in the arguments of the calls plan() asks about


@dataclass
class Plan:
    """A module cut into its header and groups of top-level definitions (texts concatenate to it)."""

    header: Piece
    units: list[Piece]  # the definitions between two places where the text may be cut, in order
    header_imports: dict[str, str]  # {bound name: imported dotted name} of the header's imports
    aliases: dict[str, str]  # {alias: last part of the imported name} of ``import ... as alias``
    header_code_names: set[str]  # identifiers of the header's statements other than imports
    indent: str  # the module's first indentation (libcst's default_indent for the whole file)


def _statements(source: str) -> Optional[tuple[list[tuple[int, str, int]], str]]:
    """(first line, first token, last line of the statement before) of each top-level statement
    (a decorated definition: its first decorator's line, the token after the decorators), 1-based,
    from ``tokenize``, and the first indentation (libcst's default indent of the module); None if
    the text does not tokenize."""
    found: list[tuple[int, str, int]] = []
    indent: Optional[str] = None
    depth, at_start, last_newline = 0, True, 0
    try:
        for token in tokenize.generate_tokens(io.StringIO(source).readline):
            kind = token.type
            if kind == tokenize.INDENT:
                depth += 1
                if indent is None:
                    indent = token.string
            elif kind == tokenize.DEDENT:
                depth -= 1
            elif kind == tokenize.NEWLINE:
                at_start, last_newline = True, token.end[0]
            elif kind == tokenize.ENDMARKER:
                break
            elif kind not in _SKIPPED and at_start:
                at_start = False
                if depth == 0 and found and found[-1][1] == "@":  # the decorated definition
                    found[-1] = (found[-1][0], token.string, found[-1][2])
                elif depth == 0:
                    found.append((token.start[0], token.string, last_newline))
    except (tokenize.TokenError, SyntaxError):
        return None
    return found, indent if indent is not None else "    "


# A column-0 line that may begin a top-level definition (or be inside a string or brackets:
# :func:`_scanned_definitions` finds out by parsing).
_DEFINITION_LINE = re.compile(r"^(?:@|def\b|class\b|async\b)", re.MULTILINE)
_FALLBACK = object()


def _scanned_definitions(source: str, starts: list[int]):
    """What :func:`_statements` finds, without ``tokenize`` (~5x faster): the column-0 lines that
    look like the start of a definition, each run from one to the next parsed with ``ast`` to prove
    it is one top-level statement and to find where it ends. Returns ``_FALLBACK`` (then
    ``tokenize`` decides) wherever a text shape could make that differ: a run that does not parse
    (a candidate inside a string or brackets), a backslash after a statement's last token, a form
    feed, a long header; None when the file is not a header and definitions."""
    if "\f" in source:
        return _FALLBACK
    candidates = _candidate_lines(source)
    if not candidates:
        return None
    first = candidates[0]
    if starts[first - 1] > HEADER_BYTES:
        return _FALLBACK
    found: list[tuple[int, str, int]] = []
    try:
        header = ast.parse(source[: starts[first - 1]]).body
    except (SyntaxError, ValueError):
        return _FALLBACK
    last_end = 0
    for statement in header:
        if hasattr(statement, "body"):  # a block in the header: tokenize's first INDENT may be there
            return _FALLBACK
        if statement.lineno != last_end:  # a new logical line (``a; b`` is one, as for tokenize)
            found.append((statement.lineno, "", 0))
        if _continued(source, starts, statement.end_lineno, statement.end_col_offset):
            return _FALLBACK
        last_end = statement.end_lineno
    indent: Optional[str] = None
    index = 0
    while index < len(candidates):
        begin = candidates[index]
        end = index + 1
        if source[starts[begin - 1]] == "@":  # decorators: the statement runs to its def / class line
            while end < len(candidates) and source[starts[candidates[end] - 1]] == "@":
                end += 1
            end += 1
        upto = candidates[end] if end < len(candidates) else len(starts)
        text = source[starts[begin - 1] : starts[upto - 1]] if upto <= len(starts) - 1 else source[starts[begin - 1] :]
        try:
            body = ast.parse(text).body
        except (SyntaxError, ValueError):
            return _FALLBACK
        if not body or not isinstance(body[0], _DEFINITIONS):
            return _FALLBACK
        if len(body) > 1:  # a statement after the first definition that is not one
            return None
        statement = body[0]
        offset = begin - 1
        if _continued(source, starts, statement.end_lineno + offset, statement.end_col_offset):
            return _FALLBACK
        if indent is None:
            indent = _block_indent(source, starts, statement, offset)
            if indent is _FALLBACK:
                return _FALLBACK
        found.append((begin, "def", last_end))
        last_end = statement.end_lineno + offset
        index = end
    return found, indent if indent is not None else "    "


def _candidate_lines(source: str) -> list[int]:
    lines, at, counted = [], 0, 0
    for match in _DEFINITION_LINE.finditer(source):
        counted += source.count("\n", at, match.start())
        at = match.start()
        lines.append(counted + 1)
    return lines


def _continued(source: str, starts: list[int], line: int, column: int) -> bool:
    """A backslash after a statement's last token on its last line (it may join the next line)."""
    end = starts[line] if line < len(starts) else len(source)
    return "\\" in source[starts[line - 1] + column : end]


def _block_indent(source: str, starts: list[int], definition: ast.stmt, offset: int):
    """The indentation of ``definition``'s block (at ``offset`` lines in the source) as ``tokenize``'s
    INDENT gives it; None when its body is on its own line (no INDENT); ``_FALLBACK`` if unsure."""
    first = definition.body[0]
    decorators = getattr(first, "decorator_list", None)
    line = (decorators[0].lineno if decorators else first.lineno) + offset
    text = source[starts[line - 1] : starts[line]]
    stripped = text.lstrip(" \t")
    if source[starts[line - 1] - 2 : starts[line - 1]] == "\\\n":
        return _FALLBACK  # a continued line: not where a block begins
    if decorators:
        return text[: len(text) - len(stripped)] if stripped.startswith("@") and stripped != text else _FALLBACK
    if len(text) - len(stripped) != first.col_offset:
        return None  # after the def's colon, on its (logical) line: no block, so no INDENT
    return text[: len(text) - len(stripped)] or _FALLBACK


def _line_starts(source: str) -> list[int]:
    starts = [0]
    index = source.find("\n")
    while index != -1:
        starts.append(index + 1)
        index = source.find("\n", index + 1)
    return starts


def _gap_is_plain(gap: str) -> bool:
    """The lines between two top-level statements are blank or column-0 comments, the first blank
    (each side then owns the same lines, and AddImportsVisitor adds no blank line before it)."""
    lines = gap.split("\n")[:-1]
    return bool(lines) and lines[0] == "" and all(line == "" or line.startswith("#") for line in lines)


_DEFINITIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
_NOT_PLAIN = (ast.Import, ast.ImportFrom, ast.Global, ast.Nonlocal)
_ASSIGNS = (ast.Assign, ast.AugAssign, ast.AnnAssign)
_AST = ast.AST


def _last_name(node: ast.AST) -> Optional[str]:
    return node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None


def _facts(piece: Piece, tree: ast.Module, calls: frozenset = frozenset(), keywords: frozenset = frozenset()) -> bool:
    """Fill in what ``ast`` finds in ``piece``, in one walk of ``tree``; ``call_names`` from the
    calls of a function whose last name is in ``calls`` or with a keyword argument in ``keywords``.

    Returns whether the piece is plain: no import, ``global`` / ``nonlocal`` or attribute ``.mpu =
    ...`` anywhere in it (a group's scopes then reach the rest of the module only through the
    header's and the definitions' names). ``names`` are those of :func:`codemods._engine.base.ast_identifiers`;
    ``binds`` a superset of the names bound anywhere in it."""
    names, binds, call_names = piece.names, piece.binds, piece.call_names
    plain = True
    # (node, inside the arguments of an asked-about call, inside an assignment's target)
    stack: list[tuple[ast.AST, bool, bool]] = [(tree, False, False)]
    pop, push = stack.pop, stack.append
    while stack:
        node, in_call, in_target = pop()
        kind = type(node)
        if kind is ast.Name:
            names.add(node.id)
            binds.add(node.id)
            if in_call:
                call_names.add(node.id)
            continue
        if kind is ast.Attribute:
            names.add(node.attr)
            if in_target and node.attr == "mpu":
                plain = False
        elif kind is ast.keyword:
            if node.arg:
                names.add(node.arg)
        elif kind is ast.alias:
            names.update(node.name.split("."))
            binds.add((node.asname or node.name).split(".")[0])
        elif kind is ast.arg:
            binds.add(node.arg)
        elif kind in _DEFINITIONS:
            binds.add(node.name)
        elif kind in (ast.ExceptHandler, ast.MatchAs, ast.MatchStar):
            if node.name:
                binds.add(node.name)
        elif kind is ast.MatchMapping:
            if node.rest:
                binds.add(node.rest)
        elif kind in _NOT_PLAIN:
            plain = False
        elif kind is ast.Call:
            if not in_call and (_last_name(node.func) in calls or any(k.arg in keywords for k in node.keywords)):
                push((node.func, False, in_target))
                for child in (*node.args, *node.keywords):
                    push((child, True, in_target))
                continue
        elif kind in _ASSIGNS:
            for target in node.targets if kind is ast.Assign else (node.target,):
                push((target, in_call, True))
            for field_name in node._fields:
                if field_name not in ("targets", "target"):
                    value = getattr(node, field_name)
                    if isinstance(value, _AST):
                        push((value, in_call, in_target))
            continue
        for field_name in node._fields:
            value = getattr(node, field_name, None)
            if isinstance(value, list):
                for child in value:
                    if isinstance(child, _AST):
                        push((child, in_call, in_target))
            elif isinstance(value, _AST):
                push((value, in_call, in_target))
    piece.defs = [s.name for s in tree.body if isinstance(s, _DEFINITIONS)]
    return plain


def _header_facts(tree: ast.Module) -> Optional[tuple[dict[str, str], dict[str, str], set[str]]]:
    """({bound name: dotted import}, {alias: last part}, identifiers outside imports) of a header of
    simple statements, or None for a header holding a compound statement or a star import."""
    imports: dict[str, str] = {}
    aliases: dict[str, str] = {}
    code_names: set[str] = set()
    for statement in tree.body:
        if isinstance(
            statement,
            (
                ast.FunctionDef,
                ast.AsyncFunctionDef,
                ast.ClassDef,
                ast.If,
                ast.Try,
                ast.With,
                ast.For,
                ast.While,
                ast.AsyncFor,
                ast.AsyncWith,
                ast.Match,
            ),
        ):
            return None
        if isinstance(statement, (ast.Import, ast.ImportFrom)):
            base = "." * statement.level + (statement.module or "") if isinstance(statement, ast.ImportFrom) else ""
            for alias in statement.names:
                if alias.name == "*":
                    return None
                full = f"{base}.{alias.name}" if base else alias.name
                imports[(alias.asname or alias.name).split(".")[0]] = full
                if alias.asname:
                    aliases[alias.asname] = alias.name.rpartition(".")[2]
        else:
            code_names |= ast_identifiers(statement)
    return imports, aliases, code_names


def plan(source: str, calls: frozenset = frozenset(), keywords: frozenset = frozenset()) -> Optional[Plan]:
    """``source`` cut into a header (the top-level statements before the first definition, all simple
    statements) and units of top-level ``def`` / ``class`` statements (one each, or several where
    the text between them is no place to cut), or None when the file does
    not have that shape: a statement after the first definition that is not one, an import,
    ``global`` / ``nonlocal`` or ``.mpu`` assignment inside a definition, a header over
    :data:`HEADER_BYTES`, a line ending other
    than ``\\n``, or lines between definitions other than blank lines and column-0 comments.
    ``calls`` / ``keywords``: the calls whose argument names each piece's ``call_names`` holds
    (import aliases of ``calls`` count as ``calls``)."""
    if "\r" in source or not source.endswith("\n"):
        return None
    starts = _line_starts(source)
    scanned = _scanned_definitions(source, starts)
    if scanned is _FALLBACK:
        scanned = _statements(source)
    if scanned is None or not scanned[0]:
        return None
    statements, indent = scanned
    first = next((i for i, (_, token, _) in enumerate(statements) if token in _DEFINITION_STARTS), None)
    if not first or any(token not in _DEFINITION_STARTS for _, token, _ in statements[first:]):
        return None
    cuts: list[int] = []  # offset where each definition's text (its leading lines) begins
    for line, _, before in statements[first:]:
        cut, begin = starts[before], starts[line - 1]
        if not _gap_is_plain(source[cut:begin]):
            cuts.append(-1)  # not a place to cut: it joins the group before
            continue
        cuts.append(cut)
    if cuts[0] < 0:
        return None
    if cuts[0] > HEADER_BYTES:
        return None
    header = Piece(source[: cuts[0]], first)
    try:
        header_tree = ast.parse(header.text)
    except (SyntaxError, ValueError):
        return None
    found = _header_facts(header_tree)
    if found is None:
        return None
    calls = calls | {alias for alias, name in found[1].items() if name in calls}
    _facts(header, header_tree, calls, keywords)
    del header_tree
    units: list[Piece] = []
    bounds = [c for c in cuts if c >= 0] + [len(source)]
    counts = [0] * len(bounds)
    at = -1
    for cut in cuts:
        at += cut >= 0
        counts[at] += 1
    for begin, end, count in zip(bounds, bounds[1:], counts):
        unit = Piece(source[begin:end], count)
        try:
            tree = ast.parse(unit.text)
        except (SyntaxError, ValueError):
            return None
        if len(tree.body) != unit.statements or not _facts(unit, tree, calls, keywords):
            return None
        units.append(unit)
    return Plan(header, units, *found, indent)


@dataclass
class Group:
    """Consecutive units migrated together (``candidate``) or kept as they are."""

    text: str
    statements: int
    candidate: bool
    units: range  # their indices in Plan.units


def groups(plan: Plan, candidate: Callable[[Piece], bool], group_bytes: Optional[int] = None) -> list[Group]:
    """``plan``'s units in runs of the same ``candidate`` answer, a run of candidates cut after
    ``group_bytes`` (default :data:`GROUP_BYTES`) of source."""
    limit = GROUP_BYTES if group_bytes is None else group_bytes
    found: list[Group] = []
    units = plan.units
    answers = [candidate(u) for u in units]
    begin, size = 0, 0
    for index, unit in enumerate(units):
        size += len(unit.text)
        last = index + 1 == len(units)
        if not last and answers[index + 1] == answers[begin] and not (answers[begin] and size >= limit):
            continue
        chosen = units[begin : index + 1]
        found.append(
            Group(
                "".join(u.text for u in chosen),
                sum(u.statements for u in chosen),
                answers[begin],
                range(begin, index + 1),
            )
        )
        begin, size = index + 1, 0
    return found


def batches(found: list[Group], group_bytes: Optional[int] = None) -> list[list[int]]:
    """The indices of ``found``'s candidate groups in runs migrated together, skipping the groups
    kept between them (whose definitions name nothing a codemod acts at), each run cut after
    ``group_bytes`` (default :data:`GROUP_BYTES`) of source: a sparse file then pays the per-module
    cost of the codemods once per ~``group_bytes``, not once per definition holding a site."""
    limit = GROUP_BYTES if group_bytes is None else group_bytes
    runs: list[list[int]] = []
    size = limit
    for index, group in enumerate(found):
        if not group.candidate:
            continue
        if size >= limit:
            runs.append([])
            size = 0
        runs[-1].append(index)
        size += len(group.text)
    return runs


def split_statements(tree: cst.Module, rest: str, counts: list[int]) -> Optional[list[str]]:
    """``rest`` (the code of ``tree``'s last ``sum(counts)`` top-level statements and its footer)
    cut into the code of each run of ``counts`` statements, the footer with the last; None when
    the statements' code does not concatenate to ``rest``."""
    if len(counts) == 1:
        return [rest]
    body = tree.body[len(tree.body) - sum(counts) :]
    pieces, at = [], 0
    for count in counts:
        pieces.append("".join(tree.code_for_node(statement) for statement in body[at : at + count]))
        at += count
    joined = "".join(pieces)
    if not rest.startswith(joined):
        return None
    pieces[-1] += rest[len(joined) :]
    return pieces


def split_output(tree: cst.Module, definitions: int) -> Optional[tuple[str, str]]:
    """(header, rest) of the code of a migrated piece module whose last ``definitions`` top-level
    statements are the group's definitions, or None when its shape is not that."""
    body = tree.body
    if len(body) < definitions or not all(
        isinstance(s, (cst.FunctionDef, cst.ClassDef)) for s in body[len(body) - definitions :]
    ):
        return None
    code = tree.code
    head = tree.with_changes(body=body[: len(body) - definitions], footer=(), has_trailing_newline=True).code
    if not body[: len(body) - definitions]:
        head = tree.with_changes(body=(), footer=()).code if tree.header else ""
    if not code.startswith(head):
        return None
    return head, code[len(head) :]


def header_with_runtime(header: str, add_runtime) -> Optional[str]:
    """``header`` (a migrated header's code) as ``add_runtime`` leaves it when definitions follow:
    parsed with a placeholder statement after it, which stands for the first definition."""
    placeholder = "pass\n"
    code = add_runtime(cst.parse_module(header + placeholder)).code
    return code[: -len(placeholder)] if code.endswith(placeholder) else None
