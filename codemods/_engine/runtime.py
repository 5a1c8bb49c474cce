"""Migrated scripts that need the mesh runtime activate it.

DeepSpeed 0.19.8 neither reads the config's ``"mesh"`` section nor gives engines a mesh: without
``compat.install()`` a migrated ``engine.mesh_device`` is None and a moved ``mpu=`` is lost. A file
whose migration relies on the engine's mesh (``<engine>.mesh_device`` after
``deepspeed.initialize``, or ``mpu=`` / ``mesh_param=`` moved into the config) gets ``import compat``
and ``compat.install()``.

Both the decision and the place come from the code, never from comments:

- needed when a ``mpu=`` / ``mesh_param=`` was moved, or the migrated code reads more
  ``<x>.mesh_device`` (``x`` not ``self``) than the source did, and the code names ``initialize``
  and does not call ``compat.install()`` already;
- placed right before the first statement that imports a deepspeed module (or any star import, which
  may bind a deepspeed name), in the block that holds it: inside the same ``if`` guard (and a
  ``try`` that does not catch ``ImportError``; before one that does, so a missing ds-mesh is never
  taken for a missing deepspeed),
  after every module-level statement that ran before it (a start-time stamp). Where the module
  imports deepspeed only inside functions, each such function gets the lines before its import.
  Where it imports no deepspeed module at all, after the module's leading imports.
"""

from __future__ import annotations

import ast
from collections import Counter
from typing import Optional, Sequence, Union

import libcst as cst

RUNTIME_KINDS = ("initialize mpu", "initialize mesh_param")
INSTALL = "compat.install()"
COMMENT = '# the mesh runtime: deepspeed.initialize reads the config\'s "mesh" section'


class _Facts(cst.CSTVisitor):
    """What :func:`needs_runtime` reads of a libcst tree: the identifiers the code uses (those
    ``ast`` holds as names, attributes, keywords and imported names: not the names a ``def``,
    ``class``, parameter, ``as`` or ``global`` binds), whether it installs the runtime, and its
    ``<x>.mesh_device`` reads with ``x`` not ``self``."""

    def __init__(self) -> None:
        super().__init__()
        self.names: set[str] = set()
        self.mesh_reads = 0
        self._bare_install: set[str] = set()  # names ``from compat import install [as x]`` binds
        self._calls: list[cst.Call] = []
        self._skip = 0

    def _skipping(self, node) -> None:
        self._skip += 1

    def _done(self, node) -> None:
        self._skip -= 1

    visit_FunctionDef_name = visit_ClassDef_name = visit_Param_name = _skipping
    visit_ImportAlias_asname = visit_ExceptHandler_name = visit_NameItem_name = _skipping
    visit_MatchAs_name = visit_MatchStar_name = visit_MatchMapping_rest = _skipping
    leave_FunctionDef_name = leave_ClassDef_name = leave_Param_name = _done
    leave_ImportAlias_asname = leave_ExceptHandler_name = leave_NameItem_name = _done
    leave_MatchAs_name = leave_MatchStar_name = leave_MatchMapping_rest = _done

    def visit_Name(self, node: cst.Name) -> None:
        if not self._skip:
            self.names.add(node.value)

    def visit_Attribute(self, node: cst.Attribute) -> None:
        if node.attr.value == "mesh_device" and not (isinstance(node.value, cst.Name) and node.value.value == "self"):
            self.mesh_reads += 1

    def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
        module = cst.Module([]).code_for_node(node.module) if node.module is not None else ""
        if module == "compat" and not node.relative and not isinstance(node.names, cst.ImportStar):
            for alias in node.names:
                if isinstance(alias.name, cst.Name) and alias.name.value == "install":
                    self._bare_install.add(alias.evaluated_alias or "install")

    def visit_Call(self, node: cst.Call) -> None:
        self._calls.append(node)

    def installs(self) -> bool:
        for call in self._calls:
            func = call.func
            if (
                isinstance(func, cst.Attribute)
                and func.attr.value == "install"
                and isinstance(func.value, cst.Name)
                and func.value.value == "compat"
            ):
                return True
            if isinstance(func, cst.Name) and func.value in self._bare_install:
                return True
        return False


def _facts(code: Union[str, cst.Module]) -> Optional[_Facts]:
    try:
        tree = code if isinstance(code, cst.Module) else cst.parse_module(code)
    except cst.ParserSyntaxError:
        return None
    facts = _Facts()
    tree.visit(facts)
    return facts


