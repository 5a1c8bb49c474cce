"""compat.mpu: MeshMPU against the mesh and DeepSpeed 0.19.8's grid; mesh_from_mpu (fake backend)."""

from __future__ import annotations

import contextlib
import io

import pytest
import torch.distributed as dist
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from megatron_mpu import MegatronMPU

import compat.groups as cgroups
from compat import topology as ctopology
from compat.mpu import MeshMPU, mesh_from_mpu
from fakepg import fake_world, record_new_groups
from mesh_core import DeepSpeedDeviceMesh, MeshLayout, MeshSpec, MeshSpecError

pytestmark = [
    pytest.mark.deepspeed,
    pytest.mark.filterwarnings("ignore::compat.deprecation.LegacyAPIDeprecationWarning"),
    pytest.mark.torch_releases,
]

# what DeepSpeed 0.19.8's engine, ZeRO, pipe engine, checkpointing, MoE and bwc helpers call or probe
ENGINE_MPU_METHODS = [
    "get_model_parallel_group",
    "get_model_parallel_rank",
    "get_model_parallel_world_size",
    "get_tensor_model_parallel_group",
    "get_tensor_model_parallel_world_size",
    "get_tensor_model_parallel_rank",
    "get_tensor_model_parallel_src_rank",
    "get_data_parallel_group",
    "get_data_parallel_world_size",
    "get_data_parallel_rank",
    "get_data_parallel_group_ranks",
    "get_pipe_parallel_group",
    "get_pipe_parallel_world_size",
    "get_pipe_parallel_rank",
    "get_pipeline_model_parallel_world_size",
    "get_pipeline_model_parallel_rank",
    "get_pipeline_model_parallel_group",
    "get_slice_parallel_world_size",
    "get_slice_parallel_rank",
    "get_slice_parallel_group",
    "get_sequence_parallel_world_size",
    "get_sequence_parallel_group",
    "get_sequence_parallel_rank",
    "get_sequence_data_parallel_group",
    "get_sequence_data_parallel_world_size",
    "get_sequence_data_parallel_rank",
]
# MeshMPU method -> the mesh dims it serves
DIMS = {
    "data_parallel": "dp",
    "model_parallel": ("pp", "tp"),
    "tensor_model_parallel": "tp",
    "slice_parallel": "tp",
    "pipe_parallel": "pp",
    "pipeline_model_parallel": "pp",
    "sequence_parallel": "sp",
    "sequence_data_parallel": ("dp", "sp"),
}


def ranks_of(group):
    return sorted(dist.get_process_group_ranks(group))


@st.composite
def meshes(draw, max_ranks=1024):
    sizes = {d: draw(st.sampled_from([1, 2, 3, 4])) for d in ("pp", "sp", "tp")}
    sizes["dp"] = draw(st.sampled_from([1, 2, 4, 8, 16]))
    while sizes["dp"] > 1 and sizes["pp"] * sizes["sp"] * sizes["tp"] * sizes["dp"] > max_ranks:
        sizes["dp"] //= 2
    world = sizes["pp"] * sizes["sp"] * sizes["tp"] * sizes["dp"]
    return sizes, draw(st.integers(0, world - 1))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(meshes())
def test_mesh_mpu_serves_every_engine_method_from_the_mesh(case):
    sizes, rank = case
    world = sizes["pp"] * sizes["sp"] * sizes["tp"] * sizes["dp"]
    with fake_world(rank, world):
        mesh = DeepSpeedDeviceMesh(MeshSpec.build(world, **sizes))
        mpu = MeshMPU(mesh)
        for name in ENGINE_MPU_METHODS:
            assert callable(getattr(mpu, name)), name
        assert not hasattr(mpu, "initialize_sequence_parallel")
        for kind, dims in DIMS.items():
            group = getattr(mpu, f"get_{kind}_group")()
            assert ranks_of(group) == sorted(mesh.get_group_ranks(dims))
            assert getattr(mpu, f"get_{kind}_world_size")() == mesh.size(dims) == dist.get_world_size(group)
            assert getattr(mpu, f"get_{kind}_rank")() == mesh.get_local_rank(dims) == dist.get_rank(group)
        assert mpu.get_data_parallel_group_ranks() == mesh.get_group_ranks("dp")
        assert mpu.get_tensor_model_parallel_src_rank() == min(mesh.get_group_ranks("tp"))
        assert mpu.get_model_parallel_world_size() == sizes["pp"] * sizes["tp"]


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from([1, 2, 4]), st.sampled_from([1, 2, 4]), st.sampled_from([1, 2, 8, 64]), st.data())
def test_mesh_mpu_answers_like_deepspeeds_grid(pp, tp, dp, data):
    """Every mpu method the 0.19.8 grid has returns the grid's value (model parallel = pipe x model)."""
    from deepspeed.runtime.pipe import topology

    world = pp * tp * dp
    rank = data.draw(st.integers(0, world - 1))
    names = [n for n in ENGINE_MPU_METHODS if hasattr(topology.PipelineParallelGrid, n)]

    def view(mpu):
        return {n: (ranks_of(v) if n.endswith("_group") else v) for n in names for v in [getattr(mpu, n)()]}

    with fake_world(rank, world, deepspeed_comm=True), contextlib.redirect_stdout(io.StringIO()):
        theirs = view(
            topology.PipelineParallelGrid(topology.PipeModelDataParallelTopology(num_pp=pp, num_mp=tp, num_dp=dp))
        )
    with fake_world(rank, world):
        ours = view(MeshMPU(DeepSpeedDeviceMesh(MeshSpec.build(world, pp=pp, dp=dp, tp=tp))))
    assert len(names) > 15 and ours == theirs


