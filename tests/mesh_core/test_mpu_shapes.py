"""``DeepSpeedDeviceMesh.from_mpu`` and the shim's layout for every mpu plain DeepSpeed accepts: the
groups an mpu leaves unstated (no pipe getters: DeepSpeed reads pipeline size 1) are the script's
own pipeline, inferred from the stated groups' strides; two unstated runs are an error saying what
to write (torch's fake backend: one process acting as any rank)."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from megatron_mpu import DEEPSPEED_TEST, MegatronMPU

from fakepg import fake_world, record_new_groups
from mesh_core import DeepSpeedDeviceMesh, MeshLayout, MeshSpec, MeshSpecError

pytestmark = [pytest.mark.deepspeed, pytest.mark.torch_releases]


def data_model_mpu(spec: MeshSpec, *, pipe: bool = False) -> MegatronMPU:
    """An mpu with only DeepSpeed's data- and model-parallel getters over ``spec``'s dp and tp (and,
    with ``pipe``, get_pipe_parallel_group / _world_size over pp); every dim's groups are created."""
    layout = MeshLayout(spec)
    families = {**DEEPSPEED_TEST, "pipe_parallel": "pp"} if pipe else DEEPSPEED_TEST
    getters = {family: ("group", "world_size", "rank") for family in DEEPSPEED_TEST}
    if pipe:
        getters["pipe_parallel"] = ("group", "world_size")
    return MegatronMPU.of_rank_lists(
        {dim: layout.groups(dim) for dim in ("dp", "tp", "pp")}, names=families, getters=getters
    )


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.sampled_from([2, 3, 4]),
    st.sampled_from([1, 2, 4]),
    st.sampled_from([2, 4]),
    st.sampled_from(list(itertools.permutations(("pp", "dp", "tp")))),
    st.booleans(),
    st.data(),
)
def test_from_mpu_infers_the_pipeline_an_mpu_leaves_unstated(pp, dp, tp, order, pipe, data):
    world = pp * dp * tp
    rank = data.draw(st.integers(0, world - 1))
    truth = MeshSpec.build(world, pp=pp, dp=dp, tp=tp, order=list(order))
    with fake_world(rank, world, deepspeed_comm=True):
        from deepspeed.utils import bwc

        mpu = data_model_mpu(truth, pipe=pipe)
        with record_new_groups() as calls:
            mesh = DeepSpeedDeviceMesh.from_mpu(mpu)
        # the mpu's communicators are adopted; only a pp group the mpu does not have is created
        assert calls == ([] if pipe else [MeshLayout(truth).group_ranks("pp", rank)])
        # what DeepSpeed reads from the mpu is what the mesh serves
        assert mesh.size("dp") == mpu.get_data_parallel_world_size()
        assert mesh.size("tp") == bwc.bwc_tensor_model_parallel_world_size(mpu)
        assert mesh.get_group("dp") is mpu.groups["dp"] and mesh.get_group("tp") is mpu.groups["tp"]
        assert bwc.bwc_pipeline_parallel_world_size(mpu) == (pp if pipe else 1)
        # and the ranks it does not state form the pipeline: the whole world is one mesh
        assert mesh.size("pp") == pp and mesh.spec.world_size == world
        for dim in ("pp", "dp", "tp"):
            assert mesh.get_group_ranks(dim) == MeshLayout(truth).group_ranks(dim, rank)


def test_the_shim_reads_the_unstated_pipeline_from_the_mpu():
    from compat.engine_spec import engine_spec, mpu_sizes

    with fake_world(5, 8):
        mpu = data_model_mpu(MeshSpec.build(8, pp=2, dp=2, tp=2))
        assert mpu_sizes(mpu) == {"pp": 2, "dp": 2, "tp": 2}
        spec = engine_spec({}, 8, mpu=mpu)
        assert (spec.dim_size("pp"), spec.dim_size("dp"), spec.dim_size("tp")) == (2, 2, 2)
        # the config's "mesh" section may state it too; a different pp is a disagreement naming both
        engine_spec({"mesh": {"pp": 2, "dp": 2, "tp": 2}}, 8, mpu=mpu)
        with pytest.raises(MeshSpecError, match="pp=4.*mpu=MegatronMPU sets pp=2"):
            engine_spec({"mesh": {"pp": 4}}, 16, mpu=mpu)


def test_two_unstated_runs_say_what_to_write():
    # order pp, dp, tp, sp: an mpu stating dp and tp leaves sp (innermost) and pp (outermost) unstated
    with fake_world(3, 16):
        truth = MeshSpec.build(16, pp=2, dp=2, tp=2, sp=2, order=["pp", "dp", "tp", "sp"])
        mpu = data_model_mpu(truth)
        with pytest.raises(MeshSpecError) as err:
            DeepSpeedDeviceMesh.from_mpu(mpu, check_agreement=False)
        text = str(err.value)
        assert "cover 4 of the world's 16 ranks" in text and "2 separate runs" in text
        assert "get_pipeline_model_parallel_group" in text and "DeepSpeedDeviceMesh.build(" in text
