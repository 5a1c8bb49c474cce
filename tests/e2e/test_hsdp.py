"""HSDP (dp_replicate x dp_shard) under ZeRO-1/2/3 (compat/hsdp.py): ZeRO partitions over the
mesh's dp_shard group, gradients are averaged across dp_replicate; 4-process gloo runs
(tests/e2e/hsdp.py) against dp-only ZeRO over the same 4 ranks, and checkpoint round trips.

The checkpoint round trips (stages 1-3), sp beside HSDP and gradient accumulation are a second
torchrun job, marked ``slow`` (1.5-4 minutes on 2 cores): ``pytest tests/e2e/test_hsdp.py -m slow``.
"""

import math
import os
import sys

import pytest
import torch

from mesh_core import MeshSpec, MeshSpecError

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "e2e"))
from runner import torchrun  # noqa: E402

STAGES = (1, 2, 3)
ORDERS = ("hsdp", "hsdp_shard_outer")
S, R = 2, 2


# --- the config check, pure ----------------------------------------------------------------------
def _zero(stage, **extra):
    return {"zero_optimization": {"stage": stage, **extra}}


@pytest.mark.parametrize("stage", STAGES)
def test_hsdp_config_passes_unchanged(stage):
    from compat.hsdp import hsdp_zero_config

    config = _zero(stage)
    assert hsdp_zero_config(config, MeshSpec.build(8, dp_replicate=2, dp_shard=4)) is config
    assert hsdp_zero_config(config, MeshSpec.build(8, dp_replicate=2, dp_shard=2, sp=2)) is config


@pytest.mark.parametrize("config", [{}, _zero(0), {"zero_optimization": False}])
def test_no_zero_or_no_replication_leaves_the_config_alone(config):
    from compat.hsdp import hsdp_zero_config

    assert hsdp_zero_config(config, MeshSpec.build(4, dp_replicate=2, dp_shard=2)) is config
    assert hsdp_zero_config(_zero(1), MeshSpec.build(4, dp_shard=4)) == _zero(1)  # replicate 1 = dp 4


def test_nothing_to_shard_raises_naming_the_flat_layout():
    from compat.hsdp import hsdp_zero_config

    with pytest.raises(MeshSpecError, match=r"dp_shard x sp = 1 leaves ZeRO nothing to shard.*\"dp\": 4"):
        hsdp_zero_config(_zero(3), MeshSpec.build(4, dp_replicate=4, dp_shard=1))
    with pytest.raises(MeshSpecError, match="stage=1"):
        hsdp_zero_config({"zero_optimization": True}, MeshSpec.build(4, dp_replicate=4, dp_shard=1))


def test_hpz_on_hsdp_raises():
    from compat.hsdp import hsdp_zero_config

    with pytest.raises(
        MeshSpecError,
        match=r"zero_hpz_partition_size=2 is not supported: HSDP already partitions "
        r"over dp_shard x sp = 2 ranks",
    ):
        hsdp_zero_config(_zero(3, zero_hpz_partition_size=2), MeshSpec.build(4, dp_replicate=2, dp_shard=2))


@pytest.mark.parametrize("stage", [1, 2])
def test_zero12_with_an_offloaded_optimizer_raises(stage):
    from compat.hsdp import hsdp_zero_config

    spec = MeshSpec.build(4, dp_replicate=2, dp_shard=2)
    with pytest.raises(MeshSpecError, match=rf"offload_optimizer.device='cpu' is not supported: ZeRO-{stage}"):
        hsdp_zero_config(_zero(stage, offload_optimizer={"device": "cpu"}), spec)
    config = _zero(3, offload_optimizer={"device": "cpu"})
    assert hsdp_zero_config(config, spec) is config
    assert hsdp_zero_config(_zero(stage, offload_optimizer={"device": "none"}), spec)


