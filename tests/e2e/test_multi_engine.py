"""Several engines in one 4-rank gloo world (one torchrun, tests/e2e/multi_engine.py):
wrong-grid protection with interleaved steps, and sub-world engines on disjoint halves."""

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "e2e"))
from runner import torchrun  # noqa: E402

pytestmark = [pytest.mark.multiprocess, pytest.mark.deepspeed]
PARTS = "grid,halves,moe"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return torchrun("multi_engine.py", str(tmp_path_factory.mktemp("multi")), PARTS, timeout=300)


def test_interleaved_steps_each_see_their_own_tp_group(runs):
    for rank, res in enumerate(runs):
        grid = res["grid"]
        assert grid["a_tp"] == [[0, 1], [2, 3]][rank // 2]
        assert grid["b_tp"] == [[0, 2], [1, 3]][rank % 2]
        # forward ran twice per engine, interleaved with the other engine's forward/backward/step
        assert grid["a_seen"] == [grid["a_tp"]] * 2
        assert grid["b_seen"] == [grid["b_tp"]] * 2


def test_one_engine_still_serves_legacy_getters_outside_steps(runs):
    for rank, res in enumerate(runs):
        assert res["grid"]["single_engine_tp"] == res["grid"]["a_tp"]
        assert res["grid"]["after_destroy_tp"] == res["grid"]["a_tp"]  # b destroyed: a is the only one


def test_getters_outside_steps_name_the_engines(runs):
    for res in runs:
        errors = res["grid"]["errors"]
        for name, message in errors.items():
            assert message is not None, f"{name} served a grid although two engines exist"
            assert "2 engines with different layouts" in message
            assert "MeshSpec(dp=2, tp=2;" in message and "MeshSpec(tp=2, dp=2;" in message
            assert "compat.use_engine(engine)" in message
        assert errors["get_tensor_model_parallel_group"].startswith(
            "deepspeed.utils.groups.get_tensor_model_parallel_group()"
        )
        assert errors["mpu"].startswith("deepspeed.utils.groups.mpu.get_data_parallel_group")


def test_use_engine_chooses(runs):
    for res in runs:
        assert res["grid"]["use_a_tp"] == res["grid"]["a_tp"]
        assert res["grid"]["use_b_tp"] == res["grid"]["b_tp"]


def test_sub_world_engines_on_disjoint_halves_train_with_every_zero_stage(runs):
    """Ranks 0-1 and 2-3 each initialize only their own engines ("mesh": {"ranks": [...]})."""
    expected = {0: ("half_zero1", "half_zero3"), 2: ("half_zero2", "half_zero1")}
    optimizers = {
        "half_zero1": "DeepSpeedZeroOptimizer",
        "half_zero2": "DeepSpeedZeroOptimizer",
        "half_zero3": "DeepSpeedZeroOptimizer_Stage3",
    }
    for rank, res in enumerate(runs):
        half = [0, 1] if rank < 2 else [2, 3]
        for name in expected[half[0]]:
            report = res["halves"][name]
            assert report["mesh"] == f"MeshSpec(dp=2; ranks {half[0]}..{half[1]} of world 4)"
            assert report["dp_group"] == report["zero_group"] == half
            assert report["optimizer"] == optimizers[name]
            assert report["replicas_identical"], f"rank {rank} {name}: replicas differ within {half}"
            assert len(report["losses"]) == 3 and len(set(report["losses"])) == 3
        assert set(res["halves"]) == set(expected[half[0]]) | {"world_zero2"}  # no engine of the other half


def test_a_whole_world_engine_coexists_with_the_halves(runs):
    for res in runs:
        report = res["halves"]["world_zero2"]
        assert report["dp_group"] == report["zero_group"] == [0, 1, 2, 3]
        assert report["replicas_identical"] and report["optimizer"] == "DeepSpeedZeroOptimizer"


def test_sub_world_moe_engines_on_disjoint_halves(runs):
    for rank, res in enumerate(runs):
        half = [0, 1] if rank < 2 else [2, 3]
        moe = res["moe"]
        assert moe["mesh"] == f"MeshSpec(dp=2, ep=2; ranks {half[0]}..{half[1]} of world 4)"
        assert moe["ep_group"] == half and moe["dense_identical"]
        assert len(set(moe["losses"])) == 2


def test_a_non_member_entering_initialize_is_told_to_skip_it(monkeypatch):
    """Before any group is created (fake backend, rank 1 of 4; the engine's ranks are 2-3)."""
    import deepspeed
    import torch

    import compat
    from fakepg import fake_world
    from mesh_core import MeshSpecError

    monkeypatch.setenv("LOCAL_RANK", "1")
    with fake_world(1, 4, deepspeed_comm=True):
        compat.install()
        try:
            with pytest.raises(
                MeshSpecError,
                match=r"rank 1 is not one of the ranks of this engine's mesh "
                r"MeshSpec\(dp=2; ranks 2..3 of world 4\); only those ranks",
            ):
                deepspeed.initialize(
                    model=torch.nn.Linear(2, 2), config={"train_micro_batch_size_per_gpu": 1, "mesh": {"ranks": [2, 3]}}
                )
        finally:
            compat.uninstall()
