"""Shared machinery of the migration codemods: legacy-name resolution, the model's mesh, counts,
and ``# TODOV1:`` comments for sites that cannot be rewritten safely."""

from __future__ import annotations

import ast
import string
from collections import Counter
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence, Union

import libcst as cst
from libcst.codemod import CodemodContext, SkipFile, VisitorBasedCodemodCommand
from libcst.codemod.visitors import AddImportsVisitor
from libcst.metadata import (
    ComprehensionScope,
    FunctionScope,
    GlobalScope,
    ParentNodeProvider,
    PositionProvider,
    QualifiedNameProvider,
    Scope,
    ScopeProvider,
)

from . import legacy_names as ln
from .imports import import_aliases, import_statements  # noqa: F401 (re-exported)
from .libcst_private import TransformRunHook
from .metadata import LazyMetadata, lazy, preorder
from .realign import realign
from .todo_links import TODO_TAG, todo_comment
from .todo_place import todo_above

SITES_KEY = "codemods.sites"
TODOS_KEY = "codemods.todos"
MESH_MODULE = "mesh_core"
# what the codemods write into DeepSpeed's own modules that is not user API: imported from
# mesh_core.runtime_hooks (a copy of names in its __all__: the codemods never import mesh_core;
# tests/test_structure.py holds them in it)
HOOKS_MODULE = "mesh_core.runtime_hooks"
RUNTIME_HOOK_NAMES = frozenset(
    {
        "autotp_groups",
        "create_hpz_group",
        "expert_groups_named",
        "expert_tensor_parallel_size",
        "hpz_group",
        "hpz_group_rank",
        "hpz_group_ranks",
        "hpz_group_size",
        "init_autotp",
        "largest_expert_groups_name",
        "local_all_to_all_groups",
        "model_parallel_world_size",
        "named_expert_data_parallel_groups",
        "named_expert_parallel_groups",
    }
)
# Within a piecewise migration (codemods._engine.pipeline), every (name, bound to something else here)
# that mesh_ref decided, for the check that the whole file would decide the same.
MESH_REFS: ContextVar[Optional[list]] = ContextVar("codemods_mesh_refs", default=None)

_Compound = Union[
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
]


def mesh_module_of(name: str) -> str:
    """The module migrated code imports mesh name ``name`` from."""
    return HOOKS_MODULE if name in RUNTIME_HOOK_NAMES else MESH_MODULE


def fill_hooks(template: str, ref: Callable[[str], str], **parts: str) -> str:
    """``template`` with ``{mesh}``-style ``parts`` and each ``{<runtime hook>}`` field filled with
    ``ref(<hook>)`` (the name as the file can call it)."""
    fields = {f for _, f, _, _ in string.Formatter().parse(template) if f}
    hooks = {f: ref(f) for f in fields if f in RUNTIME_HOOK_NAMES and f not in parts}
    return template.format(**parts, **hooks)


def counters(context: CodemodContext) -> tuple[Counter, Counter]:
    """The (rewritten sites, TODOV1 sites) counters of a context, by kind."""
    sites = context.scratch.setdefault(SITES_KEY, Counter())
    todos = context.scratch.setdefault(TODOS_KEY, Counter())
    return sites, todos


def with_todo(ws: cst.TrailingWhitespace, messages: Sequence[tuple[str, str]]) -> cst.TrailingWhitespace:
    """``ws`` with a short ``# TODOV1:`` comment for ``(kind, advice)`` ``messages``: what to write and
    the ``ds-migrate --explain`` code (:mod:`codemods._engine.todo_links`); unchanged if one is there (at the
    end of the line or above the statement: :mod:`codemods._engine.todo_place`)."""
    existing = ws.comment.value if ws.comment is not None else ""
    if TODO_TAG in existing:
        return ws
    text = todo_comment(messages)
    if existing:
        return ws.with_changes(comment=cst.Comment(f"{existing}  {text}"))
    return ws.with_changes(whitespace=cst.SimpleWhitespace("  "), comment=cst.Comment(text))


@dataclass
class _Frame:
    """What a statement collects while its children are rewritten."""

    messages: list[tuple[str, str]] = field(default_factory=list)  # (kind, advice)
    comments: list[str] = field(default_factory=list)
    acted: int = 0  # sites rewritten or flagged before the statement (a rule acted in it when this grows)

    def with_comments(self, statement):
        if not self.comments:
            return statement
        lines = [cst.EmptyLine(comment=cst.Comment(text)) for text in self.comments]
        return statement.with_changes(leading_lines=[*statement.leading_lines, *lines])


