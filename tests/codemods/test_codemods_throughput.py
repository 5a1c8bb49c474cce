"""The throughput shortcuts of the codemods (codemods/_engine/metadata.py, pipeline.py) change no output:
metadata shared across the codemods of a file while its tree is unchanged, unchanged nodes kept
as the same objects, one node list per tree, qualified names computed per node on read, hook
dispatch by table, statements without a codemod's identifiers not visited, no printing of a
tree that no codemod changed, qualified names from scopes that leave out functions naming nothing
the codemods look up, import aliases from the import statements, MpuInternalCommand's exact
pre-filter, and AddImportsVisitor's top-import gathering over the leading statements only."""

from __future__ import annotations

import contextlib

import libcst as cst
import pytest
from libcst.codemod import CodemodContext
from libcst.metadata import MetadataWrapper, QualifiedNameProvider, ScopeProvider
from test_codemods_metadata import FIXTURES, IDENTITY, SOURCES, deepspeed_file, value_of, walk

from codemods import migrate_code
from codemods._engine import metadata, pipeline
from codemods._engine.base import find_all, import_aliases
from codemods.rules.groups_getters import GroupsGettersCommand
from codemods.rules.mpu_internal import MpuInternalCommand


class _Fake:
    """Stands in for QualifiedNameProvider in metadata.py: libcst's provider walk is used."""


def migrate_plainly(monkeypatch, source: str, **kwargs):
    """``migrate_code`` without the shortcuts (the lazy metadata of issue 10 stays)."""
    with monkeypatch.context() as patch:
        patch.setattr(metadata, "_PRUNE", {})
        patch.setattr(metadata.LazyMetadata, "_hooks", lambda self: None)
        patch.delattr(metadata.LazyMetadata, "on_leave")
        patch.setattr(pipeline, "sharing", contextlib.nullcontext)
        patch.setattr("codemods._engine.base.preorder", lambda tree: None)
        patch.setattr(metadata, "QualifiedNameProvider", _Fake)
        patch.setattr(pipeline, "_NEEDS", {})
        patch.setattr(metadata, "_TOP_GATHERER_LEAVES_ONLY", False)
        patch.setattr(metadata, "_LAZY_CLASSES", {})
        return migrate_code(source, **kwargs)


@pytest.mark.parametrize("name", IDENTITY)
def test_output_is_identical_without_the_shortcuts(monkeypatch, name):
    comm = name == "comm_ops.py"
    source = (FIXTURES / name).read_text() if comm else SOURCES[name]
    ours = migrate_code(source, comm_to_torch=comm)
    theirs = migrate_plainly(monkeypatch, source, comm_to_torch=comm)
    assert (ours.code, ours.sites, ours.todos) == (theirs.code, theirs.sites, theirs.todos)
    again = migrate_code(ours.code, comm_to_torch=comm)  # a fixed point: the tree is not printed
    assert (again.code, again.todos) == (ours.code, migrate_plainly(monkeypatch, ours.code, comm_to_torch=comm).todos)


@pytest.mark.deepspeed
@pytest.mark.parametrize("relative", ["moe/sharded_moe.py"])
def test_deepspeed_files_identical_without_the_shortcuts(monkeypatch, relative):
    source = deepspeed_file(relative).read_text()
    module = "deepspeed." + relative[: -len(".py")].replace("/", ".")
    kwargs = dict(module=module, package=module.rpartition(".")[0])
    ours = migrate_code(source, **kwargs)
    theirs = migrate_plainly(monkeypatch, source, **kwargs)
    assert ours.code != source
    assert (ours.code, ours.sites, ours.todos) == (theirs.code, theirs.sites, theirs.todos)


ALIASED = """\
from deepspeed.utils.groups import _get_data_parallel_group as dpg
from deepspeed.utils import groups
from deepspeed.runtime.utils import bwc_tensor_model_parallel_world_size as tpws


def f(engine, mpu):
    def g():
        return dpg()
    x = tpws(mpu)
    return g, groups.get_tensor_model_parallel_world_size(), x


def untouched():
    return 1
"""


@pytest.mark.parametrize("module", [None, "deepspeed.runtime.x"])
def test_aliases_keep_their_statements_visited(monkeypatch, module):
    kwargs = dict(module=module, package=module.rpartition(".")[0] if module else None)
    ours = migrate_code(ALIASED, **kwargs)
    theirs = migrate_plainly(monkeypatch, ALIASED, **kwargs)
    assert (ours.code, ours.sites, ours.todos) == (theirs.code, theirs.sites, theirs.todos)
    assert ours.sites or ours.todos


