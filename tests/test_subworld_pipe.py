"""Sub-world pipeline engines (issue 11): two 2-stage pipelines on disjoint halves of a 4-rank gloo
world, each half building only its own PipelineModule (topology=compat.mesh_topology(...)) and engine
(one torchrun of tests/e2e/subworld_pipe.py)."""
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "e2e"))
from runner import torchrun  # noqa: E402

pytestmark = [pytest.mark.multiprocess, pytest.mark.deepspeed]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return [r["pipe"] for r in torchrun("subworld_pipe.py", str(tmp_path_factory.mktemp("swpipe")), timeout=300)]


def test_pipeline_groups_are_the_halves(runs):
    for rank, res in enumerate(runs):
        half = [0, 1] if rank < 2 else [2, 3]
        assert res["mesh"] == f"MeshSpec(pp=2, dp=1; ranks {half[0]}..{half[1]} of world 4)"
        assert res["pp_group"] == res["pp_group_ranks"] == res["world_group"] == half
        assert res["pipe_groups"] == [half] and res["dp_group"] == [rank]
        assert res["stage"] == rank % 2 and res["module_rank"] == rank
        assert res["peer"] == half[1 - rank % 2]  # p2p sends go to the global rank of the other stage
        assert res["topo_pipe_lists"] == [half] and res["topo_stage1"] == [half[1]]
        assert res["topo_mapping"] == half
        assert res["tied"] == ([] if rank < 2 else [half])


def test_no_rank_ever_joins_a_group_of_the_other_half(runs):
    for rank, res in enumerate(runs):
        half = {0, 1} if rank < 2 else {2, 3}
        assert res["groups"] and all(set(g) <= half for g in res["groups"]), res["groups"]


def test_losses_equal_the_unpipelined_model(runs):
    for res in runs:
        assert len(res["losses"]) == 3 and len(set(res["losses"])) == 3
        assert res["losses"] == pytest.approx(res["reference"], rel=1e-6, abs=1e-6)
    assert runs[0]["losses"] == runs[1]["losses"] and runs[2]["losses"] == runs[3]["losses"]
    assert runs[0]["losses"] != runs[2]["losses"]  # two different models
    assert runs[2]["tied_identical"] and runs[3]["tied_identical"]


def test_a_rank_outside_the_mesh_is_refused_before_any_group(runs):
    for rank, res in enumerate(runs):
        assert "is not one of the ranks of MeshSpec(pp=2" in res["non_member_error"]
        assert "skip its PipelineModule and deepspeed.initialize" in res["non_member_error"]
        assert res["groups_after_refusal"]


# --- AutoTP engines on disjoint halves (tests/e2e/subworld_autotp.py) -------------------------------
@pytest.fixture(scope="module")
def autotp(tmp_path_factory):
    halves = torchrun("subworld_autotp.py", str(tmp_path_factory.mktemp("swtp")), "halves", timeout=300)
    legacy = torchrun("subworld_autotp.py", str(tmp_path_factory.mktemp("swtp_legacy")), "legacy", timeout=300,
                      world=2)
    return [r["autotp"] for r in halves], [r["autotp"] for r in legacy]


def test_autotp_engines_on_disjoint_halves_shard_over_their_half(autotp):
    halves, _ = autotp
    for rank, res in enumerate(halves):
        half = [0, 1] if rank < 2 else [2, 3]
        report = res["A" if rank < 2 else "B"]
        assert report["mesh"] == f"MeshSpec(dp=1, tp=2; ranks {half[0]}..{half[1]} of world 4)"
        assert report["tp_group"] == half and report["dp_group"] == [rank]
        assert (report["up_type"], report["down_type"]) == ("LinearLayer", "LinearAllreduce")
        assert report["up_shape"] == [8, 8]  # 16 x 8 column-split over 2 ranks
        assert all(set(g) <= set(half) for g in res["groups"]), res["groups"]


def test_autotp_sub_world_losses_equal_legacy_deepspeed(autotp):
    halves, legacy = autotp
    for rank, res in enumerate(halves):
        name = "A" if rank < 2 else "B"
        ours, theirs = res[name], legacy[rank % 2][name]
        assert ours["losses"] == theirs["losses"]  # bit for bit: same sharding, same collectives
        assert ours["up_shape"] == theirs["up_shape"] and theirs["tp_group"] == [0, 1]
        assert ours["losses"][0] == pytest.approx(res["reference"][0], rel=1e-6)  # unsharded model, step 1
    assert halves[0]["A"]["losses"] != halves[2]["B"]["losses"]
