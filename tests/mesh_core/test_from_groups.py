"""``DeepSpeedDeviceMesh.from_mpu`` / ``from_groups`` and ``current_mesh`` on the fake backend."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from megatron_mpu import DEEPSPEED_TEST, MegatronMPU

from fakepg import fake_world
from mesh_core import DeepSpeedDeviceMesh, MeshSpec, MeshSpecError, current_mesh, use_mesh

pytestmark = pytest.mark.torch_releases


@settings(max_examples=20, deadline=None)
@given(
    sizes=st.sampled_from([(1, 8, 1), (2, 2, 2), (1, 4, 2), (2, 4, 1), (4, 1, 2), (2, 1, 4)]),
    order=st.sampled_from([("pp", "dp", "tp"), ("pp", "tp", "dp"), ("tp", "pp", "dp")]),
    rank=st.integers(0, 7),
)
def test_from_mpu_reproduces_the_mpus_groups(sizes, order, rank):
    pp, dp, tp = sizes
    with fake_world(rank, 8):
        source = DeepSpeedDeviceMesh(MeshSpec.build(8, order=list(order), pp=pp, dp=dp, tp=tp))
        mesh = DeepSpeedDeviceMesh.from_mpu(MegatronMPU.of_mesh(source))  # parallel_state's groups
        for dim in ("pp", "dp", "tp"):
            assert mesh.get_group_ranks(dim) == source.get_group_ranks(dim), dim
            assert mesh.size(dim) == source.size(dim)
        mesh.destroy()
        source.destroy()


def test_from_groups_takes_rank_lists_and_rejects_groups_that_are_not_a_mesh():
    with fake_world(5, 8):
        mesh = DeepSpeedDeviceMesh.from_groups(tp=[4, 5], dp=[1, 3, 5, 7])
        assert mesh.spec.dim_size("tp") == 2 and mesh.get_group_ranks("dp") == [1, 3, 5, 7]
        mesh.destroy()
        with pytest.raises(MeshSpecError, match="not evenly strided"):
            DeepSpeedDeviceMesh.from_groups(dp=[1, 5, 7])
        with pytest.raises(MeshSpecError, match="does not contain this rank"):
            DeepSpeedDeviceMesh.from_groups(tp=[0, 1])
        with pytest.raises(MeshSpecError, match="unknown dims"):
            DeepSpeedDeviceMesh.from_groups(xx=[5])


def test_from_mpu_rejects_an_object_that_is_not_an_mpu():
    with fake_world(0, 4):
        with pytest.raises(MeshSpecError, match="not a Megatron-style mpu"):
            DeepSpeedDeviceMesh.from_mpu(object())


def test_current_mesh_is_the_default_else_the_world_data_parallel_mesh():
    with fake_world(3, 8):
        world = current_mesh()
        assert world.spec.describe().startswith("MeshSpec(dp=8")
        assert world.get_group_ranks("dp") == list(range(8)) and world.size("sp") == 1
        assert world.expert_groups(2).ep_ranks == [2, 3]  # legacy E+D over the world
        assert current_mesh() is world
        tp = DeepSpeedDeviceMesh.build(tp=2)
        with use_mesh(tp):
            assert current_mesh() is tp
        assert current_mesh() is world
        tp.destroy()
    with pytest.raises(MeshSpecError, match="not initialised"):
        current_mesh()


def _model_parallel_only(mesh):
    """DeepSpeed's own test MPU (tests/unit/...): only the dp getters and get_model_parallel_* (group,
    world size)."""
    return MegatronMPU.of_mesh(
        mesh,
        ("dp", "tp"),
        names=DEEPSPEED_TEST,
        getters={"data_parallel": ["group"], "model_parallel": ["group", "world_size"]},
    )


@pytest.mark.parametrize("tp", [1, 2])
def test_from_mpu_reads_tp_from_the_model_parallel_getters_last(tp):
    """bwc order ends with get_model_parallel_*: without it the test MPU's dp=2 over 4 ranks raised."""
    with fake_world(1, 4):
        source = DeepSpeedDeviceMesh(MeshSpec.build(4, order=["dp", "tp"], dp=4 // tp, tp=tp))
        mesh = DeepSpeedDeviceMesh.from_mpu(_model_parallel_only(source))
        assert mesh.size("tp") == tp and mesh.get_group_ranks("dp") == source.get_group_ranks("dp")
        mesh.destroy()
        source.destroy()
