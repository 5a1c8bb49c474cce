"""Added ``mesh_core`` imports go in the scope of the legacy import they replace.

libcst's ``AddImportsVisitor`` puts every added import at the top of the module. A module that imports
DeepSpeed only inside a function (``def f(): from deepspeed.utils import groups``) or under a guard
(``try: import deepspeed``) uses it optionally; a module-level ``from mesh_core import ...`` would make
importing it need ds-mesh. So: a function that imported a legacy module itself gets the ``mesh_core``
names its code (nested functions included) now uses as a function-level import at the top of its body;
code outside such functions gets the import after the module's guarded legacy import (in that block)
when the module has no unconditional top-level one. A file that imports DeepSpeed unconditionally at
the top keeps the module-level import, after every module-level statement that ran before its first
legacy import (a start-time stamp taken before the heavy imports stays before them).
"""

from __future__ import annotations

from typing import Optional, Union

import libcst as cst

MESH_MODULE = "mesh_core"
_LEGACY_ROOTS = ("deepspeed", "compat")
_EMPTY = cst.Module([])


def _code(node: cst.CSTNode) -> str:
    return _EMPTY.code_for_node(node)


def _modules(node: Union[cst.Import, cst.ImportFrom]) -> list[str]:
    if isinstance(node, cst.Import):
        return [_code(a.name) for a in node.names]
    return ["." * len(node.relative) + (_code(node.module) if node.module else "")]


def _is_legacy(node: cst.CSTNode, in_package: bool) -> bool:
    if not isinstance(node, (cst.Import, cst.ImportFrom)):
        return False
    return any(m.split(".")[0] in _LEGACY_ROOTS or (in_package and m.startswith(".")) for m in _modules(node))


def _mesh_names(statement: cst.CSTNode) -> Optional[list[str]]:
    """The names a lone ``from mesh_core import a, b`` / ``import mesh_core`` line binds, else None."""
    if not isinstance(statement, cst.SimpleStatementLine) or len(statement.body) != 1:
        return None
    node = statement.body[0]
    if (
        isinstance(node, cst.ImportFrom)
        and not node.relative
        and node.module is not None
        and _code(node.module) == MESH_MODULE
        and not isinstance(node.names, cst.ImportStar)
    ):
        if all(a.asname is None for a in node.names):
            return [_code(a.name) for a in node.names]
    if (
        isinstance(node, cst.Import)
        and len(node.names) == 1
        and _code(node.names[0].name) == MESH_MODULE
        and node.names[0].asname is None
    ):
        return [MESH_MODULE]
    return None


class _LegacyImports(cst.CSTVisitor):
    """Which functions (by preorder index) import a legacy module in their own body; whether the
    module does so unconditionally at its top level; the first guarded module-level one."""

    def __init__(self, in_package: bool) -> None:
        self.in_package = in_package
        self.lazy: set[int] = set()
        self.plain = False
        self.guarded: Optional[cst.SimpleStatementLine] = None
        self._count = 0
        self._functions: list[int] = []
        self._bodies: list = []
        # function -> (index in its body, the line) of its first legacy import among its own statements
        self.first: dict[int, tuple[int, cst.SimpleStatementLine]] = {}
        # function -> (index of a ``try`` in its body, index in that try's body, the line) when its first
        # legacy import stands in the body of a ``try`` of its own
        self.in_try: dict[int, tuple[int, int, cst.SimpleStatementLine]] = {}
        # function -> the statement after its first legacy import (its blank lines, as the source had them)
        self.after: dict[int, cst.BaseStatement] = {}
        self._tries: list = []

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self._functions.append(self._count)
        self._bodies.append(list(node.body.body) if isinstance(node.body, cst.IndentedBlock) else [])
        self._count += 1

    def leave_FunctionDef(self, original_node: cst.FunctionDef) -> None:
        self._functions.pop()
        self._bodies.pop()

    def visit_Try(self, node: cst.Try) -> None:
        self._tries.append(node)

    def leave_Try(self, original_node: cst.Try) -> None:
        self._tries.pop()

    def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> bool:
        if any(_is_legacy(s, self.in_package) for s in node.body):
            if self._functions:
                function = self._functions[-1]
                body = self._bodies[-1]
                if function not in self.lazy and function not in self.first and self._tries:
                    guard = self._tries[-1]
                    at = next((i for i, s in enumerate(body) if s is guard), None)
                    inner = next((i for i, s in enumerate(guard.body.body) if s is node), None)
                    if at is not None and inner is not None:
                        self.in_try[function] = (at, inner, node)
                self.lazy.add(self._functions[-1])
                if self._functions[-1] not in self.first and any(s is node for s in body):
                    at = next(i for i, s in enumerate(body) if s is node)
                    self.first[self._functions[-1]] = (at, node)
                    if at + 1 < len(body):
                        self.after[self._functions[-1]] = body[at + 1]
            elif self._top is not None and node in self._top:
                self.plain = True
            elif self.guarded is None:
                self.guarded = node
        return False

    def visit_Module(self, node: cst.Module) -> None:
        self._top = set(node.body)


