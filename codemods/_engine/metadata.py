"""Metadata for the codemods at the cost of what they use: no deep copy of a tree that holds each
node once, providers resolved on first use, and parent nodes from one walk over the tree.

libcst's ``MetadataWrapper`` deep-copies the module and resolves every declared provider before a
codemod visits the first node. On a large file that no rule touches (most of deepspeed's runtime),
that is most of the migration's time: the codemods only ask for metadata at candidate sites. The
values are the same: a provider is resolved by libcst itself on the same module, only later, and
the parent map equals ``ParentNodeProvider``'s (tested).

Within :func:`sharing` (one file's migration), a codemod that changes nothing hands the next one the
very tree it got (unchanged subtrees keep their identity, see :meth:`LazyMetadata.on_leave`), and
the metadata resolved on that tree (scopes, qualified names, positions, parents) and its list of
nodes (:func:`preorder`) are reused instead of being computed once per codemod. Metadata describes
one immutable tree object, so it stays valid for as long as that object is the tree.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import replace
from types import FunctionType
from typing import Collection, Generator, Iterator, Optional

import libcst as cst
from libcst.codemod import ContextAwareTransformer, ContextAwareVisitor
from libcst.codemod.visitors import AddImportsVisitor, RemoveImportsVisitor
from libcst.helpers import get_absolute_module_from_package_for_import
from libcst.matchers import MatcherDecoratableTransformer
from libcst.metadata import (
    ExpressionContextProvider,
    MetadataWrapper,
    ParentNodeProvider,
    QualifiedNameProvider,
    ScopeProvider,
)
from libcst.metadata.base_provider import BatchableMetadataProvider

from .imports import import_aliases, import_statements
from .libcst_private import (
    CONSTRUCTED_LEAVE_MATCHER_ATTR,
    CONSTRUCTED_VISIT_MATCHER_ATTR,
    EXTRA_LEAVE_FUNCS,
    EXTRA_VISIT_FUNCS,
    MODULES_IGNORED_BY_DEFAULT,
    VISIT_NEGATIVE_MATCHER_ATTR,
    VISIT_POSITIVE_MATCHER_ATTR,
    LazyValue,
    MetadataReferenceHook,
    computed_metadata,
    gather_matchers,
    remove_imports_keeps_unused_imports,
    set_unused_imports,
    stored_metadata,
    top_imports_gatherer,
)
from .walk import fast_visits, has_attribute_hooks

logger = logging.getLogger(__name__)

_FIELDS: dict[type, tuple[str, ...]] = {}


def _fields(node_type: type) -> tuple[str, ...]:
    names = _FIELDS.get(node_type)
    if names is None:
        names = _FIELDS[node_type] = tuple(f.name for f in dataclasses.fields(node_type))
    return names


class _Shared:
    """What is reused across the codemods of one file: per tree object (by identity, the object
    kept alive here so that its id is not reused), its metadata wrapper and its node list."""

    __slots__ = ("wrappers", "nodes", "statements", "queried")

    def __init__(self, queried: frozenset = frozenset()) -> None:
        self.queried = queried
        self.wrappers: list[tuple[cst.Module, "LazyMetadataWrapper"]] = []
        self.nodes: list[tuple[cst.Module, list[cst.CSTNode]]] = []
        self.statements: list = []

    def wrapper_for(self, module: cst.Module) -> Optional["LazyMetadataWrapper"]:
        for tree, wrapper in self.wrappers:
            if tree is module:
                return wrapper
        return None

    def add_wrapper(self, module: cst.Module, wrapper: "LazyMetadataWrapper") -> None:
        del self.wrappers[:-3]  # trees of earlier codemods are not visited again
        self.wrappers.append((module, wrapper))
        if wrapper.module is not module:  # a deep copy: the codemod's (unchanged) output is that copy
            self.wrappers.append((wrapper.module, wrapper))


_SHARED: ContextVar[Optional[_Shared]] = ContextVar("codemods_shared_metadata", default=None)


@contextmanager
def sharing(codemods: Collection[type] = ()) -> Generator[None, None, None]:
    """Reuse metadata and node lists across codemods run on the same tree object in this block;
    ``codemods``: those that will run (their :func:`queried_near` names shape the scopes used for
    qualified names)."""
    queried = frozenset().union(*(_QUERIED.get(c, ()) for c in codemods))
    token = _SHARED.set(_Shared(queried))
    try:
        with fast_visits():
            yield
    finally:
        _SHARED.reset(token)


class _Collect(cst.CSTVisitor):
    def __init__(self) -> None:
        self.nodes: list[cst.CSTNode] = []

    def on_visit(self, node: cst.CSTNode) -> bool:
        self.nodes.append(node)
        return True


def preorder(module: cst.Module) -> Optional[list[cst.CSTNode]]:
    """Every node of ``module`` in the order a libcst visitor meets them (source order), computed
    once per tree object within :func:`sharing`; None outside it."""
    shared = _SHARED.get()
    if shared is None:
        return None
    for tree, nodes in shared.nodes:
        if tree is module:
            return nodes
    collector = _Collect()
    module.visit(collector)
    del shared.nodes[:-3]
    shared.nodes.append((module, collector.nodes))
    return collector.nodes


class _Subclasses(dict):
    """``{type: issubclass(type, classes)}``, filled on first use: ``isinstance`` as a dict lookup
    by ``type(value)`` (libcst's node classes are ABCs, whose ``isinstance`` is slow)."""

    def __init__(self, classes) -> None:
        super().__init__()
        self.classes = classes

    def __missing__(self, value_type: type) -> bool:
        found = self[value_type] = issubclass(value_type, self.classes)
        return found


_IS_NODE = _Subclasses(cst.CSTNode)
_IS_SEQUENCE = {tuple: True, list: True}


def _children(node: cst.CSTNode) -> list[cst.CSTNode]:
    """``node``'s child nodes, field by field (the order of its dataclass fields)."""
    found: list[cst.CSTNode] = []
    is_node = _IS_NODE
    for name in _fields(type(node)):
        value = getattr(node, name)
        value_type = type(value)
        if value_type in _IS_SEQUENCE:
            found.extend(child for child in value if is_node[type(child)])
        elif is_node[value_type]:
            found.append(value)
    return found


def parent_map(module: cst.Module) -> Optional[dict[cst.CSTNode, cst.CSTNode]]:
    """``{child: parent}`` for every node below ``module``, or None when a node object occurs twice
    in the tree (then positions, parents and scopes need libcst's deep copy to be unambiguous)."""
    parents: dict[cst.CSTNode, cst.CSTNode] = {}
    stack: list[cst.CSTNode] = [module]
    while stack:
        node = stack.pop()
        for child in _children(node):
            if child in parents:
                return None
            parents[child] = node
            stack.append(child)
    return parents


_QUERIED: dict[type, frozenset] = {}


def queried_near(codemod_class: type, names) -> None:
    """Declare where ``codemod_class`` resolves qualified names: at a call or reference whose last
    name is one of ``names`` (or an import alias of one), or elsewhere in the same function.
    Within :func:`sharing`, functions naming none of the running codemods' names are left out of
    the scope analysis for qualified names (:func:`reduced_scopes`); a lookup in one of them falls
    back to the whole tree's scopes, so the names only decide what is fast."""
    _QUERIED[codemod_class] = frozenset(names)


_BLOCK_FIELDS = ("body", "orelse", "handlers", "finalbody", "cases")


def reduced_scopes(module: cst.Module, queried, min_share: float = 0.0) -> Optional[tuple[Mapping, set, set, set]]:
    """libcst's ScopeProvider on a copy of ``module`` in which the body of every function that
    names none of ``queried`` (nor an import alias of one) and declares nothing
    ``global`` / ``nonlocal`` is a bare ``pass``; returns its ``{node: scope}``, the set of
    those functions (as they are in the copy), the bodies left out (as they are in ``module``:
    they and their descendants are not in the copy) and ``module``'s nodes that the copy has
    rebuilt (those functions and the statements around them: not in the copy, their other
    children are), or None when no function is left out.

    Exact for a node whose scope chain (in the copy) holds none of those functions: a function's
    body adds assignments and accesses only to its own scopes, except through ``global`` /
    ``nonlocal`` (kept), and each scope's assignment count (the order of assignments and
    accesses) is unchanged. Nodes outside the emptied bodies keep their identity, unless they
    enclose an emptied function (then they are new objects and have no scope here).

    Also None when the functions left out hold less than ``min_share`` of the tree's nodes (then
    the whole tree's scopes, which a codemod may need later anyway, cost little more)."""
    found = statements(module)
    triggers = set(queried)
    triggers |= {alias for alias, name in import_aliases(module).items() if name in triggers}
    emptied: set = set()
    dropped: set = set()
    rebuilt: set = set()
    left_out: list = []  # the functions emptied, as they are in ``module``
    names, declares = found.names, found.declares
    pass_type, simple = cst.FunctionDef, (cst.SimpleStatementLine, cst.SimpleStatementSuite)

    def rebuild(node):
        if isinstance(node, simple):
            return node
        if isinstance(node, pass_type):
            below = names.get(node)
            if below is not None and node not in declares and triggers.isdisjoint(below):
                new = node.with_changes(body=cst.IndentedBlock(body=[cst.SimpleStatementLine(body=[cst.Pass()])]))
                emptied.add(new)
                left_out.append(node)
                rebuilt.add(node)
                dropped.add(node.body)
                return new
        changes = {}
        for field_name in _BLOCK_FIELDS:
            value = getattr(node, field_name, None)
            if isinstance(value, cst.CSTNode):
                new_value = rebuild(value)
                if new_value is not value:
                    changes[field_name] = new_value
            elif isinstance(value, (tuple, list)) and value:
                items = [rebuild(child) if isinstance(child, cst.CSTNode) else child for child in value]
                if any(a is not b for a, b in zip(items, value)):
                    changes[field_name] = items
        if not changes:
            return node
        rebuilt.add(node)
        return node.with_changes(**changes)

    reduced = rebuild(module)
    if not emptied:
        return None
    if min_share and sum(found.sizes[f] for f in left_out) < min_share * sum(found.sizes[s] for s in module.body):
        return None
    return resolve_scopes(MetadataWrapper(reduced, unsafe_skip_copy=True)), emptied, dropped, rebuilt


def own_hooks(cls: type, base: type) -> set[str]:
    """The ``visit_*`` / ``leave_*`` names defined by ``cls`` and its bases that come before ``base``
    in its MRO (what ``cls`` adds to ``base``'s hooks)."""
    mro = cls.__mro__
    return {name for owner in mro[: mro.index(base)] for name in vars(owner) if name.startswith(("visit_", "leave_"))}


def _module_hook_only(provider: type) -> bool:
    """``provider`` (a batchable provider) has no visitor hook but its own ``visit_Module``."""
    return own_hooks(provider, BatchableMetadataProvider) == {"visit_Module"} and "visit_Module" in vars(provider)


# (libcst's private names may move: checked for the libcst installed)
_DIRECT = (ExpressionContextProvider, ScopeProvider)
_DIRECT_OK = (
    ScopeProvider.METADATA_DEPENDENCIES == (ExpressionContextProvider,)
    and not ExpressionContextProvider.METADATA_DEPENDENCIES
    and all(_module_hook_only(p) and not p.gen_cache for p in _DIRECT)
)


def _resolved(wrapper: MetadataWrapper, provider: type) -> bool:
    found = stored_metadata(wrapper).get(provider)
    return found is not None and not (isinstance(found, _OnFirstUse) and found._values is None)


def resolve_scopes(wrapper: MetadataWrapper) -> Mapping:
    """``ScopeProvider``'s values on ``wrapper``'s module, stored in the wrapper, as libcst's
    ``wrapper.resolve(ScopeProvider)`` gives them: each of it and its dependency
    (``ExpressionContextProvider``) is libcst's provider, its ``visit_Module`` called directly
    rather than under libcst's batched visitor (whose walk of the rest of the tree then calls
    nothing: neither has another hook), and the walks with :func:`codemods._engine.walk.fast_visits`."""
    if not _DIRECT_OK:
        return MetadataWrapper.resolve_many(wrapper, [ScopeProvider])[ScopeProvider]
    with fast_visits():
        for provider_class in _DIRECT:
            if _resolved(wrapper, provider_class):
                continue
            provider = provider_class()
            with provider.resolve(wrapper):
                provider.visit_Module(wrapper.module)
            stored_metadata(wrapper)[provider_class] = computed_metadata(provider)
    return stored_metadata(wrapper)[ScopeProvider]


# Scopes for qualified names leave out functions only where those hold at least this share of the
# tree's nodes: the reduced scopes' cost is the rest, and a codemod reading scopes (``scope_of``)
# then resolves the whole tree's as well.
REDUCE_MIN_SHARE = 0.5


class _QualifiedNames(Mapping):
    """``QualifiedNameProvider``'s values, each computed when read: libcst's provider walks the
    whole tree to store, for every node, ``LazyValue(scope.get_qualified_names_for(node))`` if
    ScopeProvider gives the node a scope, else ``set()``; this mapping gives the same per node
    (from the same resolved scopes) without the walk. Until something reads the whole tree's
    scopes, a node's scope comes from :func:`reduced_scopes` where that is exact."""

    __slots__ = ("_module", "_parents", "_wrapper", "_reduced", "_values")

    def __init__(self, module: cst.Module, parents: Mapping, wrapper: "LazyMetadataWrapper") -> None:
        self._module, self._parents, self._wrapper = module, parents, wrapper
        self._reduced: Optional[tuple] = None  # reduced_scopes(module); (): nothing left out
        self._values: dict = {}

    def _full(self) -> Mapping:
        return self._wrapper.resolve_many([ScopeProvider])[ScopeProvider]

    def _scope_of(self, node):
        full = stored_metadata(self._wrapper).get(ScopeProvider)
        if full is not None and not (isinstance(full, _OnFirstUse) and full._values is None):
            return full.get(node, None)  # resolved already
        if self._reduced is None:
            shared = _SHARED.get()
            self._reduced = (
                reduced_scopes(self._module, shared.queried, REDUCE_MIN_SHARE)
                if shared is not None and shared.queried
                else None
            ) or ()
        if not self._reduced:
            return self._full().get(node, None)
        scopes, emptied, dropped, rebuilt = self._reduced
        if node in rebuilt:  # not in the copy
            return self._full().get(node, None)
        above, parents = node, self._parents
        while above is not None:
            if above in dropped:  # not in the copy
                return self._full().get(node, None)
            above = parents.get(above)
        scope = scopes.get(node, None)
        if scope is None:
            return None
        chain = scope
        while True:
            if getattr(chain, "node", None) in emptied:
                return self._full().get(node, None)
            parent = chain.parent
            if parent is chain:
                return scope
            chain = parent

    def _value(self, node):
        value = self._values.get(node)
        if value is None:
            scope = self._scope_of(node)
            if scope:
                value = LazyValue(lambda: scope.get_qualified_names_for(node))
            else:
                value = set()
            self._values[node] = value
        return value

    def __getitem__(self, node):
        if node is not self._module and node not in self._parents:
            raise KeyError(node)
        return self._value(node)

    def get(self, node, default=None):
        if node is not self._module and node not in self._parents:
            return default
        return self._value(node)

    def __contains__(self, node) -> bool:
        return node is self._module or node in self._parents

    def __iter__(self) -> Iterator:
        yield self._module
        yield from self._parents

    def __len__(self) -> int:
        return 1 + len(self._parents)


class _OnFirstUse(Mapping):
    """One provider's ``{node: value}``, resolved by the wrapper when first read. It stands in the
    wrapper's metadata until then (libcst's visitors check there that their parent transform
    declared what they read)."""

    __slots__ = ("_wrapper", "_provider", "_values")

    def __init__(self, wrapper: "LazyMetadataWrapper", provider) -> None:
        self._wrapper = wrapper
        self._provider = provider
        self._values: Optional[Mapping] = None

    def _resolved(self) -> Mapping:
        if self._values is None:
            wrapper, provider = self._wrapper, self._provider
            parents = stored_metadata(wrapper).get(ParentNodeProvider)
            if provider is QualifiedNameProvider and isinstance(parents, dict):
                self._values = _QualifiedNames(wrapper.module, parents, wrapper)
                return self._values
            if stored_metadata(wrapper).get(provider) is self:
                del stored_metadata(wrapper)[provider]  # libcst resolves what is not there (and its dependencies)
            if provider is ScopeProvider:
                self._values = resolve_scopes(wrapper)
            else:
                self._values = MetadataWrapper.resolve_many(wrapper, [provider])[provider]
        return self._values

    def __getitem__(self, node):
        return self._resolved()[node]

    def get(self, node, default=None):
        return self._resolved().get(node, default)

    def __contains__(self, node) -> bool:
        return node in self._resolved()

    def __iter__(self) -> Iterator:
        return iter(self._resolved())

    def __len__(self) -> int:
        return len(self._resolved())


class LazyMetadataWrapper(MetadataWrapper):
    """A ``MetadataWrapper`` that copies ``module`` only when a node object occurs twice in it, and
    resolves each provider when a codemod first reads it."""

    __slots__ = ()

    def __init__(self, module: cst.Module) -> None:
        parents = parent_map(module)
        super().__init__(module, unsafe_skip_copy=parents is not None)
        if parents is None:
            logger.debug("a node occurs twice in the tree: metadata on a deep copy")
            parents = parent_map(self.module)
        if parents is not None:
            stored_metadata(self)[ParentNodeProvider] = parents

    def resolve_many(self, providers: Collection) -> Mapping:
        store = stored_metadata(self)
        return {p: store.setdefault(p, _OnFirstUse(self, p)) for p in providers}


def _same_fields(node: cst.CSTNode, other: cst.CSTNode) -> bool:
    """``other`` has exactly ``node``'s field values (the same objects, element by element)."""
    for name in _fields(type(node)):
        mine, theirs = getattr(node, name), getattr(other, name)
        if mine is theirs:
            continue
        if (
            isinstance(mine, (tuple, list))
            and isinstance(theirs, (tuple, list))
            and len(mine) == len(theirs)
            and all(a is b for a, b in zip(mine, theirs))
        ):
            continue
        return False
    return True


class _Hooks:
    """A transformer class's ``visit_<Node>`` / ``leave_<Node>`` functions by node type."""

    __slots__ = ("cls", "attributes", "_visit", "_leave")

    def __init__(self, cls: type) -> None:
        self.cls = cls
        self.attributes = has_attribute_hooks(cls)
        self._visit: dict[type, Optional[object]] = {}
        self._leave: dict[type, Optional[object]] = {}

    @classmethod
    def of(cls, transformer) -> Optional["_Hooks"]:
        """None unless ``transformer`` is a libcst ``MatcherDecoratableTransformer`` whose class uses
        no matcher decorators and defines its hooks on the class (then libcst's dispatch is a plain
        ``getattr`` by name, which a table reproduces)."""
        if not isinstance(transformer, MatcherDecoratableTransformer) or not isinstance(
            transformer, cst.CSTTransformer
        ):
            return None
        if (
            getattr(transformer, EXTRA_VISIT_FUNCS)
            or getattr(transformer, EXTRA_LEAVE_FUNCS)
            or gather_matchers(transformer)
        ):
            return None
        if any(name.startswith(("visit_", "leave_")) for name in getattr(transformer, "__dict__", {})):
            return None
        return cls(type(transformer))

    def _lookup(self, name: str):
        found = getattr(self.cls, name, None)
        if found is None or isinstance(found, FunctionType):
            return found
        return lambda transformer, *nodes: getattr(transformer, name)(*nodes)  # e.g. a staticmethod

    def visit(self, node_type: type):
        try:
            return self._visit[node_type]
        except KeyError:
            found = self._visit[node_type] = self._lookup(f"visit_{node_type.__name__}")
            return found

    def leave(self, node_type: type):
        try:
            return self._leave[node_type]
        except KeyError:
            found = self._leave[node_type] = self._lookup(f"leave_{node_type.__name__}")
            return found


_HOOKS: dict[type, Optional[_Hooks]] = {}

_MATCHER_ATTRS = (
    VISIT_POSITIVE_MATCHER_ATTR,
    VISIT_NEGATIVE_MATCHER_ATTR,
    CONSTRUCTED_VISIT_MATCHER_ATTR,
    CONSTRUCTED_LEAVE_MATCHER_ATTR,
)
_MATCHER_NAMES: dict[type, tuple[str, ...]] = {}


def matcher_names(cls: type) -> tuple[str, ...]:
    """The names of ``cls``'s attributes that carry a libcst matcher decorator (properties aside)."""
    names = _MATCHER_NAMES.get(cls)
    if names is None:
        found = []
        for name in dir(cls):
            value = getattr(cls, name, None)
            if not isinstance(value, property) and any(getattr(value, attr, None) for attr in _MATCHER_ATTRS):
                found.append(name)
        names = _MATCHER_NAMES[cls] = tuple(found)
    return names


_PRUNE: dict[type, frozenset] = {}

# libcst's import passes (run after a codemod that asked for imports to be added / removed) change
# only import statements and the module: their transform hooks are on Module, Import and
# ImportFrom (checked here, for the libcst installed), so statements holding no import are not
# visited. Their own gathering visitors still see the whole tree.
_IMPORT_PASSES = (AddImportsVisitor, RemoveImportsVisitor)
_IMPORT_PASS_HOOKS_ONLY = all(
    own_hooks(cls, ContextAwareTransformer) <= {"visit_Module", "leave_Module", "leave_Import", "leave_ImportFrom"}
    and not gather_matchers(cls)
    for cls in _IMPORT_PASSES
)


def prune_unless(codemod_class: type, names) -> None:
    """Declare that ``codemod_class``'s hooks do nothing inside a statement that names none of
    ``names`` (nor an import alias of one of them, nor a star import): such statements are not
    visited (libcst would rebuild every node in them to the same code)."""
    _PRUNE[codemod_class] = frozenset(names)


_STATEMENT, _NAME, _STAR, _DECLARES, _IMPORT = 1, 2, 3, 4, 5


class _Kinds(dict):
    """``{node type: what _Statements records of such a node}`` (0: nothing), filled on first use."""

    def __missing__(self, node_type: type) -> int:
        for kind, classes in (
            (_STATEMENT, cst.BaseStatement),
            (_NAME, cst.Name),
            (_STAR, cst.ImportStar),
            (_DECLARES, (cst.Global, cst.Nonlocal)),
            (_IMPORT, (cst.Import, cst.ImportFrom)),
        ):
            if issubclass(node_type, classes):
                self[node_type] = kind
                return kind
        self[node_type] = 0
        return 0


_KINDS = _Kinds()


class _Statements:
    """For one tree: the identifiers (``Name`` values) under each statement, and which statements
    hold a star import. One walk, shared by the codemods that get this tree."""

    __slots__ = ("names", "stars", "declares", "imports", "sizes")

    def __init__(self, module: cst.Module) -> None:
        names: dict[cst.CSTNode, set[str]] = {}
        stars: set = set()
        declares: set = set()  # statements holding a ``global`` / ``nonlocal`` declaration
        imports: set = set()  # statements holding an import
        outer: dict[cst.CSTNode, Optional[cst.CSTNode]] = {}
        sizes: dict[cst.CSTNode, int] = {}  # nodes under each statement (itself included)
        kinds = _KINDS
        stack: list[tuple[cst.CSTNode, Optional[cst.CSTNode]]] = [(module, None)]
        while stack:
            node, statement = stack.pop()
            kind = kinds[type(node)]
            if kind == _STATEMENT:
                names[node] = set()
                sizes[node] = 0
                outer[node] = statement
                statement = node
            elif statement is not None and kind:
                if kind == _NAME:
                    names[statement].add(node.value)
                elif kind == _STAR:
                    stars.add(statement)
                elif kind == _DECLARES:
                    declares.add(statement)
                else:
                    imports.add(statement)
            if statement is not None:
                sizes[statement] += 1
            stack.extend((child, statement) for child in _children(node))
        for statement in reversed(list(names)):  # inner statements were met after their outer one
            parent = outer[statement]
            if parent is not None:
                names[parent] |= names[statement]
                sizes[parent] += sizes[statement]
                if statement in stars:
                    stars.add(parent)
                if statement in declares:
                    declares.add(parent)
                if statement in imports:
                    imports.add(parent)
        self.names, self.stars, self.declares, self.imports, self.sizes = names, stars, declares, imports, sizes


def statements(module: cst.Module) -> _Statements:
    shared = _SHARED.get()
    if shared is None:
        return _Statements(module)
    for tree, found in shared.statements:
        if tree is module:
            return found
    found = _Statements(module)
    del shared.statements[:-3]
    shared.statements.append((module, found))
    return found


class LazyMetadata(MetadataReferenceHook):
    """Mixin for a libcst ``Codemod``: its metadata comes from a :class:`LazyMetadataWrapper`
    (shared within :func:`sharing`), and a node whose children are unchanged stays the same
    object (libcst rebuilds every node it visits)."""

    def __dir__(self) -> list[str]:
        """The class's matcher-decorated hooks and the instance's own attributes.

        libcst's matcher-aware ``__init__`` walks ``dir(self)`` (~1700 names) three times to find
        decorated hooks, ~10 ms per codemod instance and several instances per file; the names it
        keeps are these, so it finds the same hooks."""
        return [*matcher_names(type(self)), *vars(self)]

    # libcst's matcher-aware dispatch looks every hook up by a formatted name, per node and per
    # field; a codemod without matcher decorators gets the same calls from a per-class table.
    def _hooks(self) -> Optional["_Hooks"]:
        cls = type(self)
        if cls not in _HOOKS:
            _HOOKS[cls] = _Hooks.of(self)
        return _HOOKS[cls]

    _pruning: Optional[tuple[frozenset, "_Statements"]] = None
    _pruned: Optional[cst.CSTNode] = None

    def on_visit(self, node):
        hooks = self._hooks()
        if hooks is None:
            return super().on_visit(node)
        pruning = self._pruning
        if pruning is not None and isinstance(node, cst.BaseStatement):
            triggers, found = pruning
            below = found.names.get(node)
            if below is not None and (
                node not in found.imports
                if triggers is None
                else node not in found.stars and triggers.isdisjoint(below)
            ):
                self._pruned = node
                return False
        visit = hooks.visit(type(node))
        result = visit is None or visit(self, node) is not False
        if isinstance(node, cst.Module):
            if type(self) in _PRUNE:
                self._start_pruning(node)
            elif isinstance(self, _IMPORT_PASSES) and _IMPORT_PASS_HOOKS_ONLY:
                self._pruning = (None, statements(node))
        return result

    def _start_pruning(self, module: cst.Module) -> None:
        names = _PRUNE[type(self)]
        aliases = getattr(self, "_import_aliases", None)
        if aliases is None:
            return
        triggers = names | {alias for alias, name in aliases.items() if name in names}
        self._pruning = (triggers, statements(module))

    def on_visit_attribute(self, node, attribute) -> None:
        hooks = self._hooks()
        if hooks is None or hooks.attributes:
            super().on_visit_attribute(node, attribute)

    def on_leave_attribute(self, original_node, attribute) -> None:
        hooks = self._hooks()
        if hooks is None or hooks.attributes:
            super().on_leave_attribute(original_node, attribute)

    def on_leave(self, original_node, updated_node=None):
        if updated_node is None:  # a visitor, not a transformer
            return super().on_leave(original_node)
        if original_node is self._pruned:  # not visited: neither its hooks nor its children
            self._pruned = None
            return original_node
        hooks = self._hooks()
        if hooks is None:
            result = super().on_leave(original_node, updated_node)
        else:
            leave = hooks.leave(type(original_node))
            result = updated_node if leave is None else leave(self, original_node, updated_node)
        if result is not original_node and type(result) is type(original_node) and _same_fields(original_node, result):
            return original_node
        return result

    @contextmanager
    def metadata_reference(self, module: cst.Module) -> Generator[cst.Module, None, None]:
        if self.context.metadata_manager is not None:  # full-repo metadata: libcst's own path
            with self.libcst_metadata_reference(module) as tree:
                yield tree
            return
        old = self.context.wrapper
        shared = _SHARED.get()
        wrapper = shared.wrapper_for(module) if shared is not None else None
        if wrapper is None:
            wrapper = LazyMetadataWrapper(module)
            if shared is not None:
                shared.add_wrapper(module, wrapper)
        with self.resolve(wrapper):
            self.context = replace(self.context, wrapper=wrapper)
            try:
                yield wrapper.module
            finally:
                self.context = replace(self.context, wrapper=old)


_LAZY_CLASSES: dict[type, type] = {}


def _leading_imports(module: cst.Module) -> cst.Module:
    """``module`` cut after its first statement that follows the first one and is not a lone
    import: all that libcst's ``_GatherTopImportsBeforeStatements`` reads (the imports before any
    other statement, after a docstring or ``__strict__``), without walking the rest of the tree."""
    body = module.body
    end = 1
    while end < len(body) and _is_lone_import(body[end]):
        end += 1
    return module if end + 1 >= len(body) else module.with_changes(body=body[: end + 1])


def _is_lone_import(statement: cst.CSTNode) -> bool:
    return (
        isinstance(statement, cst.SimpleStatementLine)
        and len(statement.body) == 1
        and isinstance(statement.body[0], (cst.Import, cst.ImportFrom))
    )


class _TopImportsOnly:
    """AddImportsVisitor's pre-pass gathers only the module's leading imports (its gatherer acts in
    ``leave_Module`` on top-level statements alone), so it is given just those statements."""

    def visit_Module(self, node: cst.Module) -> None:
        return super().visit_Module(_leading_imports(node))  # type: ignore[misc]


_GATHER_IGNORES = frozenset({"__future__"})  # the modules whose imports libcst's gatherer skips


class _Mentions:
    """Every ``Name`` value in a tree outside import statements, the raw text of its plain string
    literals, and whether it holds an implicitly concatenated string: where a name may be read."""

    __slots__ = ("names", "strings", "concatenated")

    def __init__(self, module: cst.Module) -> None:
        self.names: set[str] = set()
        self.strings: list[str] = []
        self.concatenated = False
        stack: list[cst.CSTNode] = [module]
        while stack:
            node = stack.pop()
            node_type = type(node)
            if node_type is cst.Name:
                self.names.add(node.value)
            elif node_type is cst.SimpleString:
                self.strings.append(node.value)
            elif node_type is cst.ConcatenatedString:
                self.concatenated = True
            elif node_type is cst.Import or node_type is cst.ImportFrom:
                continue  # libcst's scopes record no access in an import
            stack.extend(_children(node))

    def may_read(self, name: str) -> bool:
        """``name`` may be read: a ``Name`` of that value, or a string literal that may hold it (a
        string annotation, an ``__all__`` entry; escapes and concatenations are not looked into)."""
        return name in self.names or self.concatenated or any(name in text or "\\" in text for text in self.strings)


def _bound_name(alias: cst.ImportAlias) -> Optional[str]:
    """The name an import alias binds (the first part of a plain ``import a.b``)."""
    if alias.asname is not None:
        name = alias.asname.name
        return name.value if isinstance(name, cst.Name) else None
    return alias.evaluated_name.split(".")[0]


def _requested(statement, module_imports: Mapping, obj_imports: Mapping, package: Optional[str]) -> list:
    """The aliases of an import statement whose use RemoveImportsVisitor checks (those it was asked
    to remove: the same tests as its ``leave_Import`` / ``leave_ImportFrom``)."""
    if isinstance(statement, cst.Import):
        return [
            alias
            for alias in statement.names
            if alias.evaluated_name in module_imports and alias.evaluated_alias == module_imports[alias.evaluated_name]
        ]
    if isinstance(statement.names, cst.ImportStar):
        return []
    module_name = get_absolute_module_from_package_for_import(package, statement)
    if module_name is None or module_name not in obj_imports:
        return []
    wanted = obj_imports[module_name]
    return [alias for alias in statement.names if (alias.evaluated_name, alias.evaluated_alias) in wanted]


def unused_requested_imports(
    module: cst.Module,
    module_imports: Mapping,
    obj_imports: Mapping,
    package: Optional[str],
) -> Optional[dict]:
    """``{alias: import statement}`` for each import alias that RemoveImportsVisitor was asked to
    remove (``module_imports``, ``obj_imports``: its ``unused_module_imports`` /
    ``unused_obj_imports``) and that libcst's ``GatherUnusedImportsVisitor`` finds unused: the
    only entries of its result that the pass reads. Found without scopes: a name nothing may read
    (see :class:`_Mentions`) has no reference, nor is it exported or in a string annotation; an
    import the gatherer skips (``from . import``, ``from __future__ import``) is in use. None when
    a name the pass may remove may be read (then libcst's gatherer decides)."""
    mentions: Optional[_Mentions] = None
    unused: dict = {}
    for statement in import_statements(module):
        for alias in _requested(statement, module_imports, obj_imports, package):
            if isinstance(statement, cst.ImportFrom) and (
                statement.module is None
                or (isinstance(statement.module, cst.Name) and statement.module.value in _GATHER_IGNORES)
            ):
                continue
            name = _bound_name(alias)
            if mentions is None:
                mentions = _Mentions(module)
            if name is None or mentions.may_read(name):
                return None
            unused[alias] = statement
    return unused


class _UnusedImportsWithoutScopes:
    """RemoveImportsVisitor whose pre-pass (libcst's ``GatherUnusedImportsVisitor``: the scopes of
    the whole tree and three more walks) is :func:`unused_requested_imports` where that decides."""

    def visit_Module(self, node: cst.Module) -> None:
        unused = None
        if UNUSED_WITHOUT_SCOPES:
            unused = unused_requested_imports(
                node,
                self.unused_module_imports,
                self.unused_obj_imports,
                self.context.full_package_name,
            )
        if unused is None:
            return super().visit_Module(node)  # type: ignore[misc]
        set_unused_imports(self, unused)
        return None


UNUSED_WITHOUT_SCOPES = True  # False: libcst's gatherer always (tests compare the two)


def _remove_pass_known() -> bool:
    """libcst's RemoveImportsVisitor reads its gatherer's result as :func:`unused_requested_imports`
    expects (checked for the libcst installed; its private names may move)."""
    return MODULES_IGNORED_BY_DEFAULT == _GATHER_IGNORES and remove_imports_keeps_unused_imports()


_REMOVE_PASS_KNOWN = _remove_pass_known()


def _top_gatherer_leaves_only() -> bool:
    """The gatherer AddImportsVisitor runs has no hook but ``leave_Module`` (checked for the libcst
    installed; its private names may move)."""
    gatherer = top_imports_gatherer()
    return gatherer is not None and own_hooks(gatherer, ContextAwareVisitor) == {"leave_Module"}


_TOP_GATHERER_LEAVES_ONLY = _top_gatherer_leaves_only()


def lazy(codemod_class: type) -> type:
    """``codemod_class`` (e.g. libcst's ``AddImportsVisitor``) with :class:`LazyMetadata`."""
    if issubclass(codemod_class, LazyMetadata):
        return codemod_class
    if codemod_class not in _LAZY_CLASSES:
        mixins: tuple = ()
        if codemod_class is AddImportsVisitor and _TOP_GATHERER_LEAVES_ONLY:
            mixins = (_TopImportsOnly,)
        elif codemod_class is RemoveImportsVisitor and _REMOVE_PASS_KNOWN:
            mixins = (_UnusedImportsWithoutScopes,)
        _LAZY_CLASSES[codemod_class] = type(codemod_class.__name__, (*mixins, LazyMetadata, codemod_class), {})
    return _LAZY_CLASSES[codemod_class]
