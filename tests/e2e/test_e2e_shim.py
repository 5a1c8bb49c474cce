"""End to end, 4 gloo processes: unchanged deepspeed training with ``compat.install()`` gives
bit-identical losses and parameters to legacy deepspeed, and the engine's groups are its mesh's.

One torchrun per model trains every mode in one world (see tests/e2e/common.py).
"""

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "e2e"))
from runner import assert_bit_identical, torchrun  # noqa: E402

pytestmark = [pytest.mark.multiprocess, pytest.mark.deepspeed, pytest.mark.torch_releases]


@pytest.fixture(scope="module")
def pipe_runs(tmp_path_factory):
    return torchrun("train_pipe.py", str(tmp_path_factory.mktemp("pipe")))


@pytest.fixture(scope="module")
def moe_runs(tmp_path_factory):
    return torchrun("train_moe.py", str(tmp_path_factory.mktemp("moe")))


@pytest.mark.parametrize(
    "mode,reference", [("shim", "legacy"), ("shim_config", "legacy"), ("shim_zero1", "legacy_zero1")]
)
def test_pipeline_bit_identical(pipe_runs, mode, reference):
    for rank, runs in enumerate(pipe_runs):
        assert_bit_identical(runs[reference], runs[mode], f"pipe rank {rank} {mode}")
        assert runs[mode]["groups"] == runs[reference]["groups"]
        assert runs[mode]["optimizer"] == runs[reference]["optimizer"]
    assert "Zero" in pipe_runs[0]["shim_zero1"]["optimizer"]
    # the pipeline really trained (losses change, stages hold different layers)
    assert len(set(pipe_runs[0]["legacy"]["losses"])) > 1
    assert pipe_runs[0]["legacy"]["params"].keys() != pipe_runs[2]["legacy"]["params"].keys()


@pytest.mark.parametrize("mode", ["shim", "shim_config", "shim_zero1"])
def test_pipeline_groups_come_from_engine_mesh(pipe_runs, mode):
    for rank, runs in enumerate(pipe_runs):
        mesh = runs[mode]["mesh"]
        assert mesh["type"] == "EngineMesh"
        assert mesh["describe"].startswith("MeshSpec(pp=2, dp=2;")
        assert all(mesh["same_objects"].values()), mesh["same_objects"]
        assert mesh["dp"] == runs["legacy"]["groups"]["dp"] and mesh["pp"] == runs["legacy"]["groups"]["pp"]
        assert mesh["legacy_size"] == 2


def test_pipeline_shim_creates_fewer_communicators(pipe_runs):
    runs = pipe_runs[1]
    assert runs["shim"]["new_groups"] < runs["legacy"]["new_groups"]
    # a second engine with the same layout (config "mesh" section) reuses the communicators, and
    # PipelineModule's world-group clone (deepspeed.comm.new_group) is the world group itself
    assert runs["shim_config"]["new_groups"] == 0


@pytest.mark.parametrize(
    "mode,reference",
    [("shim", "legacy"), ("shim_mpu", "legacy_mpu"), ("shim_config", "legacy"), ("shim_zero2", "legacy_zero2")],
)
def test_moe_bit_identical(moe_runs, mode, reference):
    for rank, runs in enumerate(moe_runs):
        assert_bit_identical(runs[reference], runs[mode], f"moe rank {rank} {mode}")
        assert runs[mode]["groups"] == runs[reference]["groups"]
        assert runs[mode]["optimizer"] == runs[reference]["optimizer"]
    assert "Zero" in moe_runs[0]["shim_zero2"]["optimizer"]
    # different data per rank: the ranks' losses differ, the synchronised parameters don't
    assert moe_runs[0]["legacy"]["losses"] != moe_runs[1]["legacy"]["losses"]
    dense = "inp.weight"
    assert torch.equal(moe_runs[0]["shim"]["params"][dense], moe_runs[3]["shim"]["params"][dense])


@pytest.mark.parametrize("mode", ["shim", "shim_mpu", "shim_config", "shim_zero2"])
def test_moe_groups_come_from_engine_mesh(moe_runs, mode):
    for rank, runs in enumerate(moe_runs):
        mesh = runs[mode]["mesh"]
        assert mesh["type"] == "EngineMesh"
        assert all(mesh["same_objects"].values()), mesh["same_objects"]
        assert mesh["ep"] == runs["legacy"]["groups"]["ep"] and mesh["edp"] == runs["legacy"]["groups"]["edp"]


def test_moe_mpu_warns_todov1_once(moe_runs):
    for runs in moe_runs:
        (message,) = runs["shim_mpu"]["todov1"]  # exactly one, at the user's call site
        assert message.startswith("TODOV1: deepspeed.initialize(mpu=...)") and 'put "mesh": {' in message
        assert " ".join(message.split()).endswith("(ds-migrate --explain initialize.mpu)")
        assert max(len(line) for line in message.splitlines()) <= 100
        assert runs["shim"]["todov1"] == [] and runs["shim_config"]["todov1"] == []