def test_statements_names_cover_nested_statements_and_star_imports():
    module = cst.parse_module("def f():\n    if a:\n        return b.c(d=e)\nfrom x import *\ny = 1\n")
    found = metadata.statements(module)
    func, star, assign = module.body
    assert {"f", "a", "b", "c", "d", "e"} <= found.names[func]
    assert star in found.stars and func not in found.stars
    assert found.names[assign] == {"y"}


def test_a_codemod_that_changes_nothing_returns_the_same_tree_and_shares_metadata(monkeypatch):
    source = "from deepspeed.utils import groups\n\ndef f(x):\n    return [x + 1 for _ in range(3)]\n"
    tree = cst.parse_module(source)
    made = []
    real = metadata.LazyMetadataWrapper.__init__

    def counting(self, module):
        made.append(module)
        real(self, module)

    monkeypatch.setattr(metadata.LazyMetadataWrapper, "__init__", counting)
    with metadata.sharing():
        out = GroupsGettersCommand(CodemodContext()).transform_module(tree)
        out = MpuInternalCommand(CodemodContext(full_module_name="deepspeed.x")).transform_module(out)
    assert out is tree
    assert made == [tree]  # one wrapper for both codemods
    assert GroupsGettersCommand(CodemodContext()).transform_module(tree) is tree  # also outside sharing()
    assert len(made) == 2


SCOPES = """\
import deepspeed.utils.groups as groups
from deepspeed.utils.groups import get_data_parallel_group as dpg
from deepspeed.utils import *
G = None


def plain(a, b=groups.get_data_parallel_group()):
    x = a + b
    dpg = None
    return [x for x in range(a)], dpg


def sets_global():
    global groups
    groups = object()


def outer():
    groups = None

    def inner():
        nonlocal groups
        groups = 1

    def user():
        return groups.get_data_parallel_group(), get_data_parallel_world_size()

    return inner, user


class C:
    dpg = dpg

    def m(self):
        return dpg(), getattr(self, "x")

    def n(self):
        return [y for y in range(3) if (z := y)], lambda q=groups: q

    def quiet(self, groups):
        return groups


def later():
    mpu = None
    return groups._get_data_parallel_group(), mpu.get_data_parallel_group()


@decorate(groups.get_data_parallel_world_size)
def decorated(x: "groups.Foo") -> groups.Bar:
    async def nested():
        return x
    return nested
"""


@pytest.mark.parametrize("name", ["scopes", *IDENTITY])
def test_reduced_scopes_give_libcsts_qualified_names_for_every_node(monkeypatch, name):
    source = SCOPES if name == "scopes" else (FIXTURES / name).read_text() if name == "comm_ops.py" else SOURCES[name]
    module = cst.parse_module(source)
    wrapper = metadata.LazyMetadataWrapper(module)
    full = {}
    used = {"reduced": 0, "full": 0}

    def separately(self):  # the whole tree's scopes, never stored: every node asks the reduced ones first
        used["full"] += 1
        if not full:
            full["scopes"] = MetadataWrapper(self._module, unsafe_skip_copy=True).resolve(ScopeProvider)
        return full["scopes"]

    monkeypatch.setattr(metadata._QualifiedNames, "_full", separately)
    monkeypatch.setattr(metadata, "REDUCE_MIN_SHARE", 0.0)  # functions left out however small
    eager_wrapper = MetadataWrapper(module)
    eager = eager_wrapper.resolve(QualifiedNameProvider)
    with metadata.sharing(pipeline.CODEMODS):
        ours = wrapper.resolve_many([QualifiedNameProvider])[QualifiedNameProvider]
        for a, b in zip(walk(module), walk(eager_wrapper.module), strict=True):
            assert (a in ours) == (b in eager)
            if b in eager:
                mine = sorted((q.name, q.source) for q in value_of(ours[a]))
                assert mine == sorted((q.name, q.source) for q in value_of(eager[b])), module.code_for_node(a)
        reduced = ours._resolved()._reduced
    if name == "scopes":
        _, emptied, dropped, rebuilt = reduced
        # ``inner`` / ``sets_global`` declare nonlocal / global names, ``plain`` names an alias of a getter
        assert {f.name.value for f in emptied} == {"n", "quiet", "nested"}
        assert used["full"] > 0  # nodes in the emptied bodies


def test_import_aliases_are_those_of_every_import_alias_in_source_order():
    for source in [SCOPES, ALIASED, *SOURCES.values()]:
        module = cst.parse_module(source)
        expected = {
            alias.asname.name.value: alias.evaluated_name.rpartition(".")[2]
            for alias in find_all(module, cst.ImportAlias)
            if alias.asname is not None and isinstance(alias.asname.name, cst.Name)
        }
        assert import_aliases(module) == expected