class SiteFailure(Exception):
    """A rule failed at one statement (its output would not be valid code, or the rule raised):
    that statement is to be left as it is and reported; the rest of the file still migrates."""

    def __init__(self, position: tuple[int, int], why: str, statement: Optional[cst.CSTNode] = None) -> None:
        super().__init__(f"line {position[0]}: {why}")
        self.position = position  # (line, column) of the statement in the codemod's input tree
        self.why = why
        self.statement = statement


def _why(err: BaseException) -> str:
    text = " ".join(str(err).split())
    return f"{type(err).__name__}: {text[:200]}" if text else type(err).__name__


def _invalid_output(node: Union[cst.CSTNode, cst.FlattenSentinel]) -> Optional[str]:
    """Why the code of a rewritten statement ``node`` is not valid Python (None when it is): it is
    printed and parsed on its own, so a rule cannot write what would not compile or would change
    the statements around it."""
    nodes = list(node.nodes) if isinstance(node, cst.FlattenSentinel) else [node]
    for statement in nodes:
        if not isinstance(statement, cst.SimpleStatementLine):
            continue
        text = cst.Module([]).code_for_node(statement)
        try:
            count = len(ast.parse(text).body)
        except (SyntaxError, ValueError) as err:
            if not find_all(statement, cst.FormattedString):
                return f"the rewritten statement would not parse ({getattr(err, 'msg', err)})"
            # f-strings: this interpreter's grammar may be older than the code's (quotes are made
            # portable after the codemods); libcst's parser does not depend on it
            try:
                count = len(cst.parse_statement(text).body)
            except cst.ParserSyntaxError as error:
                return f"the rewritten statement would not parse ({error.message})"
        if count != len(statement.body):
            return "the rewritten statement would parse as another number of statements"
    return None


# what legacy getters raise before their groups exist (KeyError: no sequence-parallel group;
# AssertionError: "not initialized"; AttributeError: mpu None or without the getter; RuntimeError /
# ValueError: torch.distributed not initialised), and the bases that catch them
LEGACY_EXCEPTIONS = frozenset(
    {
        "KeyError",
        "LookupError",
        "AssertionError",
        "AttributeError",
        "RuntimeError",
        "ValueError",
        "Exception",
        "BaseException",
    }
)


# the kinds of site whose rewrite is a query (a getter): kept where code waits for its legacy exception
GETTER_KINDS = frozenset({"groups getter", "mpu call", "mpu/bwc call"})


def _catches_legacy(handler: cst.CSTNode) -> Optional[str]:
    """The type (as written) of ``handler`` when it catches one of :data:`LEGACY_EXCEPTIONS`."""
    kind = getattr(handler, "type", None)
    if kind is None:
        return "(bare)"
    types = [e.value for e in kind.elements] if isinstance(kind, cst.Tuple) else [kind]
    if any(last_name(t) in LEGACY_EXCEPTIONS for t in types):
        return " ".join(cst.Module([]).code_for_node(kind).split())
    return None