def test_hpz_advice_names_a_mesh_that_has_the_group():
    from compat import groups

    for entry in (groups._W_ZP_GROUP, groups._W_ZP_CREATE, groups._W_ZP_WS):
        text = entry.text.replace('"', "'")  # the advice table writes Python with either quote
        assert "dp_replicate" in text and "dp_shard" in text and "('dp_shard', 'sp')" in text


# --- 4 gloo ranks: training ----------------------------------------------------------------------
@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return torchrun("hsdp.py", str(tmp_path_factory.mktemp("hsdp")), "train", timeout=500)


def _replica(rank, runs, mode):
    """The rank holding the same partition in the other replica."""
    (other,) = set(runs[rank][f"z1_{mode}"]["mesh_dp_replicate"]) - {rank}
    return other


@pytest.mark.multiprocess
@pytest.mark.deepspeed
@pytest.mark.parametrize("mode", ORDERS)
@pytest.mark.parametrize("stage", STAGES)
def test_zero_partitions_over_the_mesh_dp_shard_group(runs, stage, mode):
    shards = {tuple(r[f"z{stage}_{mode}"]["mesh_dp_shard"]) for r in runs}
    assert shards == ({(0, 1), (2, 3)} if mode == "hsdp" else {(0, 2), (1, 3)})
    for rank, res in enumerate(runs):
        got, dp = res[f"z{stage}_{mode}"], res[f"z{stage}_dp"]
        assert got["zero_groups"] == [tuple(got["mesh_dp_shard"])], "every ZeRO group is the mesh's dp_shard group"
        assert got["optimizer_dp_group"] == got["mesh_dp_shard"]
        assert dp["zero_groups"] == [(0, 1, 2, 3)]
        flat = got["flat_numel"]
        if stage == 3:  # each parameter split over S ranks, DeepSpeed's ceil(numel / S) per rank
            assert got["param_numel"] == [math.ceil(p.numel() / S) for p in got["params"]]
            assert dp["param_numel"] == [math.ceil(p.numel() / (R * S)) for p in dp["params"]]
            assert sum(got["param_numel"]) == got["optimizer_numel"]
        # optimizer states (fp32 master + Adam moments): 1/S of the flat parameter count (+ alignment)
        assert flat / S <= got["optimizer_numel"] < flat / S + S
        assert sum(m.numel() for m in got["moments"]) == 2 * sum(t.numel() for t in got["fp32"])
        assert got["save_zero_checkpoint"] == (got["mesh_dp_replicate"].index(rank) == 0)
        assert got["hooked"] == (["partition_grads"] if stage == 3 else ["step"]) and dp["hooked"] == []


@pytest.mark.multiprocess
@pytest.mark.deepspeed
@pytest.mark.parametrize("mode", ORDERS)
@pytest.mark.parametrize("stage", STAGES)
def test_hsdp_matches_dp_only_zero(runs, stage, mode):
    for res in runs:
        got, dp = res[f"z{stage}_{mode}"], res[f"z{stage}_dp"]
        torch.testing.assert_close(torch.tensor(got["losses"]), torch.tensor(dp["losses"]), rtol=1e-5, atol=1e-7)
        for a, b in zip(got["params"], dp["params"]):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
        assert got["losses"][-1] != got["losses"][0]  # it trained
        # the last step's gradient norm (taken after the cross-replica average) is dp-only's, and clips
        assert got["grad_norm"] == pytest.approx(dp["grad_norm"], rel=1e-5) and got["grad_norm"] > 0.05


@pytest.mark.multiprocess
@pytest.mark.deepspeed
@pytest.mark.parametrize("mode", ORDERS)
@pytest.mark.parametrize("stage", STAGES)
def test_replicas_are_bit_identical(runs, stage, mode):
    for rank, res in enumerate(runs):
        got = res[f"z{stage}_{mode}"]
        twin = runs[_replica(rank, runs, mode)][f"z{stage}_{mode}"]
        for key in ("fp32", "moments") + (("param_partition",) if stage == 3 else ()):
            assert all(torch.equal(a, b) for a, b in zip(got[key], twin[key])), f"{key} differs from the replica"
        other_shard = [r for r in got["mesh_dp_shard"] if r != rank][0]
        assert not torch.equal(got["fp32"][0][:8], runs[other_shard][f"z{stage}_{mode}"]["fp32"][0][:8])  # a real split
        assert all(torch.equal(a, b) for a, b in zip(got["params"], twin["params"]))