def test_deepspeed_reads_a_mesh_mpu_correctly():
    """DeepSpeed's own helpers (bwc probes, groups getters, checkpoint info) on a MeshMPU."""
    from deepspeed.runtime.model_checkpointing.utils import _create_model_parallel_info
    from deepspeed.utils import bwc
    from deepspeed.utils import groups as legacy_groups

    with fake_world(13, 16, deepspeed_comm=True):
        mesh = DeepSpeedDeviceMesh(MeshSpec.build(16, pp=2, dp=2, sp=2, tp=2), flatten=[("dp", "sp")])
        mpu = MeshMPU(mesh)
        assert bwc.bwc_tensor_model_parallel_group(mpu) is mesh.get_group("tp")
        assert bwc.bwc_tensor_model_parallel_rank(mpu) == mesh.get_local_rank("tp") == 1
        assert bwc.bwc_pipeline_parallel_group(mpu) is mesh.get_group("pp")
        assert bwc.bwc_pipeline_parallel_world_size(mpu) == 2
        legacy_groups.mpu = mpu
        assert legacy_groups._get_data_parallel_group() is mesh.get_group("dp")
        assert legacy_groups._get_sequence_data_parallel_group() is mesh.get_group(("dp", "sp"))
        assert legacy_groups._get_sequence_parallel_world_size() == 2
        assert legacy_groups._get_model_parallel_world_size() == 4
        assert legacy_groups._get_broadcast_src_rank() == min(mesh.get_group_ranks(("dp", "sp")))
        info = _create_model_parallel_info(mpu)  # crashed with the 0.19.8 grid and the groups mpu
        assert (info.pp_rank, info.tp_rank, info.dp_peer_ranks) == (1, 1, mesh.get_group_ranks("dp"))


def test_mesh_mpu_rejects_non_meshes():
    with pytest.raises(TypeError, match="DeepSpeedDeviceMesh"):
        MeshMPU(object())  # type: ignore[arg-type]


# --- mpu -> mesh -------------------------------------------------------------------------------
def megatron_style_mpu(pp, dp, tp, *, tp_lists=None):
    """A user's mpu built from explicit rank lists (order pp, dp, tp, like Megatron-LM): its dp, tp
    and pp group getters."""
    layout = MeshLayout(MeshSpec.build(dist.get_world_size(), pp=pp, dp=dp, tp=tp))
    return MegatronMPU.of_rank_lists(
        {"dp": layout.groups("dp"), "tp": tp_lists or layout.groups("tp"), "pp": layout.groups("pp")}
    )


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from([1, 2, 3]), st.sampled_from([1, 2, 4, 16]), st.sampled_from([1, 2, 4]), st.data())
def test_mesh_from_megatron_style_mpu_adopts_its_groups(pp, dp, tp, data):
    world = pp * dp * tp
    rank = data.draw(st.integers(0, world - 1))
    with fake_world(rank, world):
        user = megatron_style_mpu(pp, dp, tp)
        with record_new_groups() as calls:
            mesh = mesh_from_mpu(user)
        assert (mesh.size("pp"), mesh.size("dp"), mesh.size("tp")) == (pp, dp, tp)
        assert calls == []  # the mpu's communicators are adopted, none created
        for dim in ("dp", "tp", "pp"):
            assert mesh.get_group(dim) is user.groups[dim] or mesh.size(dim) == 1
            assert sorted(mesh.get_group_ranks(dim)) == ranks_of(user.groups[dim])


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from([1, 2, 4]), st.sampled_from([1, 2]), st.sampled_from([1, 2, 8]), st.booleans(), st.data())
def test_mesh_from_grids_and_mesh_mpu_round_trip(pp, tp, dp, legacy, data):
    """From DeepSpeed's own grid, compat's grid and a MeshMPU: the same layout, no new groups."""
    world = pp * tp * dp
    rank = data.draw(st.integers(0, world - 1))
    if legacy:
        from deepspeed.runtime.pipe import topology

        with fake_world(rank, world, deepspeed_comm=True), contextlib.redirect_stdout(io.StringIO()):
            grid = topology.PipelineParallelGrid(
                topology.PipeModelDataParallelTopology(num_pp=pp, num_mp=tp, num_dp=dp)
            )
            with record_new_groups() as calls:
                mesh = mesh_from_mpu(grid)
            assert calls == []
            assert mesh.get_group_ranks("dp") == grid.dp_group and mesh.get_group_ranks("pp") == grid.pp_group
            assert sorted(mesh.get_group_ranks("tp")) == grid.slice_group
        return
    with fake_world(rank, world):
        try:
            grid = ctopology.PipelineParallelGrid(
                ctopology.PipeModelDataParallelTopology(num_pp=pp, num_mp=tp, num_dp=dp)
            )
            with record_new_groups() as calls:
                mesh = mesh_from_mpu(grid)
            mesh_mpu = MeshMPU(mesh)  # collective: resolves (creates) its size-1 groups too
            with record_new_groups() as more_calls:
                again = mesh_from_mpu(mesh_mpu)
            assert calls == more_calls == []
            for dim in ("pp", "dp", "sp", "tp"):
                assert mesh.size(dim) == grid.mesh.size(dim) == again.size(dim)
                assert mesh.get_group_ranks(dim) == grid.mesh.get_group_ranks(dim) == again.get_group_ranks(dim)
            assert mesh.get_group("dp") is grid.get_data_parallel_group()
        finally:
            cgroups._release_process_group_references()


