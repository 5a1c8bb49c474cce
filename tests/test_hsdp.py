"""HSDP (dp_replicate x dp_shard) under ZeRO: ZeRO-3 uses hpZ over the mesh's dp_shard groups,
ZeRO-1/2 raise; 4-process gloo run (tests/e2e/hsdp.py) against dp-only ZeRO-3 and legacy hpZ."""
import math
import os
import sys

import pytest
import torch

from mesh_core import MeshSpec, MeshSpecError

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "e2e"))
from runner import torchrun  # noqa: E402


# --- the config translation, pure ------------------------------------------------------------------
def _zero(stage, **extra):
    return {"zero_optimization": {"stage": stage, **extra}}


def test_zero3_on_hsdp_gets_hpz_of_the_shard_size():
    from compat.initialize import hsdp_zero_config

    spec = MeshSpec.build(8, dp_replicate=2, dp_shard=4)
    out = hsdp_zero_config(_zero(3), spec)
    assert out["zero_optimization"] == {"stage": 3, "zero_hpz_partition_size": 4}
    assert hsdp_zero_config(_zero(3, zero_hpz_partition_size=4), spec)["zero_optimization"]["zero_hpz_partition_size"] == 4
    sp_spec = MeshSpec.build(8, dp_replicate=2, dp_shard=2, sp=2)  # sp folds into the hpZ group
    assert hsdp_zero_config(_zero(3), sp_spec)["zero_optimization"]["zero_hpz_partition_size"] == 4


@pytest.mark.parametrize("config", [{}, _zero(0), {"zero_optimization": False}])
def test_no_zero_or_no_replication_leaves_the_config_alone(config):
    from compat.initialize import hsdp_zero_config

    assert hsdp_zero_config(config, MeshSpec.build(4, dp_replicate=2, dp_shard=2)) is config
    assert hsdp_zero_config(_zero(1), MeshSpec.build(4, dp_shard=4)) == _zero(1)  # replicate 1 = dp 4


@pytest.mark.parametrize("stage", [1, 2])
def test_zero12_on_hsdp_raise_naming_what_is_missing(stage):
    from compat.initialize import hsdp_zero_config

    with pytest.raises(MeshSpecError, match=rf"stage={stage} is not supported: ZeRO stage {stage} partitions over "
                                            r"the whole data-parallel group.*\"dp\": 4"):
        hsdp_zero_config(_zero(stage), MeshSpec.build(4, dp_replicate=2, dp_shard=2))
    with pytest.raises(MeshSpecError, match="stage=1"):
        hsdp_zero_config({"zero_optimization": True}, MeshSpec.build(4, dp_replicate=2, dp_shard=2))


def test_zero3_bad_hpz_or_nothing_to_shard_raise():
    from compat.initialize import hsdp_zero_config

    with pytest.raises(MeshSpecError, match=r"zero_hpz_partition_size=4 does not match .*set it to 2"):
        hsdp_zero_config(_zero(3, zero_hpz_partition_size=4), MeshSpec.build(4, dp_replicate=2, dp_shard=2))
    with pytest.raises(MeshSpecError, match="dp_shard x sp = 1 leaves ZeRO-3 nothing to shard"):
        hsdp_zero_config(_zero(3), MeshSpec.build(4, dp_replicate=4, dp_shard=1))


def test_hpz_advice_names_a_mesh_that_has_the_group():
    from compat import groups

    for entry in (groups._W_ZP_GROUP, groups._W_ZP_CREATE, groups._W_ZP_WS):
        assert "dp_replicate" in entry.text and "dp_shard" in entry.text and "('dp_shard', 'sp')" in entry.text


# --- 4 gloo ranks ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return torchrun("hsdp.py", str(tmp_path_factory.mktemp("hsdp")), timeout=400)


