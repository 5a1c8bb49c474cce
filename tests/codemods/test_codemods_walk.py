"""Read-only traversal without copies (codemods/_engine/walk.py) and scope analysis on it
(codemods._engine.metadata.resolve_scopes): the same visitor calls, in the same order, and the same scopes
as libcst's own traversal and ``MetadataWrapper.resolve(ScopeProvider)``; the same migrations."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

import libcst as cst
import pytest
from libcst.metadata import MetadataWrapper, ScopeProvider

from codemods import migrate_code
from codemods._engine import metadata, walk

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "codemods"

SHAPES = '''\
"""doc"""
from __future__ import annotations
import a.b.c as d, e
from . import sibling
from ..pkg import (x as y, z,)
from mod import *
__all__ = ["y", "shadow"]
G: "Optional[int]" = None
shadow = 1

@decorator(arg=1)
class A(Base, metaclass=M):
    x: int = 1
    def f(self, /, a, *args, b: "str" = f"{1 + 2!r:>{w}} {a=} {b:{c}.{d}f}", **kw) -> "List[A]":
        global G
        lambda q, *, r=2: q + r
        def g():
            nonlocal a
            a += 1
            del a
        return [i async for i in aiter() if (n := i)], {k: v for k, v in kw.items()}, {s for s in args}

async def h(shadow):
    async with ctx() as (p, q), other():
        await p
    try:
        pass
    except* (E, F) as err:
        raise X from err
    finally:
        print(*args, **kw, sep="")
    for i, *j in zip():
        continue
    else:
        while True:
            break
    match shadow:
        case {"k": [1, *rest], **others} if rest:
            pass
        case Point(x=0, y=yy) | [yy, _] as whole:
            pass
        case _:
            pass
    x = y if z else not w
    x[1:2, ::3] = -x @ y ** 2
    assert x, "msg"
    t = typing.cast("Dict[str, A]", x)
    return (yield from g()), (yield)

def generic[T: int, *Ts, **P](a: T) -> T: ...
type Alias[K] = dict[K, int]
if x: pass
elif y: pass
else: pass
with open(f) as fh: fh.read(); fh.close()
'''


def _sources() -> list[tuple[str, str]]:
    found = [("shapes", SHAPES)]
    found += [(str(p), p.read_text(encoding="utf-8")) for p in sorted(FIXTURES.rglob("*.py"))[:40]]
    found += [(str(p), p.read_text(encoding="utf-8")) for p in sorted((ROOT / "codemods").rglob("*.py"))]
    spec = importlib.util.find_spec("deepspeed")
    if spec is not None and spec.submodule_search_locations:
        deepspeed = Path(spec.submodule_search_locations[0])
        found += [
            (str(deepspeed / rel), (deepspeed / rel).read_text(encoding="utf-8"))
            for rel in (
                "moe/layer.py",
                "moe/mappings.py",
                "sequence/layer.py",
                "runtime/pipe/module.py",
                "utils/groups.py",
            )
            if (deepspeed / rel).exists()
        ]
    return found


SOURCES = _sources()


class _Recorder(cst.CSTVisitor):
    """Records every call libcst makes (attribute calls included: its hooks are its own)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list = []

    def on_visit(self, node):
        self.calls.append(("visit", id(node)))
        return not isinstance(node, cst.Lambda)  # a hook that prunes

    def on_leave(self, original_node):
        self.calls.append(("leave", id(original_node)))

    def on_visit_attribute(self, node, attribute):
        self.calls.append(("visit_attr", id(node), attribute))

    def on_leave_attribute(self, original_node, attribute):
        self.calls.append(("leave_attr", id(original_node), attribute))


