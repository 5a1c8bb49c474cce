"""The communicator-count formulas against the real DeepSpeed 0.19.8 and the real mesh (fake backend)."""

from __future__ import annotations

import contextlib
import io

import pytest

from fakepg import fake_world, record_new_groups
from mesh_core import DeepSpeedDeviceMesh, MeshSpec
from mesh_core.cli.legacy_counts import (
    expert_count,
    expert_tensor_count,
    grid_count,
    legacy_counts,
    mesh_count,
    sequence_count,
)

pytestmark = [pytest.mark.deepspeed, pytest.mark.torch_releases]


def _memberships(calls: list[list[int]], rank: int) -> int:
    return sum(1 for ranks in calls if rank in ranks)


def _grid(pp: int, mp: int, dp: int):
    from deepspeed.runtime.pipe.topology import PipelineParallelGrid, PipeModelDataParallelTopology

    with contextlib.redirect_stdout(io.StringIO()):  # rank 0 prints the whole topology
        return PipelineParallelGrid(topology=PipeModelDataParallelTopology(num_pp=pp, num_mp=mp, num_dp=dp))


@pytest.mark.parametrize("pp,mp,dp", [(2, 2, 2), (2, 1, 4), (1, 1, 4), (4, 2, 8), (1, 4, 4), (3, 1, 2)])
def test_grid_formula_matches_deepspeed(pp, mp, dp):
    world = pp * mp * dp
    rank = world - 1
    with fake_world(rank, world, deepspeed_comm=True), record_new_groups() as calls:
        _grid(pp, mp, dp)
    expected = grid_count(pp, mp, dp)
    assert len(calls) == expected.new_group_calls
    assert _memberships(calls, rank) == expected.per_rank


@pytest.mark.parametrize("world,ep,pp", [(16, 2, 1), (16, 4, 1), (16, 2, 2), (16, 4, 2), (64, 8, 4)])
def test_expert_formula_matches_deepspeed(world, ep, pp):
    with fake_world(1, world, deepspeed_comm=True), record_new_groups() as calls:
        from deepspeed.utils import groups

        with contextlib.redirect_stdout(io.StringIO()):
            groups._create_expert_and_data_parallel(ep, pp_size=pp)
    expected = expert_count(world, ep, pp)
    assert len(calls) == expected.new_group_calls
    assert _memberships(calls, 1) == expected.per_rank


@pytest.mark.parametrize("pp,mp,dp,ep", [(1, 2, 8, 2), (2, 2, 4, 4), (2, 4, 4, 2)])
def test_expert_tensor_formula_matches_deepspeed(pp, mp, dp, ep):
    world = pp * mp * dp
    with fake_world(world - 1, world, deepspeed_comm=True):
        from deepspeed.utils import groups

        grid = _grid(pp, mp, dp)
        groups.mpu = grid  # what the engine publishes; the expert-TP path reads dp size from it
        with record_new_groups() as calls, contextlib.redirect_stdout(io.StringIO()):
            groups._create_expert_data_and_model_parallel(ep, mpu=grid)
    expected = expert_tensor_count(world, ep, dp)
    assert len(calls) == expected.new_group_calls
    assert _memberships(calls, world - 1) == expected.per_rank


@pytest.mark.parametrize("world,sp", [(4, 2), (16, 4), (8, 8)])
def test_sequence_formula_matches_deepspeed(world, sp):
    with fake_world(0, world, deepspeed_comm=True), record_new_groups() as calls:
        from deepspeed.runtime.sequence_parallel import parallel_state_sp

        parallel_state_sp.initialize_sequence_parallel(sp)
        parallel_state_sp._release_sequence_parallel_groups()
    expected = sequence_count(world, sp)
    assert len(calls) == expected.new_group_calls
    assert _memberships(calls, 0) == expected.per_rank


def test_legacy_counts_composes_the_builders_a_layout_needs():
    spec = MeshSpec.build(32, pp=2, sp=2, tp=2, ep=2)
    builders = [c.builder for c in legacy_counts(spec)]
    assert builders[0].startswith("PipelineParallelGrid(pp=2, mp=2, dp=8)")  # dp x sp data ranks
    assert any("initialize_sequence_parallel(2)" in b for b in builders)
    assert any("_create_expert_data_and_model_parallel(2" in b for b in builders)
    assert [c.builder for c in legacy_counts(MeshSpec.build(8, ep=2))][1].startswith(
        "groups._create_expert_and_data_parallel(2"
    )


LAYOUTS = [
    dict(world_size=16, pp=2, tp=2, ep=2),
    dict(world_size=16, tp=16),
    dict(world_size=8, dp=8, ep=8),
    dict(world_size=16, dp_replicate=2, dp_shard=4, tp=2),
    dict(world_size=16, pp=2, sp=2, tp=2, ep=2, data_before_expert=True),
    dict(world_size=24, order=("tp", "dp", "pp"), pp=3, tp=2),
]


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda d: "-".join(f"{k}{v}" for k, v in d.items()))
@pytest.mark.parametrize("flatten,p2p", [((), False), ((("dp", "sp"),), True)])
def test_mesh_count_matches_the_real_mesh(layout, flatten, p2p):
    layout = dict(layout)
    world = layout.pop("world_size")
    spec = MeshSpec.build(world, **layout)
    for rank in (0, world - 1):
        with fake_world(rank, world), record_new_groups() as calls:
            mesh = DeepSpeedDeviceMesh(spec, flatten=flatten, p2p_groups=p2p)
            created = mesh.registry.created
        expected = mesh_count(spec, flatten=flatten, p2p_groups=p2p, rank=rank)
        # member-only creation: the rank creates exactly the groups it belongs to, nothing else
        assert all(rank in c for c in calls)
        assert len(calls) == created == expected.per_rank