def test_mesh_from_mpu_errors_are_clear():
    with fake_world(1, 4, deepspeed_comm=True):
        # tp groups [0, 3] / [1, 2] with dp groups [0, 1] / [2, 3]: not the groups of any row-major mesh
        bad = megatron_style_mpu(1, 2, 2, tp_lists=[[0, 3], [1, 2]])
        with pytest.raises(MeshSpecError, match="not evenly strided|not a row-major mesh"):
            mesh_from_mpu(bad)
        from deepspeed.runtime.sequence_parallel import parallel_state_sp

        with pytest.raises(MeshSpecError, match="Ulysses"):
            mesh_from_mpu(parallel_state_sp)
        with pytest.raises(MeshSpecError, match="not a Megatron-style mpu"):
            mesh_from_mpu(object())

        overlapping = megatron_style_mpu(1, 2, 2)
        overlapping.groups["dp"] = dist.GroupMember.WORLD  # dp claims the whole world while tp is 2: 4 * 2 != 4
        with pytest.raises(MeshSpecError, match="do not form a mesh"):
            mesh_from_mpu(overlapping)


def test_mesh_from_mesh_mpu_with_sequence_parallel():
    with fake_world(11, 16):
        mesh = DeepSpeedDeviceMesh(MeshSpec.build(16, pp=2, dp=2, sp=2, tp=2))
        mpu = MeshMPU(mesh)
        with record_new_groups() as calls:
            again = mesh_from_mpu(mpu)
        assert calls == []
        for dims in ("pp", "dp", "sp", "tp", ("dp", "sp"), ("pp", "tp")):
            assert again.get_group_ranks(dims) == mesh.get_group_ranks(dims)
        assert again.get_group("sp") is mesh.get_group("sp")


def test_mesh_mpu_and_bind_mesh_on_a_rank_outside_the_mesh():
    with fake_world(3, 4):
        try:
            sub = DeepSpeedDeviceMesh(MeshSpec.build(4, ranks=[0, 1], tp=2))
            with pytest.raises(MeshSpecError, match="not a member"):
                MeshMPU(sub)
            with pytest.raises(MeshSpecError, match="not a member"):
                cgroups.bind_mesh(sub)
            assert cgroups.bound_mesh() is None
        finally:
            cgroups._release_process_group_references()


def test_mesh_mpu_and_mesh_from_mpu_are_collective_safe():
    """Every rank issues the same group-creation calls, in the same order."""

    def calls_on(rank):
        with fake_world(rank, 12):
            user = megatron_style_mpu(3, 2, 2)  # the user's own (world-collective) groups
            with record_new_groups() as calls:
                mesh = mesh_from_mpu(user)
                MeshMPU(mesh)
            return [list(c) for c in calls]

    # member-only creation: any two ranks create the groups they share in the same order
    sequences = {rank: calls_on(rank) for rank in range(12)}
    for a in sequences:
        assert all(a in c for c in sequences[a])
        for b in sequences:
            both = [[c for c in sequences[r] if a in c and b in c] for r in (a, b)]
            assert both[0] == both[1], (a, b)