# --- checkpoints ---------------------------------------------------------------------------------
def _check_checkpoints(runs, stage):
    files = (
        {"hsdp": 2 * S, "outer": 2 * S, "dp": 2 * S * R}
        if stage == 3
        else {"hsdp": S + 1, "outer": S + 1, "dp": S * R + 1}
    )
    for res in runs:
        ckpt = res[f"ckpt_z{stage}"]
        for name, count in files.items():  # ZeRO-3: a model + an optim file per partition; 1/2: one model file
            assert len(ckpt[f"{name}_files"]) == count, ckpt[f"{name}_files"]
            assert sum("optim_states" in f for f in ckpt[f"{name}_files"]) == (S if name != "dp" else S * R)
        assert all(torch.equal(a, b) for a, b in zip(ckpt["hsdp_saved"], ckpt["hsdp_16bit"])), "save_16bit_model"
        for trip in ("hsdp_to_hsdp", "hsdp_to_dp", "dp_to_hsdp", "outer_to_hsdp"):
            src = trip.split("_to_")[0]
            assert all(torch.equal(a, b) for a, b in zip(ckpt[f"{src}_saved"], ckpt[trip])), f"{trip}: weights"
            assert ckpt[f"{trip}_next"] == ckpt[f"{src}_next"], f"{trip}: the next step (optimizer states)"


@pytest.fixture(scope="module")
def slow_runs(tmp_path_factory):
    return torchrun("hsdp.py", str(tmp_path_factory.mktemp("hsdp_slow")), "ckpt1,ckpt2,ckpt3,sp,gas", timeout=900)


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.deepspeed
@pytest.mark.parametrize("stage", STAGES)
def test_checkpoint_round_trips_hsdp_and_dp_only_bit_for_bit(slow_runs, stage):
    _check_checkpoints(slow_runs, stage)


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.deepspeed
@pytest.mark.parametrize("stage", STAGES)
def test_sp_beside_hsdp_partitions_over_dp_shard_x_sp_and_matches_dp_only(slow_runs, stage):
    # {"dp_replicate": 2, "sp": 2}: ZeRO's group is (dp_shard, sp) = the sp pairs [0,1] [2,3]
    for res in slow_runs:
        got, dp = res[f"z{stage}_sp_hsdp"], res[f"z{stage}_sp_dp"]
        assert got["zero_groups"] == [tuple(got["mesh_dp_shard"])] and len(got["mesh_dp_shard"]) == 2
        assert dp["zero_groups"] == [(0, 1, 2, 3)]
        assert got["flat_numel"] / 2 <= got["optimizer_numel"] < got["flat_numel"] / 2 + 2
        torch.testing.assert_close(torch.tensor(got["losses"]), torch.tensor(dp["losses"]), rtol=1e-5, atol=1e-7)
        for a, b in zip(got["params"], dp["params"]):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.deepspeed
@pytest.mark.parametrize("stage", STAGES)
def test_hsdp_with_gradient_accumulation_matches_dp_only(slow_runs, stage):
    for rank, res in enumerate(slow_runs):
        got, dp = res[f"z{stage}_gas_hsdp"], res[f"z{stage}_gas_dp"]
        torch.testing.assert_close(torch.tensor(got["losses"]), torch.tensor(dp["losses"]), rtol=1e-5, atol=1e-7)
        for a, b in zip(got["params"], dp["params"]):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
        twin = slow_runs[(rank + 2) % 4][f"z{stage}_gas_hsdp"]  # dp_replicate outer: replicas r, r + 2
        assert all(torch.equal(a, b) for a, b in zip(got["fp32"], twin["fp32"]))


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