COMPUTE = "from deepspeed.utils import groups\n\ndef compute(x):\n    return x.get_data_parallel_group()  # mpu\n"


@pytest.mark.parametrize("module", ["deepspeed.runtime.x", None, "deepspeed.utils.bwc"])
def test_mpu_internal_runs_only_where_it_can_act(monkeypatch, module):
    kwargs = dict(module=module, package=module.rpartition(".")[0] if module else None)
    ran = []
    real = MpuInternalCommand.transform_module
    monkeypatch.setattr(MpuInternalCommand, "transform_module", lambda self, tree: ran.append(1) or real(self, tree))
    for source, acts in [(COMPUTE, False), (COMPUTE.replace("x.get_data", "mpu.get_data"), True)]:
        ran.clear()
        ours = migrate_code(source, **kwargs)
        assert bool(ran) == (acts and module == "deepspeed.runtime.x")
        theirs = migrate_plainly(monkeypatch, source, **kwargs)
        assert (ours.code, ours.sites, ours.todos) == (theirs.code, theirs.sites, theirs.todos)
    assert migrate_code("import deepspeed\ndef compute(): pass\n", **kwargs).skipped == "no codemod applies"


NESTED_IMPORTS = '''\
"""doc"""
from deepspeed.utils import groups
import os


def f():
    from deepspeed.utils import groups as g2
    import sys
    return groups.get_data_parallel_group(), g2.get_data_parallel_world_size()


class C:
    if os:
        from deepspeed.utils.groups import get_data_parallel_rank as rank

    def m(self):
        return self.rank()


x = 1
'''


def test_import_passes_visit_only_statements_holding_imports(monkeypatch):
    assert metadata._IMPORT_PASS_HOOKS_ONLY  # the installed libcst's import passes hook imports only
    pruned = []
    real = metadata.LazyMetadata.on_visit

    def spy(self, node):
        result = real(self, node)
        if isinstance(self, metadata._IMPORT_PASSES) and self._pruned is node:
            pruned.append(type(node).__name__)
        return result

    monkeypatch.setattr(metadata.LazyMetadata, "on_visit", spy)
    ours = migrate_code(NESTED_IMPORTS)
    assert "SimpleStatementLine" in pruned  # e.g. ``x = 1`` and the ``return``
    monkeypatch.undo()
    theirs = migrate_plainly(monkeypatch, NESTED_IMPORTS)
    assert ours.sites and (ours.code, ours.sites, ours.todos) == (theirs.code, theirs.sites, theirs.todos)
    module = cst.parse_module(NESTED_IMPORTS)
    found = metadata.statements(module)
    assert {type(s).__name__ for s in module.body if s in found.imports} == {
        "SimpleStatementLine",
        "FunctionDef",
        "ClassDef",
    }


LEADING = {
    "docstring": '"""doc."""\nimport os\nfrom a import b as c\nx = 1\nimport late\n',
    "strict": "__strict__ = True\nimport os\nx = 1\nfrom late import y\n",
    "import first": "import os\nimport sys\ndef f():\n    import inner\nimport late\n",
    "code first": "x = 1\nimport os\n",
    "only imports": '"""doc."""\nimport os\nfrom a import (b, c)\n',
    "two on a line": "import os; import sys\nimport re\nx = 1\n",
    "empty": "",
    "future": "from __future__ import annotations\nimport os\nif x:\n    import y\n",
}


@pytest.mark.parametrize("name", sorted(LEADING))
def test_top_import_gatherer_reads_the_same_from_the_leading_statements(name):
    from libcst.codemod.visitors._add_imports import _GatherTopImportsBeforeStatements

    assert metadata._TOP_GATHERER_LEAVES_ONLY  # the installed libcst's gatherer acts in leave_Module only
    module = cst.parse_module(LEADING[name])
    results = []
    for tree in (module, metadata._leading_imports(module)):
        gatherer = _GatherTopImportsBeforeStatements(CodemodContext())
        tree.visit(gatherer)
        results.append(
            (
                gatherer.all_imports,
                gatherer.module_imports,
                gatherer.object_mapping,
                gatherer.module_aliases,
                gatherer.alias_mapping,
            )
        )
    assert results[0] == results[1]
    assert all(
        a is b for a, b in zip(results[0][0], results[1][0])
    )  # the very import nodes (leave_ImportFrom checks `in`)