class _Uses(cst.CSTVisitor):
    """Per function (preorder index; -1 for the module) the mesh names used in its own code."""

    def __init__(self, names: set[str], lazy: set[int]) -> None:
        self.names, self.lazy = names, lazy
        self.used: dict[int, set[str]] = {}
        self._count = 0
        self._owners: list[int] = [-1]  # the nearest enclosing lazy function, or -1

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        index = self._count
        self._count += 1
        self._owners.append(index if index in self.lazy else self._owners[-1])

    def leave_FunctionDef(self, original_node: cst.FunctionDef) -> None:
        self._owners.pop()

    def visit_Attribute(self, node: cst.Attribute) -> bool:
        node.value.visit(self)  # not the attribute name
        return False

    def visit_Arg(self, node: cst.Arg) -> bool:
        node.value.visit(self)  # not the keyword
        return False

    def visit_Import(self, node: cst.Import) -> bool:
        return False

    def visit_ImportFrom(self, node: cst.ImportFrom) -> bool:
        return False

    def visit_Name(self, node: cst.Name) -> None:
        if node.value in self.names:
            self.used.setdefault(self._owners[-1], set()).add(node.value)


def _import_line(names) -> cst.SimpleStatementLine:
    if list(names) == [MESH_MODULE]:
        return cst.parse_statement(f"import {MESH_MODULE}\n")
    return cst.parse_statement(f"from {MESH_MODULE} import {', '.join(sorted(names))}\n")


