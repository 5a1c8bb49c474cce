"""A zero.Init-sharded ZeRO-3 model handed to engines on other ranks (2 gloo ranks, torchrun,
tests/e2e/zero3_sharded.py): a clear error on every rank that initialises the engine, before any
collective (every part ends with a world barrier: a stuck rank fails the run by its timeout), and
a working sub-world engine once the model is built under the engine's group. Run with DS_MESH_STRICT=1: strict
mode reports the same error (and the remedy creates no group outside mesh_core)."""
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "e2e"))
from runner import torchrun  # noqa: E402

pytestmark = [pytest.mark.multiprocess, pytest.mark.deepspeed]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    # "world" first: zero.Init numbers parameters per process, and "remedy" builds a model on rank 0 only
    return torchrun("zero3_sharded.py", str(tmp_path_factory.mktemp("zero3")), "world,subworld,layout,remedy",
                    timeout=300, world=2, env={"DS_MESH_STRICT": "1"})  # strict mode reports it too


def test_sub_world_engine_on_a_world_sharded_model_is_refused_naming_both_rank_sets(runs):
    error = runs[0]["subworld"]["error"]
    assert runs[0]["subworld"]["param_ranks"] == runs[1]["subworld"]["param_ranks"] == [0, 1]
    assert error is not None, "the sub-world engine accepted parameters partitioned over [0, 1]"
    assert "ZeRO-3 parameter '0.weight' (and 3 more) was partitioned by zero.Init over ranks [0, 1]" in error
    assert "MeshSpec(dp=1; ranks 0..0 of world 2)" in error and "over ranks [0]" in error
    assert "ranks [1] hold parts of it and are not in the engine" in error
    assert "zero.Init(data_parallel_group=mesh.get_group(('dp', 'sp')))" in error
    assert "error" not in runs[1]["subworld"]  # rank 1 is not in the engine: it never called initialize


def test_a_layout_whose_zero_group_is_not_zero_inits_is_refused_on_every_rank(runs):
    for rank, res in enumerate(runs):
        error = res["layout"]["error"]
        assert error is not None
        assert "was partitioned by zero.Init over ranks [0, 1]" in error
        assert f"MeshSpec(dp=1, tp=2; ranks 0..1 of world 2), partitions rank {rank}'s parameters over ranks [{rank}]" in error


def test_the_remedy_the_error_names_trains_a_sub_world_engine(runs):
    remedy = runs[0]["remedy"]
    assert remedy["param_ranks"] == [0] and remedy["mesh"] == "MeshSpec(dp=1; ranks 0..0 of world 2)"
    assert len(remedy["losses"]) == 2
    assert runs[1]["remedy"] == {}


def test_a_whole_world_engine_on_the_zero_init_model_still_trains(runs):
    for res in runs:
        assert len(res["world"]["losses"]) == 2
    assert runs[0]["world"]["losses"] == runs[1]["world"]["losses"]
