"""A zero.Init-sharded ZeRO-3 model handed to engines on other ranks (2 gloo ranks, torchrun,
tests/e2e/zero3_sharded.py): a clear error on every rank that initialises the engine, before any
collective (every part ends with a world barrier: a stuck rank fails the run by its timeout), and
a working sub-world engine once the model is built under the engine's group. Run with DS_MESH_STRICT=1: strict
mode reports the same error (and the remedy creates no group outside mesh_core)."""

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "e2e"))
from runner import torchrun  # noqa: E402

pytestmark = [pytest.mark.multiprocess, pytest.mark.deepspeed]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    # "world" first: zero.Init numbers parameters per process, and "remedy" builds a model on rank 0 only
    return torchrun(
        "zero3_sharded.py",
        str(tmp_path_factory.mktemp("zero3")),
        "world,subworld,layout,remedy",
        timeout=300,
        world=2,
        env={"DS_MESH_STRICT": "1"},
    )  # strict mode reports it too


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
        assert (
            f"MeshSpec(dp=1, tp=2; ranks 0..1 of world 2), partitions rank {rank}'s parameters over ranks [{rank}]"
            in error
        )


def test_the_remedy_the_error_names_trains_a_sub_world_engine(runs):
    remedy = runs[0]["remedy"]
    assert remedy["param_ranks"] == [0] and remedy["mesh"] == "MeshSpec(dp=1; ranks 0..0 of world 2)"
    assert len(remedy["losses"]) == 2
    assert runs[1]["remedy"] == {}


def test_a_whole_world_engine_on_the_zero_init_model_still_trains(runs):
    for res in runs:
        assert len(res["world"]["losses"]) == 2
    assert runs[0]["world"]["losses"] == runs[1]["world"]["losses"]


# --- the check itself, on torch's fake backend (rank 1 of 4; parameters marked as zero.Init marks them) ---
@pytest.mark.parametrize(
    "param_ranks, mesh, refused",
    [
        ([0, 1, 2, 3], {}, None),  # zero.Init over the world, a world engine
        ([0, 1, 2, 3], {"ranks": [0, 1]}, "ranks [2, 3] hold parts of it and are not in the engine"),
        ([0, 1, 2, 3], {"tp": 2}, "partitions rank 1's parameters over ranks [1, 3]"),
        ([1, 3], {"tp": 2}, None),  # built under zero.Init(data_parallel_group=<the mesh's dp>)
        ([1, 3], {"dp": 2, "sp": 2}, None),  # the mpu's dp group (what the engine hands zero.Init) is accepted too
        ([0, 1], {"dp": 2, "sp": 2}, "over ranks [0, 1, 2, 3]"),
        (None, {"ranks": [0, 1]}, None),  # not partitioned yet: the engine partitions it itself
        ("autoep", {"ranks": [0, 1]}, None),  # a group of its own (AutoEP experts): DeepSpeed checks it
    ],
)
def test_partition_check_table(param_ranks, mesh, refused):
    import torch
    import torch.distributed as dist

    from compat.engine_zero3 import check_zero3_partitions
    from fakepg import fake_world
    from mesh_core import MeshSpecError
    from mesh_core.config import spec_from_config

    with fake_world(1, 4):
        net = torch.nn.Linear(2, 2)
        spec = spec_from_config({"mesh": mesh}, 4)
        for i, param in enumerate(net.parameters()):
            if param_ranks is not None:
                param.ds_id = i
                ranks = [0, 1, 2, 3] if param_ranks == "autoep" else param_ranks
                param.ds_process_group = dist.new_group(ranks) if ranks != [0, 1, 2, 3] else dist.group.WORLD
                if param_ranks == "autoep":
                    param.ds_zero_partition_process_group = param.ds_process_group
        if refused is None:
            check_zero3_partitions(net, spec, 1)
        else:
            with pytest.raises(MeshSpecError) as err:
                check_zero3_partitions(net, spec, 1)
            assert "ZeRO-3 parameter 'weight' (and 1 more) was partitioned by zero.Init" in str(err.value)
            assert refused in str(err.value) and spec.describe() in str(err.value)