class _Place(cst.CSTTransformer):
    def __init__(
        self, used: dict[int, set[str]], guarded: Optional[str], split: bool, first=None, in_try=None, after=None
    ) -> None:
        self.used, self.guarded, self.split = used, guarded, split
        self.first = first or {}
        self.after = after or {}
        self.in_try = in_try or {}
        self._count = 0
        self._stack: list[int] = []
        self.placed_guarded = False

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self._stack.append(self._count)
        self._count += 1

    def leave_FunctionDef(self, original_node, updated_node):
        index = self._stack.pop()
        names = self.used.get(index)
        if not names or not isinstance(updated_node.body, cst.IndentedBlock):
            return updated_node
        body = list(updated_node.body.body)
        line = _import_line(self._split(names))
        guarded = self._into_try(index, body, line)
        if guarded is not None:
            return updated_node.with_changes(body=updated_node.body.with_changes(body=guarded))
        at = 1 if body and _is_docstring(body[0]) else 0
        replaced = self.first.get(index)
        if (
            replaced is not None
            and replaced[0] == at
            and not (at < len(body) and _bare(body[at]) == _bare(replaced[1]))
        ):
            # the removed legacy import stood here: the new one takes its place and its blank lines,
            # and the statement after it has its own back (the removal may have handed it the import's)
            line = line.with_changes(leading_lines=replaced[1].leading_lines)
            after = self.after.get(index)
            if after is not None and at < len(body) and type(body[at]) is type(after):
                body[at] = body[at].with_changes(leading_lines=after.leading_lines)
        body.insert(at, line)
        return updated_node.with_changes(body=updated_node.body.with_changes(body=body))

    def _into_try(self, index: int, body: list, line: cst.SimpleStatementLine) -> Optional[list]:
        """``body`` with ``line`` where the function's first legacy import stood inside its ``try``
        (the new import is bound under the same guard, as the legacy one was); None when that
        ``try`` is not where it was."""
        found = self.in_try.get(index)
        if found is None:
            return None
        at, inner, replaced = found
        guard = body[at] if at < len(body) else None
        if not isinstance(guard, cst.Try) or not isinstance(guard.body, cst.IndentedBlock):
            return None
        statements = list(guard.body.body)
        if inner > len(statements):
            return None
        line = line.with_changes(leading_lines=replaced.leading_lines)
        if inner < len(statements) and _bare(statements[inner]) == "pass\n" and _bare(replaced) != "pass\n":
            statements[inner] = line  # the placeholder libcst left for the removed import
        else:
            statements.insert(inner, line)
        body[at] = guard.with_changes(body=guard.body.with_changes(body=statements))
        return body

    def _split(self, names: set[str]) -> set[str]:
        return {MESH_MODULE} if self.split else names

    def leave_IndentedBlock(self, original_node, updated_node):
        if self.guarded is None or self._stack or self.placed_guarded:
            return updated_node
        body = list(updated_node.body)
        for i, statement in enumerate(body):
            if isinstance(statement, cst.SimpleStatementLine) and _code(statement).strip() == self.guarded:
                body.insert(i + 1, _import_line(self._split(self.used[-1])))
                self.placed_guarded = True
                return updated_node.with_changes(body=body)
        return updated_node


def _is_docstring(statement: cst.CSTNode) -> bool:
    return (
        isinstance(statement, cst.SimpleStatementLine)
        and isinstance(statement.body[0], cst.Expr)
        and isinstance(statement.body[0].value, (cst.SimpleString, cst.ConcatenatedString))
    )


def localize(source: cst.Module, tree: cst.Module, *, in_package: bool) -> cst.Module:
    """``tree`` (the migration of ``source``) with the ``mesh_core`` imports it added at module level
    moved into the scopes of the legacy imports they replace (see the module docstring)."""
    before = {_code(s) for s in source.body}
    added = [(i, s, _mesh_names(s)) for i, s in enumerate(tree.body) if _code(s) not in before]
    added = [(i, s, names) for i, s, names in added if names]
    if not added:
        return tree
    legacy = _LegacyImports(in_package)
    source.visit(legacy)
    if legacy.plain:
        return _after_early_statements(source, tree, added, in_package)
    if not legacy.lazy and legacy.guarded is None:
        return tree
    names = {n for _, _, found in added for n in found}
    uses = _Uses(names, legacy.lazy)
    tree.visit(uses)
    outside = uses.used.get(-1)
    guarded = _code(legacy.guarded).strip() if outside and legacy.guarded is not None else None
    if outside and guarded is None:
        return tree  # module-level code needs the names and there is no guarded import to follow
    place = _Place(
        uses.used, guarded, split=names == {MESH_MODULE}, first=legacy.first, in_try=legacy.in_try, after=legacy.after
    )
    placed = tree.visit(place)
    if guarded is not None and not place.placed_guarded:
        return tree
    drop = {i for i, _, _ in added}
    body = [s for i, s in enumerate(placed.body) if i not in drop]
    # the statement after the dropped imports gets back the blank lines it had in the source
    # (AddImportsVisitor separated it from the import it added)
    first = min(drop)
    if first < len(body) and first < len(source.body) and type(body[first]) is type(source.body[first]):
        body[first] = body[first].with_changes(leading_lines=source.body[first].leading_lines)
    return placed.with_changes(body=body)