class MigrationCommand(TransformRunHook, LazyMetadata, VisitorBasedCodemodCommand):
    """Base of every migration codemod.

    Subclasses call :meth:`legacy_names` to resolve a node, :meth:`record` for each rewritten site,
    :meth:`flag` for a site left for a human, and :meth:`model_mesh` for the mesh expression to
    call on. They may override :meth:`on_statement` (never ``leave_SimpleStatementLine``).
    """

    # The codemod can only apply to a source that contains, for every tuple here, one of its
    # strings (checked first, to skip resolving metadata for files that cannot hold a site).
    MARKERS: tuple[tuple[str, ...], ...] = ()
    # A cleanup codemod only runs after another one rewrote a site in the same file.
    CLEANUP = False

    # The codemod can only apply when, for every set here, the source uses one of its identifiers
    # (a name, attribute, keyword or imported name); see :func:`identifiers`.
    IDENTIFIERS: tuple[frozenset, ...] = ()

    @classmethod
    def may_apply(cls, source: str, names: Optional[set[str]] = None) -> bool:
        """A cheap necessary condition for this codemod to change ``source`` (no metadata)."""
        if not all(any(m in source for m in group) for group in cls.MARKERS):
            return False
        return names is None or all(names & group for group in cls.IDENTIFIERS)

    METADATA_DEPENDENCIES = (QualifiedNameProvider, ScopeProvider, ParentNodeProvider, PositionProvider)

    def run_transform(self, transform, tree: cst.Module) -> cst.Module:
        # the import visitors run after the codemod: with metadata resolved on first use, no copy
        return super().run_transform(lazy(transform), tree)

    def __init__(self, context: CodemodContext) -> None:
        super().__init__(context)
        self._frames: list[_Frame] = []
        self._engine_cache: dict[int, list[tuple[str, int]]] = {}
        self._foreign: Optional[set[str]] = None  # names the file binds to something other than mesh_core's
        self.sites, self.todos = counters(context)
        # statements (by their (line, column) in this codemod's input) left as they are: a rule failed there
        self.excluded: set[tuple[int, int]] = set()
        self._statements: list[cst.BaseStatement] = []

    # --- a failing site never stops the file --------------------------------------------------
    def on_visit(self, node: cst.CSTNode) -> bool:
        if isinstance(node, cst.BaseStatement):
            self._statements.append(node)
            if self.excluded and self.position(node) in self.excluded:
                self._pruned = node  # on_leave then returns it unchanged
                return False
        try:
            return super().on_visit(node)
        except (SkipFile, SiteFailure):
            raise
        except Exception as err:
            failure = self._failure(node, _why(err))
            if failure is None:
                raise
            raise failure from err

    def on_leave(self, original_node, updated_node=None):
        if updated_node is None:
            return super().on_leave(original_node)
        if original_node is self._pruned:  # not visited (excluded or pruned): neither hooks nor children
            self._pruned = None
            if isinstance(original_node, cst.BaseStatement) and self._statements:
                self._statements.pop()
            return original_node
        try:
            if isinstance(original_node, cst.Call) and self._frames:
                return self._call_kept_where_its_exception_is_caught(original_node, updated_node)
            result = super().on_leave(original_node, updated_node)
            if result is not original_node and isinstance(original_node, cst.SimpleStatementLine):
                problem = _invalid_output(result)
                if problem is not None:
                    raise SiteFailure(self.position(original_node), problem, original_node)
            return result
        except (SkipFile, SiteFailure):
            raise
        except Exception as err:
            failure = self._failure(original_node, _why(err))
            if failure is None:
                raise
            raise failure from err
        finally:
            if isinstance(original_node, cst.BaseStatement) and self._statements:
                self._statements.pop()

    def _call_kept_where_its_exception_is_caught(self, original_node: cst.Call, updated_node: cst.Call):
        """The rule's rewrite of a call, unless the call is in the body of a ``try`` whose handler
        catches what the legacy call raised before the groups existed (code that waits for that
        exception: retry later, fall back); there the call is kept with a TODOV1."""
        sites = Counter(self.sites)
        added = self.context.scratch.get(AddImportsVisitor.CONTEXT_KEY)
        count = len(added) if added is not None else 0
        result = super().on_leave(original_node, updated_node)
        grown = self.sites - sites
        if result is original_node or result is updated_node or not grown or not set(grown) <= GETTER_KINDS:
            return result
        if not self.may_keep_alone(original_node):
            return result
        caught = self._caught_legacy_exception(original_node)
        if caught is None:
            return result
        self.sites.clear()
        self.sites.update(sites)
        if added is not None:
            del added[count:]
        call = " ".join(cst.Module([]).code_for_node(original_node.func).split())
        for kind in grown:
            self.flag(
                kind,
                f"{call}() kept: it is inside try/except {caught}, and the legacy call raised there before "
                "the groups existed (code may wait for that: retry, fall back); migrate it once the code "
                "no longer relies on that exception",
            )
        return updated_node

    def may_keep_alone(self, call: cst.Call) -> bool:
        """The legacy ``call`` may stay while the rest of the file moves (not a reader of legacy state
        whose builder this file moves: those move together, :mod:`codemods.rules._legacy_state`)."""
        return True

    def _caught_legacy_exception(self, node: cst.CSTNode) -> Optional[str]:
        """The handler (its type as written) of the innermost enclosing ``try`` of ``node``'s function
        that catches an exception a legacy getter raises before initialisation (``KeyError``,
        ``AssertionError``, ``AttributeError``, ``RuntimeError``, ``ValueError``, a base of one, or
        a bare ``except``); None when there is none."""
        child, current = node, self.parent(node)
        while current is not None and not isinstance(current, (cst.FunctionDef, cst.ClassDef, cst.Lambda, cst.Module)):
            if isinstance(current, (cst.Try, getattr(cst, "TryStar", cst.Try))) and child is current.body:
                for handler in current.handlers:
                    caught = _catches_legacy(handler)
                    if caught is not None:
                        return caught
            child, current = current, self.parent(current)
        return None

    def _failure(self, node: cst.CSTNode, why: str) -> Optional[SiteFailure]:
        """The :class:`SiteFailure` of the statement holding ``node`` (None outside any statement:
        the whole file then fails)."""
        statement = (
            node if isinstance(node, cst.BaseStatement) else (self._statements[-1] if self._statements else None)
        )
        if statement is None:
            return None
        return SiteFailure(self.position(statement), why, statement)

    # --- files this codemod must not touch ----------------------------------------------------
    def visit_Module(self, node: cst.Module) -> Optional[bool]:
        if self.context.full_module_name in ln.DEFINING_MODULES:
            raise SkipFile(f"{self.context.full_module_name} defines legacy APIs")
        self._import_aliases = import_aliases(node)
        return True

    def could_be(self, node: cst.CSTNode, names) -> bool:
        """Cheap pre-check before resolving qualified names: the name (or attribute) ``node`` ends
        with is one of ``names``, directly or as an import alias of one."""
        last = last_name(node)
        return last is not None and (last in names or self._import_aliases.get(last) in names)

    # --- names --------------------------------------------------------------------------------
    def legacy_names(self, node: cst.CSTNode) -> set[str]:
        """Canonical qualified names ``node`` may refer to (relative imports resolved)."""
        try:
            names = self.get_metadata(QualifiedNameProvider, node, set())
        except KeyError:
            return set()
        return ln.canonical_names((q.name for q in names), self.context.full_package_name)

    def legacy_name(self, node: cst.CSTNode, candidates) -> Optional[str]:
        """The one canonical name of ``node`` among ``candidates`` (a container or predicate)."""
        found = [n for n in self.legacy_names(node) if (candidates(n) if callable(candidates) else n in candidates)]
        return found[0] if len(found) == 1 else None

    # --- counting and TODOs -------------------------------------------------------------------
    def record(self, kind: str) -> None:
        self.sites[kind] += 1

    def flag(self, kind: str, message: str) -> None:
        """Leave the current site unchanged with a ``# TODOV1: message`` on its statement."""
        self.todos[kind] += 1
        if self._frames:
            self._frames[-1].messages.append((kind, message))

    def keep_comments(self, replaced: cst.CSTNode) -> None:
        """Comments inside a node being replaced move to their own lines above the statement."""
        if self._frames:
            self._frames[-1].comments += [c.value for c in find_all(replaced, cst.Comment)]

    def on_statement(
        self, original_node: cst.SimpleStatementLine, updated_node: cst.SimpleStatementLine
    ) -> Union[cst.SimpleStatementLine, cst.RemovalSentinel, cst.FlattenSentinel]:
        """Hook for subclasses that rewrite or drop whole statements."""
        return updated_node

    def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> Optional[bool]:
        self._frames.append(_Frame(acted=self._acted()))
        return True

    def _acted(self) -> int:
        return sum(self.sites.values()) + sum(self.todos.values())

    def leave_SimpleStatementLine(self, original_node: cst.SimpleStatementLine, updated_node: cst.SimpleStatementLine):
        frame = self._frames.pop()
        result = self.on_statement(original_node, updated_node)
        if isinstance(result, cst.SimpleStatementLine):
            if self._acted() != frame.acted:
                result = realign(original_node, result)
            result = frame.with_comments(result)
            if frame.messages and not todo_above(
                result, self._header(original_node)
            ):  # already flagged (comment above the statement)
                ws = with_todo(result.trailing_whitespace, frame.messages)
                result = result.with_changes(trailing_whitespace=ws)
        return result

    def _push(self, node: cst.CSTNode) -> Optional[bool]:
        self._frames.append(_Frame(acted=self._acted()))
        return True

    def _pop(self, original_node: _Compound, updated_node: _Compound) -> _Compound:
        frame = self._frames.pop()
        if self._acted() != frame.acted:
            updated_node = realign(original_node, updated_node)
        updated_node = frame.with_comments(updated_node)
        messages = frame.messages
        if not messages or todo_above(updated_node, self._header(original_node)):
            return updated_node
        if isinstance(updated_node, cst.Match):  # its header line ends at the colon before the cases
            return updated_node.with_changes(
                whitespace_after_colon=with_todo(updated_node.whitespace_after_colon, messages)
            )
        body = updated_node.body
        if isinstance(body, cst.IndentedBlock):
            return updated_node.with_changes(body=body.with_changes(header=with_todo(body.header, messages)))
        if isinstance(body, cst.SimpleStatementSuite):
            ws = with_todo(body.trailing_whitespace, messages)
            return updated_node.with_changes(body=body.with_changes(trailing_whitespace=ws))
        return updated_node

    visit_If = visit_While = visit_For = visit_With = visit_FunctionDef = visit_ClassDef = _push
    leave_If = leave_While = leave_For = leave_With = leave_FunctionDef = leave_ClassDef = _pop
    visit_ExceptHandler = visit_ExceptStarHandler = visit_Match = visit_MatchCase = _push
    leave_ExceptHandler = leave_ExceptStarHandler = leave_Match = leave_MatchCase = _pop

    # --- imports ------------------------------------------------------------------------------
    def add_mesh_import(self, name: str) -> None:
        AddImportsVisitor.add_needed_import(self.context, mesh_module_of(name), name)

    def mesh_ref(self, name: str) -> str:
        """Code naming ``mesh_core.<name>`` (``mesh_core.runtime_hooks.<name>`` for a runtime hook),
        its import added: ``name`` itself, or the dotted name when the file binds ``name`` to
        something else anywhere (a parameter, an assignment, another import), which a ``from
        mesh_core import`` would clash with."""
        foreign = name in self._foreign_names()
        notes = MESH_REFS.get()
        if notes is not None:
            notes.append((name, foreign))
        if foreign:
            AddImportsVisitor.add_needed_import(self.context, mesh_module_of(name))
            return f"{mesh_module_of(name)}.{name}"
        self.add_mesh_import(name)
        return name

    def _foreign_names(self) -> set[str]:
        if self._foreign is None:
            self._foreign = set()
            scopes = {s for s in self.metadata.get(ScopeProvider, {}).values() if s is not None}
            for scope in scopes:
                for assignment in scope.assignments:
                    if assignment.name in self._foreign or assignment.name.startswith(MESH_MODULE):
                        continue
                    if not self._is_mesh_import(assignment):
                        self._foreign.add(assignment.name)
        return self._foreign

    @staticmethod
    def _is_mesh_import(assignment) -> bool:
        node = getattr(assignment, "node", None)
        if not isinstance(node, cst.ImportFrom) or node.relative or node.module is None:
            return False
        if cst.Module([]).code_for_node(node.module) not in (MESH_MODULE, HOOKS_MODULE) or isinstance(
            node.names, cst.ImportStar
        ):
            return False
        return any(a.evaluated_alias is None and a.evaluated_name == assignment.name for a in node.names)

    # --- the model's mesh ---------------------------------------------------------------------
    def model_mesh(self, node: cst.CSTNode) -> cst.BaseExpression:
        """The mesh of the model at ``node``: ``self.mesh_device`` inside an engine (sub)class,
        ``<engine>.mesh_device`` after ``<engine>, ... = deepspeed.initialize(...)`` in the same
        scope, else ``default_mesh()`` (imported from mesh_core)."""
        engine = self.engine_in_scope(node)
        if engine is not None:
            return cst.Attribute(value=cst.Name(engine), attr=cst.Name("mesh_device"))
        return cst.Call(func=cst.parse_expression(self.mesh_ref("current_mesh")))

    def scope_of(self, node: cst.CSTNode) -> Optional[Scope]:
        try:
            scope = self.get_metadata(ScopeProvider, node, None)
        except KeyError:
            return None
        while isinstance(scope, ComprehensionScope):
            scope = scope.parent
        return scope

    def position(self, node: cst.CSTNode) -> tuple[int, int]:
        start = self.get_metadata(PositionProvider, node).start
        return start.line, start.column

    def _header(self, statement: cst.CSTNode) -> Sequence[cst.EmptyLine]:
        """The module's header lines where ``statement`` is its first statement (libcst keeps the
        comment lines above that statement there), else none."""
        module = getattr(self.context, "module", None)
        return module.header if module is not None and module.body and module.body[0] is statement else ()

    def line_of(self, node: cst.CSTNode) -> int:
        return self.get_metadata(PositionProvider, node).start.line

    def parent(self, node: cst.CSTNode) -> Optional[cst.CSTNode]:
        return self.get_metadata(ParentNodeProvider, node, None)

    def engine_in_scope(self, node: cst.CSTNode) -> Optional[str]:
        """The name of an engine provably bound at ``node``, or None."""
        scope = self.scope_of(node)
        if scope is None:
            return None
        name = self._engine_self(scope)
        engines = self._engines_of(scope) if name is None else ()
        if engines:  # (positions only where there is an engine to compare with: they cost a print of the tree)
            line = self.line_of(node)
            candidates = [name for name, at in engines if at < line]
            name = candidates[-1] if candidates else None
        if name is not None and self._rebound_in_comprehension(node, name):
            return None
        return name

    def engine_bound_at(self, node: cst.CSTNode, name: str) -> bool:
        """``name`` is an engine provably bound at ``node`` (see :meth:`engine_in_scope`)."""
        scope = self.scope_of(node)
        if scope is None or self._rebound_in_comprehension(node, name):
            return False
        lines = [at for n, at in self._engines_of(scope) if n == name]
        return bool(lines) and min(lines) < self.line_of(node)

    def engine_owner(self, node: cst.CSTNode) -> Optional[str]:
        """The name of the DeepSpeed engine ``self`` whose method ``node`` is in (not rebound by a
        comprehension there), or None."""
        scope = self.scope_of(node)
        owner = self._engine_self(scope) if scope is not None else None
        if owner is None or self._rebound_in_comprehension(node, owner):
            return None
        return owner

    def _rebound_in_comprehension(self, node: cst.CSTNode, name: str) -> bool:
        """``name`` is a comprehension variable at ``node`` (``[... for engine in ...]``)."""
        scope = self.get_metadata(ScopeProvider, node, None)
        while isinstance(scope, ComprehensionScope):
            if name in scope.assignments:
                return True
            scope = scope.parent
        return False

    def _engine_self(self, scope: Scope) -> Optional[str]:
        if not isinstance(scope, FunctionScope) or not isinstance(scope.node, cst.FunctionDef):
            return None
        func = scope.node
        block = self.parent(func)
        cls = self.parent(block) if block is not None else None
        if not isinstance(cls, cst.ClassDef):
            return None
        if any(self._decorator_name(d) in ("staticmethod", "classmethod") for d in func.decorators):
            return None
        params = func.params.posonly_params or func.params.params
        if not params:
            return None
        first = params[0].name.value
        if len(scope.assignments[first]) != 1:
            return None
        defined_here = f"{self.context.full_module_name}.{cls.name.value}" in ln.ENGINE_CLASSES
        if not defined_here and not any(self.legacy_names(base.value) & ln.ENGINE_CLASSES for base in cls.bases):
            return None
        return first

    @staticmethod
    def _decorator_name(decorator: cst.Decorator) -> str:
        dec = decorator.decorator
        return dec.value if isinstance(dec, cst.Name) else ""

    def _engines_of(self, scope: Scope) -> list[tuple[str, int]]:
        """(name, line) of engines assigned from ``deepspeed.initialize`` at the top of ``scope``."""
        key = id(scope)
        if key in self._engine_cache:
            return self._engine_cache[key]
        found: list[tuple[str, int]] = []
        for assignment in scope.assignments:
            target = getattr(assignment, "node", None)
            if not isinstance(target, cst.Name):
                continue
            statement = self.top_level_assign(target, scope)
            if statement is None or not self._is_engine_assign(statement, target):
                continue
            if len(scope.assignments[target.value]) != 1:
                continue
            found.append((target.value, self.line_of(statement)))
        found.sort(key=lambda item: item[1])
        self._engine_cache[key] = found
        return found

    def top_level_assign(self, target: cst.Name, scope: Scope) -> Optional[cst.Assign]:
        """The ``Assign`` binding ``target`` if it is a statement directly in ``scope``'s body."""
        node: Optional[cst.CSTNode] = target
        while node is not None and not isinstance(node, cst.Assign):
            if isinstance(node, (cst.BaseSmallStatement, cst.BaseCompoundStatement)):
                return None
            node = self.parent(node)
        if node is None:
            return None
        line = self.parent(node)
        body = self.parent(line) if line is not None else None
        if isinstance(scope, GlobalScope):
            return node if isinstance(body, cst.Module) else None
        owner = getattr(scope, "node", None)
        if isinstance(owner, cst.FunctionDef):
            return node if body is owner.body else None
        return None

    def single_binding(self, name: cst.Name) -> Optional[cst.CSTNode]:
        """The node of the one assignment of ``name`` in its scope (None unless there is exactly one)."""
        scope = self.scope_of(name)
        if scope is None:
            return None
        bindings = scope.assignments[name.value]
        return getattr(next(iter(bindings)), "node", None) if len(bindings) == 1 else None

    def bound_value(self, name: cst.Name) -> Optional[cst.BaseExpression]:
        """The value of the single top-level assignment of ``name`` before it, in its scope."""
        target = self.single_binding(name)
        if not isinstance(target, cst.Name):
            return None
        scope = self.scope_of(name)
        assign = self.top_level_assign(target, scope)
        if assign is None or len(assign.targets) != 1 or assign.targets[0].target is not target:
            return None
        if self.line_of(assign) >= self.line_of(name):
            return None
        return assign.value

    def config_dict(self, call: cst.Call) -> Optional[cst.Dict]:
        """The dict literal passed as ``config`` (directly or through a local name), or None."""
        arg = arg_by(call, 10, "config") or arg_by(call, None, "config_params")
        if arg is None:
            return None
        value = arg.value
        if isinstance(value, cst.Name):
            bound = self.bound_value(value)
            if bound is None:
                return None
            if len(self.scope_of(value).assignments[value.value]) != 1:
                return None
            value = bound
        return value if isinstance(value, cst.Dict) else None

    def _is_engine_assign(self, assign: cst.Assign, target: cst.Name) -> bool:
        if len(assign.targets) != 1:
            return False
        value = assign.value
        dest = assign.targets[0].target
        if isinstance(value, cst.Subscript) and isinstance(dest, cst.Name):
            index = value.slice[0].slice if len(value.slice) == 1 else None
            if isinstance(index, cst.Index) and isinstance(index.value, cst.Integer) and index.value.value == "0":
                value = value.value
            else:
                return False
            first = dest
        elif isinstance(dest, (cst.Tuple, cst.List)) and dest.elements:
            first = dest.elements[0].value
        else:
            return False
        if first is not target or not isinstance(value, cst.Call):
            return False
        return ln.INITIALIZE in self.legacy_names(value.func)


