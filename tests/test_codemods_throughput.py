"""The throughput shortcuts of the codemods (codemods/metadata.py, pipeline.py) change no output:
metadata shared across the codemods of a file while its tree is unchanged, unchanged nodes kept
as the same objects, one node list per tree, qualified names computed per node on read, hook
dispatch by table, statements without a codemod's identifiers not visited, and no printing of a
tree that no codemod changed."""
from __future__ import annotations

import contextlib

import libcst as cst
import pytest
from libcst.codemod import CodemodContext

from codemods import metadata, pipeline
from codemods.groups_getters import GroupsGettersCommand
from codemods.mpu_internal import MpuInternalCommand
from codemods.pipeline import migrate_code

from test_codemods_metadata import FIXTURES, IDENTITY, SOURCES, deepspeed_file


class _Fake:
    """Stands in for QualifiedNameProvider in metadata.py: libcst's provider walk is used."""


def migrate_plainly(monkeypatch, source: str, **kwargs):
    """``migrate_code`` without the shortcuts (the lazy metadata of issue 10 stays)."""
    with monkeypatch.context() as patch:
        patch.setattr(metadata, "_PRUNE", {})
        patch.setattr(metadata.LazyMetadata, "_hooks", lambda self: None)
        patch.delattr(metadata.LazyMetadata, "on_leave")
        patch.setattr(pipeline, "sharing", contextlib.nullcontext)
        patch.setattr("codemods.base.preorder", lambda tree: None)
        patch.setattr(metadata, "QualifiedNameProvider", _Fake)
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


ALIASED = '''\
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
'''


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