def _after_early_statements(source: cst.Module, tree: cst.Module, added: list, in_package: bool) -> cst.Module:
    """``tree`` with the module-level ``mesh_core`` imports ``added`` moved after the last statement
    other than an import that the source runs before its first top-level legacy import."""
    first = next(
        (
            i
            for i, s in enumerate(source.body)
            if isinstance(s, cst.SimpleStatementLine) and any(_is_legacy(n, in_package) for n in s.body)
        ),
        None,
    )
    if first is None:
        return tree
    early = [
        s for i, s in enumerate(source.body[:first]) if not _is_import_line(s) and not (i == 0 and _is_docstring(s))
    ]
    if not early:
        return tree
    last = _bare(early[-1])
    at = next((i for i, s in enumerate(tree.body) if _bare(s) == last), None)
    drop = {i for i, _, _ in added}
    if at is None or min(drop) > at:
        return tree
    moved = [s for i, s, _ in added]
    body = [s for i, s in enumerate(tree.body) if i not in drop]
    at = body.index(tree.body[at])
    # the statement after the moved imports gets back the blank lines it had in the source
    after = min(drop)
    if after < len(body) and after < len(source.body) and type(body[after]) is type(source.body[after]):
        body[after] = body[after].with_changes(leading_lines=source.body[after].leading_lines)
    moved[0] = moved[0].with_changes(leading_lines=())
    return tree.with_changes(body=[*body[: at + 1], *moved, *body[at + 1 :]])


def _bare(statement: cst.CSTNode) -> str:
    return _code(statement.with_changes(leading_lines=()) if hasattr(statement, "leading_lines") else statement)


def _is_import_line(statement: cst.CSTNode) -> bool:
    return isinstance(statement, cst.SimpleStatementLine) and all(
        isinstance(s, (cst.Import, cst.ImportFrom)) for s in statement.body
    )


def keep_blank_lines(source: cst.Module, tree: cst.Module) -> cst.Module:
    """``tree`` where the module-level statement right after an import line the migration added, and
    the runtime lines (``import compat`` / ``compat.install()``) before a statement of ``source``,
    have the blank lines (and comments) that statement had in ``source``: libcst's import pass
    separates the code after the imports it adds with a blank line the source may not have had."""
    before = {_code(s) for s in source.body}
    bare: dict[str, list] = {}
    for statement in source.body:
        bare.setdefault(_bare(statement), []).append(statement)
    body = list(tree.body)
    changed = False
    added = 0  # module-level lines the migration added before the current one
    for i in range(len(body) - 2):  # the runtime lines take the place (and blank lines) of what follows them
        runtime = _bare(body[i]) == "import compat\n" and _bare(body[i + 1]).startswith("compat.install()")
        if runtime and _code(body[i]) not in before:
            k = i - added  # the source statement the runtime lines stand before
            if (
                k < len(source.body)
                and type(body[i + 2]) is type(source.body[k])
                and _bare(body[i + 2]).split("\n")[0] == _bare(source.body[k]).split("\n")[0]
                and body[i].leading_lines != source.body[k].leading_lines
            ):
                body[i] = body[i].with_changes(leading_lines=source.body[k].leading_lines)
                changed = True
        if _code(body[i]) not in before and (_is_import_line(body[i]) or _bare(body[i]).startswith("compat.install()")):
            added += 1
    for i in range(1, len(body)):
        previous, statement = body[i - 1], body[i]
        if _code(previous) in before or not _is_import_line(previous) or _code(statement) in before:
            continue
        same = bare.get(_bare(statement), [])
        if len(same) == 1 and not _is_import_line(statement):
            body[i] = statement.with_changes(leading_lines=same[0].leading_lines)
            changed = True
    return tree.with_changes(body=body) if changed else tree