def installs(tree: Union[ast.AST, cst.Module]) -> bool:
    """``tree`` (an ``ast`` or a libcst tree) calls ``compat.install()`` (or ``install()`` imported
    from ``compat``)."""
    if isinstance(tree, cst.Module):
        facts = _facts(tree)
        return facts is not None and facts.installs()
    bare = {
        a.asname or a.name
        for n in ast.walk(tree)
        if isinstance(n, ast.ImportFrom) and n.module == "compat"
        for a in n.names
        if a.name == "install"
    }
    for n in ast.walk(tree):
        if not isinstance(n, ast.Call):
            continue
        func = n.func
        if (
            isinstance(func, ast.Attribute)
            and func.attr == "install"
            and isinstance(func.value, ast.Name)
            and func.value.id == "compat"
        ):
            return True
        if isinstance(func, ast.Name) and func.id in bare:
            return True
    return False


def needs_runtime(
    source: Union[str, cst.Module],
    code: Union[str, cst.Module],
    sites: Counter,
) -> bool:
    """The migrated ``code`` of ``source`` relies on the engine's mesh and does not install the runtime
    (decided from the code: comments say nothing). Both are read with libcst's parser (text or an
    already parsed tree), never the running interpreter's: the decision is the same on every
    Python, also where the rewrite has put quotes inside an f-string that only 3.12 reads."""
    text = code.code if isinstance(code, cst.Module) else code
    if "initialize" not in text:  # cheap: no code names it if the text does not
        return False
    moved = any(sites.get(kind) for kind in RUNTIME_KINDS)
    if not moved and "mesh_device" not in text:
        return False
    after = _facts(code)
    if after is None or "initialize" not in after.names or after.installs():
        return False
    if moved:
        return True
    before = _facts(source)
    return before is not None and after.mesh_reads > before.mesh_reads


# --- placement ------------------------------------------------------------------------------------
def _binds_deepspeed(node: cst.BaseSmallStatement) -> bool:
    """``node`` imports a deepspeed module, or is a star import (which may bind a deepspeed name)."""
    if isinstance(node, cst.Import):
        return any(cst.Module([]).code_for_node(a.name).split(".")[0] == "deepspeed" for a in node.names)
    if isinstance(node, cst.ImportFrom):
        if isinstance(node.names, cst.ImportStar):
            return True
        if node.relative or node.module is None:
            return False
        return cst.Module([]).code_for_node(node.module).split(".")[0] == "deepspeed"
    return False


def _blocks(statement: cst.BaseCompoundStatement, *, functions: bool) -> list[cst.BaseSuite]:
    """The suites of ``statement`` that run when it runs (a function's body only with ``functions``)."""
    if isinstance(statement, cst.FunctionDef) and not functions:
        return []
    suites: list = [getattr(statement, "body", None)]
    if isinstance(statement, cst.Try) or isinstance(statement, getattr(cst, "TryStar", ())):
        suites += [h.body for h in statement.handlers]
    orelse = getattr(statement, "orelse", None)
    while isinstance(orelse, cst.If):  # elif chains
        suites.append(orelse.body)
        orelse = orelse.orelse
    if orelse is not None:
        suites.append(orelse.body)
    final = getattr(statement, "finalbody", None)
    if final is not None:
        suites.append(final.body)
    if isinstance(statement, cst.Match):
        suites += [c.body for c in statement.cases]
    return [s for s in suites if isinstance(s, cst.IndentedBlock)]


def _first_import(statements: Sequence[cst.BaseStatement], *, functions: bool) -> Optional[list]:
    """The path to the first statement among ``statements`` (and the blocks that run with them) that
    imports deepspeed; None if there is none. With ``functions``, function bodies count too."""
    for i, statement in enumerate(statements):
        if isinstance(statement, cst.SimpleStatementLine):
            if any(_binds_deepspeed(s) for s in statement.body):
                return [i]
        elif isinstance(statement, cst.BaseCompoundStatement):
            for k, suite in enumerate(_blocks(statement, functions=functions)):
                inner = _first_import(suite.body, functions=functions)
                if inner is not None:
                    return [i, k, *inner]
    return None


def _lines() -> list[cst.SimpleStatementLine]:
    return [cst.parse_statement("import compat\n"), cst.parse_statement(f"{INSTALL}  {COMMENT}\n")]


def _insert(statements: Sequence[cst.BaseStatement], path: list, *, functions: bool) -> list:
    """``statements`` with the runtime lines before the statement at ``path``."""
    body = list(statements)
    i = path[0]
    if len(path) == 1:
        target = body[i]
        lines = _lines()
        lines[0] = lines[0].with_changes(leading_lines=target.leading_lines)
        body[i : i + 1] = [*lines, target.with_changes(leading_lines=())]
        return body
    statement = body[i]
    suites = _blocks(statement, functions=functions)
    old = suites[path[1]]
    new = old.with_changes(body=_insert(old.body, path[2:], functions=functions))
    body[i] = statement.deep_replace(old, new)
    return body


