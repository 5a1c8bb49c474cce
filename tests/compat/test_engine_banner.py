"""The shim's one line per engine (compat.engine_banner): dims and sizes, HSDP, the ranks; on the
engine's first rank only; quiet through the ``deepspeed`` logging tree's levels."""

from __future__ import annotations

import logging

import pytest

from compat.engine_banner import announce, describe
from mesh_core import MeshSpec

pytestmark = pytest.mark.torch_releases


@pytest.mark.parametrize(
    "spec,parts",
    [
        (MeshSpec.build(4), ["the mesh dp=4", "all 4 ranks", "engine.mesh_device"]),
        (
            MeshSpec.build(4, dp_replicate=2, dp_shard=2),
            ["dp_replicate=2 x dp_shard=2", "HSDP: ZeRO partitions over dp_shard (2 ranks)", "across dp_replicate (2"],
        ),
        (MeshSpec.build(8, pp=2, tp=2, ep=2), ["pp=2 x dp=2 x tp=2", "ep=2"]),
        (MeshSpec.build(8, ranks=[4, 5, 6, 7], tp=2), ["dp=2 x tp=2", "ranks 4..7 of 8 (a sub-world engine)"]),
        (MeshSpec.build(1), ["the mesh dp=1", "; the world's one rank;"]),  # not "all 1 ranks"
        (MeshSpec.build(8, ranks=[3], dp=1), ["; rank 3 of 8 (a sub-world engine)"]),
    ],
)
def test_the_line_says_the_mesh(spec, parts):
    line = describe(spec)
    assert line.startswith("ds-mesh: this engine runs on the mesh")
    for part in parts:
        assert part in line, line
    assert ("HSDP" in line) == ("dp_shard" in spec.names)


class _Records(logging.Handler):
    def __init__(self):
        super().__init__()
        self.lines = []

    def emit(self, record):
        self.lines.append(record.getMessage())


@pytest.fixture
def records():
    handler, tree = _Records(), logging.getLogger("deepspeed")
    target = logging.getLogger("deepspeed.mesh")
    level = tree.level
    target.addHandler(handler)
    yield handler, tree
    target.removeHandler(handler)
    tree.setLevel(level)


def test_first_rank_only_and_quiet_through_the_tree(records):
    handler, tree = records
    spec = MeshSpec.build(8, ranks=[4, 5, 6, 7], tp=2)
    tree.setLevel(logging.WARNING)  # the shim's default
    for rank in spec.ranks:
        announce(spec, rank)
    assert handler.lines == [describe(spec)]
    tree.setLevel(logging.ERROR)  # "logging": {"level": "error"}
    announce(spec, 4)
    assert len(handler.lines) == 1