class _Finder(cst.CSTVisitor):
    def __init__(self, types: tuple[type, ...]) -> None:
        self.types = types
        self.found: list[cst.CSTNode] = []

    def on_visit(self, node: cst.CSTNode) -> bool:
        if isinstance(node, self.types):
            self.found.append(node)
        return True


def find_all(tree: cst.CSTNode, *types: type) -> list[cst.CSTNode]:
    """Every node of ``types`` in ``tree``, in source order (for planning before rewriting)."""
    nodes = preorder(tree) if isinstance(tree, cst.Module) else None  # one walk per tree and file
    if nodes is not None:
        return [node for node in nodes if isinstance(node, types)]
    finder = _Finder(types)
    tree.visit(finder)
    return finder.found


def identifiers(source: str) -> Optional[set[str]]:
    """Every identifier ``source`` uses, via the fast ``ast`` parser (None if it cannot parse it)."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return None
    return ast_identifiers(tree)


def ast_identifiers(tree: ast.AST) -> set[str]:
    """Every identifier an ``ast`` tree uses (node by node: the union over a file's pieces is the file's)."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            names.add(node.id)
        elif isinstance(node, ast.Attribute):
            names.add(node.attr)
        elif isinstance(node, ast.keyword) and node.arg:
            names.add(node.arg)
        elif isinstance(node, ast.alias):
            names.update(node.name.split("."))
    return names


def last_name(node: cst.CSTNode) -> Optional[str]:
    """``x`` of a name ``x`` or an attribute ``a.b.x``."""
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        return node.attr.value
    return None


def arg_by(call: cst.Call, position: Optional[int], keyword: Optional[str]) -> Optional[cst.Arg]:
    """The argument of ``call`` at ``position`` (positional) or named ``keyword``."""
    positional = [a for a in call.args if a.keyword is None and not a.star]
    if keyword is not None:
        for a in call.args:
            if a.keyword is not None and a.keyword.value == keyword:
                return a
    if position is not None and position < len(positional):
        return positional[position]
    return None


def has_star_args(call: cst.Call) -> bool:
    return any(a.star for a in call.args)