@pytest.mark.multiprocess
@pytest.mark.deepspeed
@pytest.mark.parametrize("mode", ["hsdp", "hsdp_shard_outer"])
def test_zero3_uses_the_mesh_groups_and_matches_dp_only(runs, mode):
    for rank, res in enumerate(runs):
        got, dp = res[mode], res["dp"]
        assert got["hpz_group"] == got["mesh_dp_shard"], "hpZ must gather within the mesh's dp_shard group"
        assert got["zero_group"] == got["optimizer_dp_group"] == got["mesh_dp"] == [0, 1, 2, 3]
        assert set(got["mesh_dp_shard"]) & set(got["mesh_dp_replicate"]) == {rank}  # two crossing dims
        assert got["hpz_size"] == 2 and dp["hpz_size"] == 1
        assert got["primary"] == dp["primary"] == [math.ceil(n / 4) for n in dp["numel"]]
        # the secondary partition holds dp / dp_shard = 2 primary partitions: 1/2 of each parameter
        assert got["secondary"] == [2 * math.ceil(n / 4) for n in dp["numel"]]
        assert got["optimizer_partition"] == dp["optimizer_partition"]
        torch.testing.assert_close(torch.tensor(got["losses"]), torch.tensor(dp["losses"]), rtol=1e-6, atol=1e-7)
        for a, b in zip(got["params"], dp["params"]):
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
    shard = {tuple(r[mode]["mesh_dp_shard"]) for r in runs}
    assert shard == ({(0, 1), (2, 3)} if mode == "hsdp" else {(0, 2), (1, 3)})


@pytest.mark.multiprocess
@pytest.mark.deepspeed
def test_row_major_hsdp_matches_legacy_hpz(runs):
    for res in runs:
        assert res["hsdp"]["hpz_group"] == res["legacy_hpz"]["hpz_group"]
        assert res["hsdp"]["secondary"] == res["legacy_hpz"]["secondary"]
        assert res["hsdp"]["losses"] == res["legacy_hpz"]["losses"]


@pytest.mark.multiprocess
@pytest.mark.deepspeed
@pytest.mark.parametrize("stage", [1, 2])
def test_zero12_on_hsdp_raise_in_initialize(runs, stage):
    for res in runs:
        assert res[f"zero{stage}"].startswith("MeshSpecError: MeshSpec(dp_replicate=2, dp_shard=2;")


# --- hpZ groups of a bound mesh (fake backend: one process plays a rank) --------------------------
@pytest.mark.parametrize(
    "sizes,hpz,rank,expected",
    [
        ({"dp": 8}, 4, 5, [4, 5, 6, 7]),  # a dp-only world mesh: DeepSpeed's world blocks
        ({"dp": 4, "tp": 2}, 2, 5, [5, 7]),  # inside the ZeRO group [1,3,5,7], not the world block [4,5]
        ({"dp_replicate": 2, "dp_shard": 4}, 4, 5, [4, 5, 6, 7]),
        ({"dp_replicate": 2, "dp_shard": 4, "order": ["dp_shard", "dp_replicate"]}, 4, 5, [1, 3, 5, 7]),
    ],
)
def test_hpz_groups_of_a_bound_mesh(sizes, hpz, rank, expected):
    import torch.distributed as dist

    from compat import groups
    from fakepg import fake_world
    from mesh_core import DeepSpeedDeviceMesh

    with fake_world(rank, 8):
        mesh = DeepSpeedDeviceMesh.build(**sizes)
        groups.bind_mesh(mesh)
        try:
            assert groups._get_zero_param_intra_parallel_group() is None
            groups._create_zero_param_parallel_group(hpz)
            assert sorted(dist.get_process_group_ranks(groups._get_zero_param_intra_parallel_group())) == expected
            assert groups._get_zero_param_intra_parallel_group_world_size() == hpz
            built = groups._get_zero_param_intra_parallel_group()
        finally:
            groups.bind_mesh(None)
        # unbound, the legacy getters serve the world's domain: the same groups for a dp-only world
        # mesh (one hpZ group per world, as DeepSpeed's global), none yet for another layout's
        world_domain = sizes == {"dp": 8}
        assert groups._get_zero_param_intra_parallel_group() is (built if world_domain else None)


def test_hpz_size_must_match_the_hsdp_shard():
    from compat import groups
    from fakepg import fake_world
    from mesh_core import DeepSpeedDeviceMesh

    with fake_world(0, 4):
        mesh = DeepSpeedDeviceMesh.build(dp_replicate=2, dp_shard=2)
        with pytest.raises(MeshSpecError, match=r"zero_hpz_partition_size=4 does not match .* dp_shard x sp = 2"):
            groups.hpz_rank_lists(mesh, 4)
