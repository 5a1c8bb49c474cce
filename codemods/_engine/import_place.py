"""Imports the migration added at the top of a module go where isort's default profile would put them.

libcst's import pass appends an added import (``from mesh_core import ...``, ``import
torch.distributed``) after the module's last leading import, whatever group that is. For a user,
``mesh_core`` is a third-party package: an added import of a package that is not in the standard
library goes into the module's third-party group, the blank-line-separated group of leading imports
that imports ``deepspeed`` (else ``torch``), at its sorted place there: ``import x`` lines before
``from x import ...`` lines, each ordered by module name (case-insensitively), the names of a
``from`` import ordered as isort orders them (constants, classes, then the rest). A module without
such a group keeps the import where it is.

Only the added lines move: the user's imports, the docstring, ``from __future__`` imports and the
runtime lines (``import compat`` / ``compat.install()``, whose place is :mod:`codemods._engine.runtime`'s)
stay; an added import moves up past import lines only (code a module runs before its legacy imports
stays before the mesh import, as :mod:`codemods._engine.local_imports` placed it) and down past no statement
naming what it binds; the statements before the first definition are all that is looked at (an
import under a guard stays where :mod:`codemods._engine.local_imports` put it). The
result depends only on the module's leading statements, so a header migrated apart from its
definitions (:mod:`codemods._engine.chunks`) gets the same bytes as the whole file.
"""

from __future__ import annotations

import re
import sys
from typing import Optional, Sequence, Union

import libcst as cst

from .runtime import runtime_lines

_EMPTY = cst.Module([])
# the groups an added third-party import joins: the first group importing one of these (in this order)
ANCHORS = ("deepspeed", "torch")
_STDLIB = frozenset(sys.stdlib_module_names) | {"__future__"}
_Import = Union[cst.Import, cst.ImportFrom]


def _code(node: cst.CSTNode) -> str:
    return _EMPTY.code_for_node(node)


def _bare(statement: cst.CSTNode) -> str:
    return _code(statement.with_changes(leading_lines=()))


def _lone_import(statement: cst.CSTNode) -> Optional[_Import]:
    if (
        isinstance(statement, cst.SimpleStatementLine)
        and len(statement.body) == 1
        and isinstance(statement.body[0], (cst.Import, cst.ImportFrom))
    ):
        return statement.body[0]
    return None


def _is_import_line(statement: cst.CSTNode) -> bool:
    return isinstance(statement, cst.SimpleStatementLine) and all(
        isinstance(s, (cst.Import, cst.ImportFrom)) for s in statement.body
    )


def leading(body: Sequence[cst.CSTNode]) -> int:
    """How many statements come before the module's first definition (its header: what
    :mod:`codemods._engine.chunks` migrates apart from the definitions)."""
    return next((i for i, s in enumerate(body) if isinstance(s, (cst.FunctionDef, cst.ClassDef))), len(body))


def _modules(node: _Import) -> list[str]:
    if isinstance(node, cst.Import):
        return [_code(a.name) for a in node.names]
    return ["." * len(node.relative) + (_code(node.module) if node.module else "")]


def _key(node: _Import) -> tuple[str, str]:
    """(kind, module) of an import: ``import`` / ``from``."""
    return ("from" if isinstance(node, cst.ImportFrom) else "import", _modules(node)[0])


def _third_party(module: str) -> bool:
    return not module.startswith(".") and module.split(".")[0] not in _STDLIB


def _name_order(name: str) -> tuple[int, str]:
    kind = 0 if name.isupper() and len(name) > 1 else 1 if name[:1].isupper() else 2
    return kind, name.lower()


def _sorted_names(statement: cst.SimpleStatementLine) -> cst.SimpleStatementLine:
    node = statement.body[0]
    if not isinstance(node, cst.ImportFrom) or isinstance(node.names, cst.ImportStar) or node.lpar is not None:
        return statement
    aliases = list(node.names)
    ordered = sorted(aliases, key=lambda a: _name_order(_code(a.name)))
    if ordered == aliases:
        return statement
    last = aliases[-1].comma
    names = [a.with_changes(comma=aliases[i].comma) for i, a in enumerate(ordered)]  # the commas stay in place
    names[-1] = names[-1].with_changes(comma=last)
    return statement.with_changes(body=[node.with_changes(names=names)])


