"""Communicators that step aside on 4 gloo ranks (tests/e2e/step_aside_jobs.py through torchrun):
a mesh releases every communicator it holds (none left alive in torch, nothing holds the old
groups, a use while released names the remedy) and resumes them (the same rank sets and uses,
the same collective results); ZeRO-1 and ZeRO-3 engines released and resumed between steps train
bit-identically to engines never released, and so do a pipeline engine (pp=2, dp=2) and a ZeRO-3
engine whose ZeRO++ hpZ groups lie outside its mesh (released with it)."""

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
from runner import torchrun  # noqa: E402

pytestmark = [pytest.mark.multiprocess, pytest.mark.deepspeed]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return torchrun(
        "step_aside_jobs.py", str(tmp_path_factory.mktemp("step_aside")), "mesh,zero1,zero3,pipe,zero3_hpz", timeout=240
    )


def test_a_released_mesh_holds_no_communicator_and_resumes_the_same_memberships(runs):
    for rank, res in enumerate(runs):
        mesh = res["mesh"]
        assert mesh["live_before"] == 3 and mesh["modes"] == ["destroy"]  # gloo cannot suspend
        assert mesh["memory_reported"] == [None, [None] * 3]  # nor report its memory
        assert mesh["live_released"] == 0 and mesh["alive_released"] == 0
        assert mesh["old_objects_alive"] == 0 and mesh["still_referenced"] == []
        assert [state for *_, state in mesh["held_released"]] == ["released"] * 3
        assert (
            "ranks=[" in mesh["released_use_error"] or "ranks [" in mesh["released_use_error"]
        ) and "call resume_communicators() on every member" in mesh["released_use_error"]
        assert mesh["held_after"] == mesh["held_before"]
        assert mesh["shared_after"]  # a second mesh sharing its rank sets, released and resumed too
        assert all(state == "alive" for *_, state in mesh["held_after"])
        assert mesh["live_after"] == 3
        # same rank sets, the next generation of the same names
        assert [n.rsplit(".", 1) for n in mesh["names_after"]] == [
            [n.rsplit(".", 1)[0], "1"] for n in mesh["names_before"]
        ]
        assert mesh["sums_after"] == mesh["sums_before"]
        assert mesh["device_mesh_dp"] == [rank - rank % 2, rank - rank % 2 + 1]
    assert runs[0]["mesh"]["held_before"] == [
        [["pp", "p2p"], [0, 2], "alive"],
        [["dp", "ep(2)"], [0, 1], "alive"],
        [["edp(2)"], [0], "alive"],
    ]


@pytest.mark.parametrize("part", ["zero1", "zero3", "zero3_hpz"])
def test_an_engine_released_between_steps_trains_bit_identically(runs, part):
    for rank, res in enumerate(runs):
        straight, aside = res[part]["straight"], res[part]["step_aside"]
        assert aside["alive_released"] == [0, 0] and aside["live_released"] == [0, 0]
        assert aside["still_referenced"] == [[]]  # nothing kept a destroyed group alive
        assert aside["losses"] == straight["losses"]
        assert straight["params"].keys() == aside["params"].keys()
        for name, value in straight["params"].items():
            assert torch.equal(aside["params"][name], value), f"rank {rank} {part}: parameter {name} differs"
        half = [0, 1] if rank < 2 else [2, 3]
        assert aside["dp_group"] == straight["dp_group"] == ([0, 1, 2, 3] if part == "zero3_hpz" else half)
        if part == "zero3_hpz":  # the hpZ group is the engine's, outside its (world) mesh: released too
            assert [half, "alive"] in [held[1:] for held in straight["held_end"]]
        assert aside["held"] == [straight["held_end"]] * 2
        if part != "zero3_hpz":  # a world engine's data-parallel group is the world, never released
            assert all("DeepSpeedEngine.data_parallel_group" in rebound for rebound in aside["rebound"])
        assert all(aside["rebound"])
    rebound = runs[0]["zero3"]["step_aside"]["rebound"][0]
    assert any(path.endswith(".ds_process_group") for path in rebound)  # ZeRO-3 parameters' groups
    rebound = runs[0]["zero1"]["step_aside"]["rebound"][0]
    assert "DeepSpeedEngine.optimizer.dp_process_group" in rebound


def test_a_pipeline_engine_released_between_steps_trains_bit_identically(runs):
    for rank, res in enumerate(runs):
        straight, aside = res["pipe"]["straight"], res["pipe"]["step_aside"]
        assert aside["alive_released"] == [0, 0] and aside["live_released"] == [0, 0]
        assert aside["losses"] == straight["losses"]
        for name, value in straight["params"].items():
            assert torch.equal(aside["params"][name], value), f"rank {rank} pipe: parameter {name} differs"
        assert aside["dp_group"] == straight["dp_group"]