def module_imports_deepspeed(tree: cst.Module) -> bool:
    """Module-level code (guards and class bodies included, functions not) imports deepspeed."""
    return _first_import(tree.body, functions=False) is not None


def _in_functions(tree: cst.Module) -> Optional[cst.Module]:
    """``tree`` with the runtime lines before the first deepspeed import of each function that has
    one (None: no function has)."""

    class _Functions(cst.CSTTransformer):
        changed = False

        def leave_FunctionDef(self, original_node, updated_node):
            if not isinstance(updated_node.body, cst.IndentedBlock):
                return updated_node
            path = _first_import(updated_node.body.body, functions=False)
            if path is None:
                return updated_node
            path = _outside_import_guards(updated_node.body.body, path, functions=False)
            self.changed = True
            body = _insert(updated_node.body.body, path, functions=False)
            return updated_node.with_changes(body=updated_node.body.with_changes(body=body))

    visitor = _Functions()
    new = tree.visit(visitor)
    return new if visitor.changed else None


def _after_leading_imports(tree: cst.Module) -> cst.Module:
    body = list(tree.body)
    index = 0
    for i, statement in enumerate(body):
        if isinstance(statement, cst.SimpleStatementLine) and all(
            isinstance(s, (cst.Import, cst.ImportFrom)) for s in statement.body
        ):
            index = i + 1
        elif (
            i == 0
            and isinstance(statement, cst.SimpleStatementLine)
            and isinstance(statement.body[0], cst.Expr)
            and isinstance(statement.body[0].value, (cst.SimpleString, cst.ConcatenatedString))
        ):
            index = 1  # the docstring
        else:
            break
    return tree.with_changes(body=[*body[:index], *_lines(), *body[index:]])


_IMPORT_ERRORS = frozenset({"ImportError", "ModuleNotFoundError", "Exception", "BaseException"})


def _names_import_error(kind: cst.BaseExpression) -> bool:
    types = [e.value for e in kind.elements] if isinstance(kind, cst.Tuple) else [kind]
    for t in types:
        name = t.attr.value if isinstance(t, cst.Attribute) else getattr(t, "value", None)
        if name in _IMPORT_ERRORS:
            return True
    return False


def _catches_import_error(statement: cst.CSTNode) -> bool:
    """``statement`` is a ``try`` with a handler catching ``ImportError`` (or a base, or bare), or a
    ``with contextlib.suppress(...)`` of one."""
    if isinstance(statement, cst.With):
        for item in statement.items:
            call = item.item
            func = (
                call.func.attr
                if isinstance(call, cst.Call) and isinstance(call.func, cst.Attribute)
                else getattr(call, "func", None)
            )
            if isinstance(func, cst.Name) and func.value == "suppress":
                if any(_names_import_error(arg.value) for arg in call.args):
                    return True
        return False
    if not isinstance(statement, (cst.Try, getattr(cst, "TryStar", cst.Try))):
        return False
    return any(handler.type is None or _names_import_error(handler.type) for handler in statement.handlers)


def _outside_import_guards(statements: Sequence[cst.BaseStatement], path: list, *, functions: bool) -> list:
    """``path`` cut at the first ``try`` on it whose handler catches ``ImportError``: the runtime
    lines go before that ``try``, never inside the user's "no deepspeed" guard (where a missing
    ds-mesh would be taken for a missing deepspeed and silently turn the feature off). ``install()``
    works without deepspeed, so the user's guard still answers for deepspeed alone."""
    statement = statements[path[0]]
    if len(path) == 1:
        return path
    if _catches_import_error(statement):
        return path[:1]
    suite = _blocks(statement, functions=functions)[path[1]]
    return path[:2] + _outside_import_guards(suite.body, path[2:], functions=functions)


def add_runtime(tree: cst.Module) -> cst.Module:
    """``tree`` with ``import compat`` / ``compat.install()`` where the module docstring says."""
    path = _first_import(tree.body, functions=False)
    if path is not None:
        path = _outside_import_guards(tree.body, path, functions=False)
        return tree.with_changes(body=_insert(tree.body, path, functions=False))
    local = _in_functions(tree)
    if local is not None:
        return local
    return _after_leading_imports(tree)


def runtime_lines(statement: Union[cst.CSTNode, str]) -> bool:
    """``statement`` (code) is one of the two lines :func:`add_runtime` writes."""
    text = statement if isinstance(statement, str) else cst.Module([]).code_for_node(statement)
    text = text.strip()
    return text == "import compat" or text.startswith(INSTALL)