def place_added_imports(source: cst.Module, tree: cst.Module) -> cst.Module:
    """``tree`` (the migration of ``source``) with each import line it added among the module's
    leading statements moved to its isort place (see the module docstring)."""
    end = leading(tree.body)
    if not end:
        return tree
    header = source.body[: leading(source.body)]
    before = {_bare(s) for s in header}
    region = list(tree.body[:end])
    kept_keys = {_key(_lone_import(s)) for s in region if _lone_import(s) is not None and _bare(s) in before}
    user_keys = {_key(_lone_import(s)) for s in header if _lone_import(s) is not None}
    moving = []
    for i, statement in enumerate(region):
        node = _lone_import(statement)
        if node is None or _bare(statement) in before or runtime_lines(statement):
            continue
        if isinstance(node, cst.Import) and len(node.names) != 1:
            continue
        key = _key(node)
        if not _third_party(key[1]) or (key in user_keys and key not in kept_keys):  # a user's line the passes changed
            continue
        moving.append(i)
    if not moving:
        return tree
    rest = [s for i, s in enumerate(region) if i not in moving]
    for i in moving:  # a moved line's blank lines stay where it was
        follower = next((j for j in range(i + 1, len(region)) if j not in moving), None)
        if not region[i].leading_lines:
            continue
        if follower is None or region[follower].leading_lines:
            return tree  # no place for its blank lines and comments: it stays where it is
        at = next(k for k, s in enumerate(rest) if s is region[follower])
        rest[at] = rest[at].with_changes(leading_lines=region[i].leading_lines)
    groups = _groups(rest)
    target = _anchor_group(groups, rest)
    if target is None:
        return tree
    lines = [_sorted_names(region[i].with_changes(leading_lines=())) for i in moving]
    places = sorted((_place(rest, groups[target], line), _order(line), n) for n, line in enumerate(lines))
    for (at, _), _, n in places:
        now = sum(1 for j in range(moving[n]) if j not in moving)  # its place among the other statements
        if not _may_move(rest[at:now] if at < now else rest[now:at], at < now, _bound(lines[n].body[0])):
            return tree
    body: list = []
    for k, statement in enumerate([*rest, None]):
        here = [lines[n] for (at, _), _, n in places if at == k]
        if here and any(joins for (at, joins), _, _ in places if at == k) and statement is not None:
            here[0] = here[0].with_changes(leading_lines=statement.leading_lines)
            statement = statement.with_changes(leading_lines=())
        body += here
        if statement is not None:
            body.append(statement)
    return tree.with_changes(body=[*body, *tree.body[end:]])


def _bound(node: _Import) -> set[str]:
    if isinstance(node, cst.Import):
        return {_code(a.asname.name) if a.asname else _code(a.name).split(".")[0] for a in node.names}
    return (
        {_code(a.asname.name if a.asname else a.name) for a in node.names}
        if not isinstance(node.names, cst.ImportStar)
        else {"*"}
    )


def _may_move(crossed: list, up: bool, names: set[str]) -> bool:
    """An added import may move up past import lines only (what ran before it stays before it), and
    down past statements that do not name what it binds."""
    if up:
        return all(_is_import_line(s) or runtime_lines(s) for s in crossed)
    if "*" in names:
        return not crossed
    words = re.compile(r"\b(?:" + "|".join(re.escape(n) for n in sorted(names)) + r")\b")
    return not any(not _is_import_line(s) and words.search(_code(s)) for s in crossed)


def _groups(statements: list) -> list[list[int]]:
    """Indices of ``statements`` split into groups at each statement with a blank line above it."""
    groups: list[list[int]] = []
    for i, statement in enumerate(statements):
        blank = any(line.comment is None for line in getattr(statement, "leading_lines", ()))
        if not groups or blank:
            groups.append([])
        groups[-1].append(i)
    return groups


def _anchor_group(groups: list[list[int]], statements: list) -> Optional[int]:
    """The first group importing ``deepspeed`` (else ``torch``), or None."""
    for anchor in ANCHORS:
        for g, members in enumerate(groups):
            for i in members:
                nodes = statements[i].body if _is_import_line(statements[i]) else ()
                if any(m.split(".")[0] == anchor for n in nodes for m in _modules(n)):
                    return g
    return None


def _order(line: cst.SimpleStatementLine) -> tuple[bool, str]:
    kind, module = _key(line.body[0])
    return kind == "from", module.lower()


def _place(rest: list, members: list[int], line: cst.SimpleStatementLine) -> tuple[int, bool]:
    """(index in ``rest`` that ``line`` goes before, whether it opens the group there) for its sorted
    place among the third-party imports of the group ``members``: before the first that sorts after
    it, else after the last of them (after the group's last line when it has none)."""
    mine = _order(line)
    third = [
        i
        for i in members
        if _lone_import(rest[i]) is not None
        and not runtime_lines(rest[i])
        and _third_party(_key(_lone_import(rest[i]))[1])
    ]
    for i in third:
        if _order(rest[i]) > mine:
            return i, i == members[0]
    return max(third or members) + 1, False
