"""Metadata on first use (codemods/_engine/metadata.py): the same values as libcst's eager, deep-copying
``MetadataWrapper``, and the same migration output, at the cost of what the codemods read."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import libcst as cst
import pytest
from libcst._metadata_dependent import LazyValue
from libcst.metadata import (
    MetadataWrapper,
    ParentNodeProvider,
    PositionProvider,
    QualifiedNameProvider,
    ScopeProvider,
)

from codemods import CODEMODS, migrate_code
from codemods._engine import metadata
from codemods._engine.base import find_all, import_statements
from codemods._engine.libcst_private import stored_metadata
from codemods.rules.legacy_imports import LegacyImportsCommand

FIXTURES = Path(__file__).parent.parent / "fixtures" / "codemods"

TRICKY = '''\
"""doc"""
from __future__ import annotations
import deepspeed.utils.groups as g
from deepspeed.utils import groups as gg, topology  # comment
from . import sibling
from ..pkg import *

@decorator(arg=1)
class A(Base, metaclass=M):
    x: int = 1
    def f(self, /, a, *args, b: "str" = f"{1 + 2!r:>{w}}", **kw) -> None:
        global G
        lambda q, *, r=2: q + r
        async def inner():
            async with ctx() as (c, d):
                async for e in aiter():
                    await e
        [y for y in range(3) if (z := y)]
        {k: v for k, v in kw.items()}
        try:
            pass
        except* ValueError as err:
            raise
        match a:
            case [1, *rest] | {"k": _}:
                pass
            case Point(x=0) if b:
                pass
        return g.get_data_parallel_group(), gg._get_expert_parallel_group("ep")
x = a if b else c; del x
if x:
    import deepspeed.utils.groups as unused
elif y: from deepspeed.utils import groups as unused2
else:
    try:
        from deepspeed.runtime.pipe import topology
    except ImportError:
        import os; from deepspeed.utils import groups
    else:
        with ctx():
            for i in range(2):
                while i:
                    import sys
            else:
                from deepspeed import comm as dist
    finally:
        def later():
            class K:
                import json
print(*args, sep="", **{"end": ""})
'''


def deepspeed_file(relative: str) -> Path:
    spec = importlib.util.find_spec("deepspeed")
    return Path(list(spec.submodule_search_locations)[0]) / relative


SOURCES = {
    "tricky": TRICKY,
    **{p.name: p.read_text() for p in sorted(FIXTURES.glob("*.input.py"))},
    **{f"scripts/{p.name}": p.read_text() for p in sorted((FIXTURES / "scripts").glob("*.py"))},
    **{f"engines/{p.name}": p.read_text() for p in sorted((FIXTURES / "engines").glob("*.py"))},
    **{f"megatron/{p.name}": p.read_text() for p in sorted((FIXTURES / "megatron").glob("*.py"))},
}


def value_of(value):
    """A metadata value as ``get_metadata`` gives it (QualifiedNameProvider stores LazyValues)."""
    return value() if isinstance(value, LazyValue) else value


def walk(node: cst.CSTNode) -> list[cst.CSTNode]:
    """Every node of a tree in a fixed order (to match nodes of a tree and of its deep copy)."""
    out = [node]
    for child in node.children:
        out += walk(child)
    return out


@pytest.mark.parametrize("name", ["tricky", "scripts/moe_groups.py", "megatron/pretrain.py"])
def test_parent_map_equals_libcsts_parent_provider(name):
    module = cst.parse_module(SOURCES[name])
    ours = metadata.parent_map(module)
    theirs = MetadataWrapper(module, unsafe_skip_copy=True).resolve(ParentNodeProvider)
    assert ours is not None and len(ours) == len(theirs) > 100
    assert all(ours[child] is parent for child, parent in theirs.items())


def test_a_node_twice_in_the_tree_means_a_copy():
    module = cst.parse_module("a = x\nb = 1\n")
    name = module.body[0].body[0].value
    twice = module.with_changes(body=[*module.body, module.body[0].with_changes(body=[cst.Expr(name)])])
    assert metadata.parent_map(module) is not None
    assert metadata.parent_map(twice) is None
    wrapper = metadata.LazyMetadataWrapper(twice)
    assert wrapper.module is not twice and wrapper.module.deep_equals(twice)  # copied: each node once
    assert metadata.parent_map(wrapper.module) is not None


def test_a_parsed_tree_is_not_copied_and_nothing_is_resolved_before_it_is_read(monkeypatch):
    monkeypatch.setattr(metadata, "REDUCE_MIN_SHARE", 0.0)  # functions left out however small
    module = cst.parse_module(TRICKY)
    wrapper = metadata.LazyMetadataWrapper(module)
    assert wrapper.module is module
    resolved = wrapper.resolve_many([QualifiedNameProvider, PositionProvider])
    assert all(
        isinstance(stored_metadata(wrapper)[p], metadata._OnFirstUse) for p in (QualifiedNameProvider, PositionProvider)
    )
    assert ScopeProvider not in stored_metadata(wrapper)
    assert isinstance(stored_metadata(wrapper)[ParentNodeProvider], dict)  # the walk's parents
    call = next(
        n for n in walk(module) if isinstance(n, cst.Call) and "get_data_parallel_group" in module.code_for_node(n)
    )
    with metadata.sharing(CODEMODS):
        names = {q.name for q in value_of(resolved[QualifiedNameProvider][call.func])}
    assert names == {"deepspeed.utils.groups.get_data_parallel_group"}
    # within a migration the lookup needs no scopes of the whole tree (``inner`` names nothing the
    # codemods look up: its body is left out of the scopes for qualified names, see
    # test_codemods_throughput.py)
    assert ScopeProvider not in stored_metadata(wrapper)
    assert isinstance(stored_metadata(wrapper)[PositionProvider], metadata._OnFirstUse)  # still not read


@pytest.mark.parametrize("provider", [ScopeProvider, QualifiedNameProvider, PositionProvider, ParentNodeProvider])
def test_values_equal_libcsts_eager_wrapper(provider):
    module = cst.parse_module(TRICKY)
    lazy = metadata.LazyMetadataWrapper(module).resolve_many([provider])[provider]
    eager_wrapper = MetadataWrapper(module)  # deep copy: nodes matched by position in the walk
    eager = eager_wrapper.resolve(provider)
    ours, theirs = walk(module), walk(eager_wrapper.module)
    assert len(ours) == len(theirs)

    def comparable(value):
        value = value_of(value)
        if provider is ScopeProvider:
            return None if value is None else (type(value).__name__, sorted(a.name for a in value.assignments))
        if provider is ParentNodeProvider:
            return type(value).__name__
        if provider is QualifiedNameProvider:
            return sorted((q.name, q.source) for q in value)
        return value

    for a, b in zip(ours, theirs):
        assert (a in lazy) == (b in eager)
        if b in eager:
            assert comparable(lazy[a]) == comparable(eager[b])


def migrate_eagerly(monkeypatch, source: str, **kwargs):
    """``migrate_code`` as before these shortcuts: libcst's own metadata handling (deep copy, every
    provider up front) and a full transform pass of the import cleanup."""
    with monkeypatch.context() as patch:
        patch.delattr(metadata.LazyMetadata, "metadata_reference")
        patch.delattr(metadata.LazyMetadata, "__dir__")
        patch.delattr(LegacyImportsCommand, "transform_module_impl")
        patch.setattr("codemods._engine.base.lazy", lambda cls: cls)
        return migrate_code(source, **kwargs)


# one or more sources per codemod (all of them: ~2x the time)
IDENTITY = [
    "tricky",
    "groups_aliases.input.py",
    "groups_builders.input.py",
    "groups_engine.input.py",
    "topology_grid.input.py",
    "mpu_calls.input.py",
    "initialize_config.input.py",
    "compat_aliases.input.py",
    "scripts/aliases.py",
    "scripts/moe_groups.py",
    "engines/pipeline_initialize.py",
    "megatron/pretrain.py",
    "comm_ops.py",
]


@pytest.mark.parametrize("name", IDENTITY)
def test_migration_output_is_identical_to_eager_metadata(monkeypatch, name):
    comm = name == "comm_ops.py"
    source = (FIXTURES / name).read_text() if comm else SOURCES[name]
    ours = migrate_code(source, comm_to_torch=comm)
    theirs = migrate_eagerly(monkeypatch, source, comm_to_torch=comm)
    assert (ours.code, ours.sites, ours.todos) == (theirs.code, theirs.sites, theirs.todos)
    if name != "tricky":
        assert ours.code != source  # the comparison covers rewrites, not only untouched files


@pytest.mark.deepspeed
@pytest.mark.parametrize("relative", ["moe/mappings.py", "runtime/tensor_parallel/init_utils.py", "moe/layer.py"])
def test_deepspeed_files_migrate_identically(monkeypatch, relative):
    source = deepspeed_file(relative).read_text()
    module = "deepspeed." + relative[: -len(".py")].replace("/", ".")
    kwargs = dict(module=module, package=module.rpartition(".")[0])
    ours = migrate_code(source, **kwargs)
    theirs = migrate_eagerly(monkeypatch, source, **kwargs)
    assert ours.code != source  # a file the codemods rewrite
    assert (ours.code, ours.sites, ours.todos) == (theirs.code, theirs.sites, theirs.todos)


@pytest.mark.parametrize("name", ["tricky", "megatron/pretrain.py", "scripts/aliases.py"])
def test_import_statements_are_all_imports_in_source_order(name):
    module = cst.parse_module(SOURCES[name])
    found = import_statements(module)
    assert found == find_all(module, cst.Import, cst.ImportFrom) and found


def test_matcher_decorated_hooks_are_found_as_with_the_full_listing():
    """LazyMetadata lists only matcher-decorated names to dir(): libcst's matcher __init__ then finds
    the same hooks (and calls them) as it does with every name listed."""
    import libcst.matchers as m
    from libcst.codemod import CodemodContext, ContextAwareTransformer
    from libcst.matchers._visitors import (
        _gather_constructed_leave_funcs,
        _gather_constructed_visit_funcs,
        _gather_matchers,
    )

    class Renamer(metadata.LazyMetadata, ContextAwareTransformer):
        seen: list

        @m.call_if_inside(m.FunctionDef(name=m.Name("f")))
        @m.leave(m.Name("x"))
        def _rename(self, original: cst.Name, updated: cst.Name) -> cst.Name:
            return updated.with_changes(value="y")

        @m.visit(m.Call())
        def _count(self, node: cst.Call) -> None:
            self.seen.append(node)

        @m.call_if_not_inside(m.ClassDef())
        def visit_Arg(self, node: cst.Arg) -> None:
            self.seen.append(node)

    codemod = Renamer(CodemodContext())
    codemod.seen = []
    assert set(dir(codemod)) >= {"_rename", "_count", "visit_Arg"} and len(dir(codemod)) < 20
    full = object.__dir__(codemod)
    assert len(full) > 1000
    for gather in (_gather_constructed_visit_funcs, _gather_constructed_leave_funcs, _gather_matchers):
        ours = gather(codemod)
        assert ours  # each finds something, so the comparison is not of two empty results
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(Renamer, "__dir__", lambda self: object.__dir__(self))
            theirs = gather(codemod)
        assert {k: [getattr(f, "__func__", f) for f in v] if isinstance(v, tuple) else v for k, v in ours.items()} == {
            k: [getattr(f, "__func__", f) for f in v] if isinstance(v, tuple) else v for k, v in theirs.items()
        }
    source = "def f(x):\n    return g(x)\n\n\nclass C:\n    h(x)\n"
    out = cst.parse_module(source).visit(codemod)
    assert out.code == "def f(y):\n    return g(y)\n\n\nclass C:\n    h(x)\n"
    assert [type(n).__name__ for n in codemod.seen] == ["Call", "Arg", "Call"]