# --- the engine's ZeRO groups on 8-rank HSDP meshes, R=2 x S=4 and a sub-world (fake backend: one process plays a rank)
class _Engine:
    """What configure_zero_optimizer_wrapper reads of a DeepSpeedEngine."""

    def __init__(self, stage, moe=False):
        self.seq_data_parallel_group = "the engine's dp group"
        self.has_moe_layers = moe
        self._stage = stage

    def zero_optimization_stage(self):
        return self._stage


@pytest.mark.parametrize(
    "sizes,shard,replicate",
    [
        ({"dp_replicate": 2, "dp_shard": 4}, [4, 5, 6, 7], [1, 5]),
        ({"dp_replicate": 2, "dp_shard": 4, "order": ["dp_shard", "dp_replicate"]}, [1, 3, 5, 7], [4, 5]),
        ({"dp_replicate": 2, "dp_shard": 2, "ranks": range(4, 8)}, [4, 5], [5, 7]),  # a sub-world engine
    ],
)
def test_zero_groups_of_an_hsdp_engine_of_8_ranks(sizes, shard, replicate):
    import torch.distributed as dist

    from compat import hsdp
    from fakepg import fake_world
    from mesh_core import DeepSpeedDeviceMesh, use_mesh

    with fake_world(5, 8):
        mesh = DeepSpeedDeviceMesh.build(**sizes)
        engine, seen = _Engine(stage=2), {}

        class Optimizer:
            pass

        def configure(*_):
            seen["dp_process_group"] = dist.get_process_group_ranks(engine.seq_data_parallel_group)
            return Optimizer()

        with use_mesh(mesh):
            optimizer = hsdp.configure_zero_optimizer_wrapper(configure, engine, (), {})
        assert sorted(seen["dp_process_group"]) == shard == mesh.get_group_ranks("dp_shard")
        assert engine.seq_data_parallel_group == "the engine's dp group"  # restored after
        groups = hsdp.groups_of(optimizer)
        assert sorted(dist.get_process_group_ranks(groups.replicate)) == replicate
        assert (groups.replicate_size, groups.replicate_rank) == (2, replicate.index(5))
        assert hsdp.groups_of(Optimizer()) is None  # another optimizer is not HSDP's


def test_zero_init_under_an_hsdp_mesh_partitions_over_dp_shard():
    import torch.distributed as dist

    from compat import hsdp
    from fakepg import fake_world
    from mesh_core import DeepSpeedDeviceMesh, use_mesh

    def init(module=None, data_parallel_group=None, sequence_data_parallel_group=None, mpu=None):
        return data_parallel_group

    with fake_world(5, 8):
        mesh = DeepSpeedDeviceMesh.build(dp_replicate=2, dp_shard=4)
        with use_mesh(mesh):
            assert sorted(dist.get_process_group_ranks(hsdp.zero_init_wrapper(init, None, (), {}))) == [4, 5, 6, 7]
            given = mesh.get_group("dp")
            assert hsdp.zero_init_wrapper(init, None, (), {"data_parallel_group": given}) is given  # named: kept
        flat = DeepSpeedDeviceMesh.build(dp=8)
        with use_mesh(flat):
            assert hsdp.zero_init_wrapper(init, None, (), {}) is None  # DeepSpeed's default: the world


def test_hsdp_engine_with_moe_layers_raises():
    from compat import hsdp
    from fakepg import fake_world
    from mesh_core import DeepSpeedDeviceMesh, use_mesh

    with fake_world(0, 4):
        mesh = DeepSpeedDeviceMesh.build(dp_replicate=2, dp_shard=2)
        called = []
        with use_mesh(mesh), pytest.raises(MeshSpecError, match=r"with MoE layers is not supported.*\"dp\": 4"):
            hsdp.configure_zero_optimizer_wrapper(lambda: called.append(1), _Engine(stage=3, moe=True), (), {})
        assert not called