class _Hooked(cst.CSTVisitor):
    """libcst's dispatch, with node hooks (one visiting a child by hand) and one attribute hook."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list = []

    def visit_Name(self, node):
        self.calls.append(("name", id(node), node.value))

    def visit_Assign(self, node):
        self.calls.append(("assign", id(node)))
        node.value.visit(self)
        return False

    def leave_FunctionDef(self, original_node):
        self.calls.append(("def", id(original_node)))

    def visit_ClassDef_bases(self, node):
        self.calls.append(("bases", id(node)))


class _Plain(_Hooked):
    visit_ClassDef_bases = None  # type: ignore[assignment]  # no attribute hook: attribute calls left out


def _calls(tree: cst.Module, visitor_class: type, fast: bool) -> list:
    visitor = visitor_class()
    with walk.fast_visits(fast):
        assert tree.visit(visitor) is tree
    return visitor.calls


@pytest.mark.parametrize("visitor_class", [_Recorder, _Hooked, _Plain])
@pytest.mark.parametrize("name,source", SOURCES, ids=[Path(n).name for n, _ in SOURCES])
def test_fast_visits_make_libcsts_calls(name, source, visitor_class):
    tree = cst.parse_module(source)
    assert _calls(tree, visitor_class, True) == _calls(tree, visitor_class, False)


@dataclass(frozen=True)
class _LoudName(cst.Name):
    """A node type with a ``visit`` of its own (libcst calls it for each such child)."""

    def visit(self, visitor):
        visitor.calls.append(("own visit", id(self)))
        return super().visit(visitor)


def test_a_node_types_own_visit_is_called_as_libcst_calls_it():
    tree = cst.parse_module("def f(a, b):\n    return a + g(b, c=a)\n")

    class Louder(cst.CSTTransformer):
        def leave_Name(self, original_node, updated_node):
            return _LoudName(value=updated_node.value, lpar=updated_node.lpar, rpar=updated_node.rpar)

    loud = tree.visit(Louder())
    for visitor_class in (_Recorder, _Hooked, _Plain):
        calls = _calls(loud, visitor_class, True)
        assert calls == _calls(loud, visitor_class, False)
        assert sum(call[0] == "own visit" for call in calls) == 8


def test_every_node_type_has_a_field_order_but_the_conditional_ones():
    types = [
        t
        for t in vars(cst).values()
        if isinstance(t, type) and issubclass(t, cst.CSTNode) and not t.__abstractmethods__
    ]
    missing = {t.__name__ for t in types if walk.field_order(t) is None}
    assert missing <= {
        "FormattedStringExpression",
        "TemplatedStringExpression",
        "ImportFrom",
        "LazyImportFrom",
        "TypeParam",
    }, missing


def _preorder(module: cst.Module) -> list:
    nodes: list = []

    class Collect(cst.CSTVisitor):
        def on_visit(self, node):
            nodes.append(node)
            return True

    module.visit(Collect())
    return nodes


def _scope_shape(module: cst.Module, scopes) -> list:
    """The scope mapping in terms of the tree's nodes (by their place in it; a node parsed from a
    string annotation, not in the tree, by its type and code): per node, its scope's description."""
    nodes = _preorder(module)
    place = {id(node): i for i, node in enumerate(nodes)}
    blank = cst.Module([])

    def key(node):
        if node is None or isinstance(node, str):
            return node
        return place.get(id(node)) if id(node) in place else (type(node).__name__, blank.code_for_node(node))

    index: dict[int, int] = {}
    described: list = []

    def describe(scope) -> int:
        if id(scope) in index:
            return index[id(scope)]
        parent = None if scope.parent is scope else describe(scope.parent)
        assignments = sorted(
            (
                a.name,
                type(a).__name__,
                repr(key(getattr(a, "node", None))),
                tuple(sorted(repr(key(r.node)) for r in a.references)),
            )
            for a in scope.assignments
        )
        accesses = sorted(
            (
                repr(key(a.node)),
                a.is_annotation,
                a.is_type_hint,
                tuple(sorted(repr(key(getattr(r, "node", None))) for r in a.referents)),
            )
            for a in scope.accesses
        )
        index[id(scope)] = len(described)
        described.append(
            (
                type(scope).__name__,
                getattr(scope, "name", None),
                repr(key(getattr(scope, "node", None))),
                parent,
                assignments,
                accesses,
            )
        )
        return index[id(scope)]

    shape = [(describe(scopes[n]) if scopes.get(n) is not None else None, n in scopes) for n in nodes]
    return [shape, described]


@pytest.mark.parametrize("name,source", SOURCES, ids=[Path(n).name for n, _ in SOURCES])
def test_resolve_scopes_gives_libcsts_scopes(name, source):
    tree = cst.parse_module(source)
    ours = metadata.resolve_scopes(MetadataWrapper(tree, unsafe_skip_copy=True))
    theirs = MetadataWrapper(tree, unsafe_skip_copy=True).resolve(ScopeProvider)
    assert len(ours) == len(theirs)  # (nodes parsed from string annotations are new objects in each)
    assert _scope_shape(tree, ours) == _scope_shape(tree, theirs)
    for node in _preorder(tree):
        if isinstance(node, (cst.Name, cst.Attribute)) and ours.get(node) is not None:
            assert ours[node].get_qualified_names_for(node) == theirs[node].get_qualified_names_for(node)


def _migrations(monkeypatch, fast: bool) -> list:
    """Each source's migration with this branch's speed-ups (``fast``) or without them."""
    monkeypatch.setattr(walk, "ALLOWED", fast)
    monkeypatch.setattr(metadata, "_DIRECT_OK", fast and metadata._DIRECT_OK)
    monkeypatch.setattr(metadata, "REDUCE_MIN_SHARE", metadata.REDUCE_MIN_SHARE if fast else 0.0)  # (0: as before)
    found = []
    for name, source in SOURCES:
        if name == "shapes":
            continue
        migration = migrate_code(source, filename=name)
        found.append((name, migration.code, migration.sites, migration.todos, migration.skipped))
    return found


def test_migrations_are_the_same_without_fast_visits(monkeypatch):
    assert metadata._DIRECT_OK  # else the fast path is not tested
    fast = _migrations(monkeypatch, True)
    assert fast == _migrations(monkeypatch, False)
    assert any(code != source for (_, code, *_), (_, source) in zip(fast, [s for s in SOURCES if s[0] != "shapes"]))
