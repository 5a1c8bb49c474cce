"""Sub-world pipeline engines (issue 11): two 2-stage pipelines on disjoint halves of a 4-rank gloo
world, each half building only its own PipelineModule (topology=compat.mesh_topology(...)) and engine
(one torchrun of tests/e2e/subworld_pipe.py)."""

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "e2e"))
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
        assert len(res["losses"]) == 4 and len(set(res["losses"])) == 4
        assert res["losses"] == pytest.approx(res["reference"], rel=1e-6, abs=1e-6)
    assert runs[0]["losses"] == runs[1]["losses"] and runs[2]["losses"] == runs[3]["losses"]
    assert runs[0]["losses"] != runs[2]["losses"]  # two different models
    assert runs[2]["tied_identical"] and runs[3]["tied_identical"]


def test_a_whole_world_engine_coexists_with_the_pipelines(runs):
    for res in runs:  # the pipelines' last step (checked above) ran interleaved with its step
        assert res["world_zero_group"] == [0, 1, 2, 3]
        assert torch.equal(res["world_weight"], runs[0]["world_weight"])


def test_a_rank_outside_the_mesh_is_refused_before_any_group(runs):
    for rank, res in enumerate(runs):
        assert "is not one of the ranks of MeshSpec(pp=2" in res["non_member_error"]
        assert "skip its PipelineModule and deepspeed.initialize" in res["non_member_error"]
        assert res["groups_after_refusal"]


# --- AutoTP engines on disjoint halves (tests/e2e/subworld_autotp.py) -------------------------------
@pytest.fixture(scope="module")
def autotp(tmp_path_factory):
    halves = torchrun("subworld_autotp.py", str(tmp_path_factory.mktemp("swtp")), "halves", timeout=300)
    legacy = torchrun("subworld_autotp.py", str(tmp_path_factory.mktemp("swtp_legacy")), "legacy", timeout=300, world=2)
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


# --- MeshTopology on a fake 8-rank world (no processes) ---------------------------------------------
def test_mesh_topology_answers_in_the_meshs_global_ranks():
    """A sub-world mesh in a non-identity rank order: the topology, and the compat grid built on it,
    agree with the mesh layout for every rank; a non-member is refused before any group."""
    from compat.subworld_pipe import MeshTopology, mesh_topology
    from compat.topology import PipelineParallelGrid
    from fakepg import fake_world, record_new_groups
    from mesh_core import MeshSpec, MeshSpecError

    spec = MeshSpec.build(8, ranks=[7, 6, 5, 4], pp=2, dp=2)
    with fake_world(5, 8):
        topo = mesh_topology(spec)
        assert isinstance(topo, MeshTopology) and topo.get_axis_names() == ["pipe", "data"]
        layout = topo.mesh.layout
        for r in spec.ranks:
            coord = layout.coordinate(r)
            assert topo.get_coord(r) == topo.ProcessCoord(pipe=coord["pp"], data=coord["dp"])
            assert topo.get_rank(pipe=coord["pp"], data=coord["dp"]) == r
        assert sorted(map(sorted, topo.get_axis_comm_lists("pipe"))) == sorted(map(sorted, layout.groups("pp")))
        assert sorted(topo.mapping.values()) == [4, 5, 6, 7]
        with pytest.raises(ValueError, match="rank 0 not found"):
            topo.get_coord(0)
        grid = PipelineParallelGrid(topology=topo)
        assert grid.mesh is topo.mesh and grid.pp_group == layout.group_ranks("pp", 5)
        assert grid.stage_to_global(1 - grid.get_stage_id()) == layout.stage_peer(5, 1)
        assert grid.dp_group == layout.group_ranks("dp", 5) and grid._is_grid_valid()
    with fake_world(0, 8), record_new_groups() as calls:
        with pytest.raises(MeshSpecError, match="rank 0 is not one of the ranks of MeshSpec"):
            mesh_topology(spec)
        assert calls == []
