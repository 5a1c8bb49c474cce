"""compat.topology against the real deepspeed==0.19.8 topology and grid (fake process-group backend)."""

from __future__ import annotations

import contextlib
import io
import math

import numpy as np
import pytest
import torch.distributed as dist
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import compat.groups as cgroups
from compat import topology as ct
from compat.deprecation import LegacyAPIDeprecationWarning
from fakepg import fake_world, record_new_groups
from mesh_core import DeepSpeedDeviceMesh, MeshSpec, MeshSpecError

pytestmark = [
    pytest.mark.deepspeed,
    pytest.mark.filterwarnings("ignore::compat.deprecation.LegacyAPIDeprecationWarning"),
    pytest.mark.torch_releases,
]


def legacy_topology_module():
    from deepspeed.runtime.pipe import topology

    return topology


def ranks_of(group):
    return None if group is None else sorted(dist.get_process_group_ranks(group))


AXES = ["pipe", "data", "model", "x", "y"]


@st.composite
def topologies(draw, max_ranks: int = 512):
    axes = draw(st.lists(st.sampled_from(AXES), min_size=1, max_size=4, unique=True))
    dims = []
    for _ in axes:
        dims.append(draw(st.integers(1, 6)))
        if math.prod(dims) > max_ranks:
            dims[-1] = 1
    return axes, dims


def _outcome(fn, *args, **kwargs):
    """A call's value, or the exception type it raised (legacy errors are part of the contract)."""
    try:
        return ("ok", fn(*args, **kwargs))
    except Exception as err:  # noqa: BLE001 - the type is what is compared
        return ("raised", type(err))


@settings(max_examples=60, deadline=None)
@given(topologies(), st.data())
def test_process_topology_matches_deepspeed(axes_dims, data):
    axes, dims = axes_dims
    legacy = legacy_topology_module().ProcessTopology(list(axes), list(dims))
    ours = ct.ProcessTopology(list(axes), list(dims))
    n = math.prod(dims)
    assert ours.world_size() == legacy.world_size() == n
    assert ours.get_axis_names() == legacy.get_axis_names()
    assert ours.mapping == legacy.mapping
    assert str(ours) == str(legacy)
    for axis in AXES + ["nope"]:
        assert ours.get_dim(axis) == legacy.get_dim(axis)
        assert ours.get_axis_comm_lists(axis) == legacy.get_axis_comm_lists(axis)
        for idx in range(-1, 3):
            assert _outcome(ours.get_axis_list, axis, idx) == _outcome(legacy.get_axis_list, axis, idx)
    for rank in data.draw(st.lists(st.integers(-1, n), min_size=1, max_size=8)):
        assert _outcome(ours.get_coord, rank) == _outcome(legacy.get_coord, rank)
        if 0 <= rank < n:
            assert ours.get_coord(rank) == legacy.get_coord(rank)
            assert ours.get_rank(**ours.get_coord(rank)._asdict()) == rank
            omit = data.draw(st.lists(st.sampled_from(AXES), max_size=2))
            assert ours.get_rank_repr(rank, omit_axes=omit) == legacy.get_rank_repr(rank, omit_axes=omit)
            assert ours.get_rank_repr(rank) == legacy.get_rank_repr(rank)
    coord = {a: data.draw(st.integers(-1, d)) for a, d in zip(axes, dims)}
    assert _outcome(ours.get_rank, **coord) == _outcome(legacy.get_rank, **coord)
    partial = {a: coord[a] for a in axes[:-1]}
    assert _outcome(ours.get_rank, **partial) == _outcome(legacy.get_rank, **partial)
    assert _outcome(ours.get_rank, bogus=0, **partial) == _outcome(legacy.get_rank, bogus=0, **partial)
    filt = {a: data.draw(st.integers(0, d)) for a, d in zip(axes, dims) if data.draw(st.booleans())}
    assert ours.filter_match(**filt) == legacy.filter_match(**filt)
    assert _outcome(ours.filter_match, nope=0) == _outcome(legacy.filter_match, nope=0)


# values legacy accepts because its lookups go by ==/hash (1.0 == True == np.int64(1) == 1)
NON_INT_VALUES = [True, False, 1.0, 0.0, 1.5, np.int64(1), -1.0, "1", None]


@pytest.mark.parametrize("axes,dims", [(["pipe", "data"], [2, 3]), (["a", "b", "c"], [2, 1, 3]), (["x"], [4])])
def test_process_topology_matches_deepspeed_on_non_int_coordinates_and_bad_ranks(axes, dims):
    legacy = legacy_topology_module().ProcessTopology(list(axes), list(dims))
    ours = ct.ProcessTopology(list(axes), list(dims))
    n = math.prod(dims)
    for value in NON_INT_VALUES:
        assert _outcome(ours.get_coord, value) == _outcome(legacy.get_coord, value), value
        for axis in axes:
            assert _outcome(ours.filter_match, **{axis: value}) == _outcome(legacy.filter_match, **{axis: value})
            assert _outcome(ours.get_axis_list, axis, value) == _outcome(legacy.get_axis_list, axis, value)
        coord = {a: value for a in axes}
        assert _outcome(ours.get_rank, **coord) == _outcome(legacy.get_rank, **coord), value
    for rank in [-1, n, 1.0, True]:
        for omit in (axes, [], ["data", "pipe"]):
            assert _outcome(ours.get_rank_repr, rank, omit_axes=omit) == _outcome(
                legacy.get_rank_repr, rank, omit_axes=omit
            ), (rank, omit)


def test_specialised_topologies_and_prime_factors():
    legacy = legacy_topology_module()
    for pp, mp, dp in [(2, 2, 2), (3, 1, 4), (1, 4, 2)]:
        ours = ct.PipeModelDataParallelTopology(num_pp=pp, num_mp=mp, num_dp=dp)
        theirs = legacy.PipeModelDataParallelTopology(num_pp=pp, num_mp=mp, num_dp=dp)
        assert (ours.axes, ours.dims, ours.mapping) == (theirs.axes, theirs.dims, theirs.mapping)
        ours2 = ct.PipeDataParallelTopology(num_pp=pp, num_dp=dp)
        theirs2 = legacy.PipeDataParallelTopology(num_pp=pp, num_dp=dp)
        assert (ours2.axes, ours2.dims, ours2.mapping) == (theirs2.axes, theirs2.dims, theirs2.mapping)
    for n in [1, 2, 12, 97, 360, 1024, 4096 * 3]:
        assert ct._prime_factors(n) == legacy._prime_factors(n)
    with pytest.raises(ValueError):
        ct._prime_factors(0)


# --- PipelineParallelGrid ----------------------------------------------------------------------
GRID_METHODS = [
    "get_stage_id",
    "get_data_parallel_id",
    "get_global_rank",
    "get_pipe_parallel_rank",
    "get_pipeline_model_parallel_rank",
    "get_pipe_parallel_world_size",
    "get_pipeline_model_parallel_world_size",
    "get_data_parallel_rank",
    "get_data_parallel_world_size",
    "get_data_parallel_group_ranks",
    "get_model_parallel_rank",
    "get_model_parallel_world_size",
    "get_slice_parallel_rank",
    "get_tensor_model_parallel_rank",
    "get_slice_parallel_world_size",
    "get_tensor_model_parallel_world_size",
    "_is_grid_valid",
]
GRID_ATTRS = [
    "global_rank",
    "world_size",
    "data_parallel_size",
    "pipe_parallel_size",
    "model_parallel_size",
    "slice_parallel_size",
    "stage_id",
    "data_parallel_id",
    "ds_model_rank",
    "ds_model_world_size",
    "dp_groups",
    "dp_group",
    "is_first_stage",
    "is_last_stage",
    "p2p_groups",
    "pipe_groups",
    "pp_group",
    "slice_group",
    "model_groups",
    "mp_group",
]
GRID_GROUPS = [
    "get_pipe_parallel_group",
    "get_data_parallel_group",
    "get_model_parallel_group",
    "get_slice_parallel_group",
]


def grid_view(grid, rank_kwargs):
    view = {name: getattr(grid, name)() for name in GRID_METHODS}
    view.update({name: getattr(grid, name, "<absent>") for name in GRID_ATTRS})
    view.update({name: ranks_of(getattr(grid, name)()) for name in GRID_GROUPS})
    view["topology"] = (grid.topology().axes, grid.topology().dims)
    view["stage_to_global"] = [
        _outcome(grid.stage_to_global, s, **kw) for s in range(-1, grid.pipe_parallel_size + 1) for kw in rank_kwargs
    ]
    return view


def legacy_grid(rank, world, make_topology, rank_kwargs):
    with fake_world(rank, world, deepspeed_comm=True), contextlib.redirect_stdout(io.StringIO()):
        legacy = legacy_topology_module()
        with record_new_groups() as calls:
            grid = legacy.PipelineParallelGrid(topology=make_topology(legacy))
        return grid_view(grid, rank_kwargs), calls


def compat_grid(rank, world, make_topology, rank_kwargs, *, with_mesh=False):
    with fake_world(rank, world):
        try:
            with record_new_groups() as calls:
                mesh = None
                if with_mesh:
                    topo = make_topology(ct)
                    mesh = DeepSpeedDeviceMesh(ct.mesh_spec_for(topo, world))
                grid = ct.PipelineParallelGrid(topology=make_topology(ct), mesh=mesh)
            assert grid.mesh.spec.world_size == world
            return grid_view(grid, rank_kwargs), calls
        finally:
            cgroups._release_process_group_references()


@st.composite
def grid_cases(draw, max_ranks: int = 2048):
    pp = draw(st.sampled_from([1, 2, 3, 4, 8]))
    mp = draw(st.sampled_from([1, 2, 4]))
    dp = draw(st.integers(1, max(1, max_ranks // (pp * mp))).filter(lambda d: d <= 64 or d % 16 == 0))
    three_axes = draw(st.booleans()) or mp > 1
    world = pp * mp * dp
    rank = draw(st.integers(0, world - 1))
    return pp, mp, dp, three_axes, rank


def make_topology_factory(pp, mp, dp, three_axes):
    if three_axes:
        return lambda mod: mod.PipeModelDataParallelTopology(num_pp=pp, num_mp=mp, num_dp=dp)
    return lambda mod: mod.PipeDataParallelTopology(num_pp=pp, num_dp=dp)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(grid_cases(), st.booleans())
@example((4, 2, 256, True, 1234), False)  # W=2048
@example((2, 1, 1024, False, 2047), True)  # W=2048, mp=1: 2048 singleton slice groups
def test_grid_matches_deepspeed(case, with_mesh):
    pp, mp, dp, three_axes, rank = case
    world = pp * mp * dp
    factory = make_topology_factory(pp, mp, dp, three_axes)
    kwargs = [{}, {"data": 0}] + ([{"model": mp - 1}, {"data": dp - 1, "model": 0}] if three_axes else [])
    theirs, legacy_calls = legacy_grid(rank, world, factory, kwargs)
    ours, compat_calls = compat_grid(rank, world, factory, kwargs, with_mesh=with_mesh)
    assert ours == theirs
    # every rank set legacy created exists in compat (WORLD stands in for the whole world) ...
    full = tuple(range(world))
    legacy_sets = {tuple(c) for c in legacy_calls} - {full}
    compat_sets = {tuple(c) for c in compat_calls} - {full}
    # member-only creation: compat creates exactly the legacy sets this rank belongs to
    assert compat_sets == {s for s in legacy_sets if rank in s}
    # ... each created once
    assert len(compat_calls) == len({tuple(c) for c in compat_calls})
    assert len(compat_calls) <= len(legacy_calls)


def test_default_grid_and_worked_example():
    """W=8 pp=dp=mp=2 (legacy_api.md 1.5) and the default prime-factor topology."""
    for rank in (0, 5):
        factory = make_topology_factory(2, 2, 2, True)
        theirs, _ = legacy_grid(rank, 8, factory, [{}])
        ours, calls = compat_grid(rank, 8, factory, [{}])
        assert ours == theirs
        assert ours["p2p_groups"] == [[r, (r + 4) % 8] for r in range(8)]
        assert len(calls) == 4  # this rank's ds_model, dp, pp (= p2p pair) and slice groups
    for world in (1, 6, 12, 16):
        theirs, legacy_calls = legacy_grid(world - 1, world, lambda mod: None, [{}])
        ours, calls = compat_grid(world - 1, world, lambda mod: None, [{}])
        assert ours == theirs
        assert len(calls) < max(len(legacy_calls), 1) or world == 1


def test_grid_shares_duplicate_rank_sets():
    """pp=2, dp=4, mp=1: legacy creates the pipe groups twice (as ds_model groups) and every singleton."""
    factory = make_topology_factory(2, 1, 4, False)
    _, legacy_calls = legacy_grid(3, 8, factory, [{}])
    _, compat_calls = compat_grid(3, 8, factory, [{}])
    assert len(legacy_calls) == 4 + 2 + 4 + 8
    assert sum(1 for c in legacy_calls if 3 in c) == 4  # rank 3's dp, pp, ds_model (= pp) and slice
    assert compat_calls == [[3, 7], [0, 1, 2, 3], [3]]  # pp (= ds_model) once, dp, its own slice


def test_grid_on_a_given_mesh_reuses_its_groups():
    with fake_world(1, 8):
        try:
            mesh = DeepSpeedDeviceMesh(MeshSpec.build(8, pp=2, dp=2, tp=2))
            with record_new_groups() as calls:
                grid = ct.PipelineParallelGrid(mesh=mesh)
            assert grid.mesh is mesh
            assert calls == [[0, 1, 4, 5]]  # only this rank's ds_model (pp x tp) group is new
            assert grid.topology().axes == ["pipe", "data", "model"]
            assert grid.get_slice_parallel_group() is mesh.get_group("tp")
            assert grid.get_tensor_model_parallel_group() is mesh.get_group("tp")
            assert grid.get_pipeline_model_parallel_group() is mesh.get_group("pp")
            with pytest.raises(MeshSpecError, match="do not describe"):
                ct.PipelineParallelGrid(topology=ct.PipeDataParallelTopology(2, 4), mesh=mesh)
        finally:
            cgroups._release_process_group_references()


def test_grid_errors_are_clear_and_early():
    with fake_world(0, 8):
        try:
            with record_new_groups() as calls:
                with pytest.raises(MeshSpecError, match="multiply to the world size"):
                    ct.PipelineParallelGrid(topology=ct.PipeDataParallelTopology(2, 2))
                with pytest.raises(MeshSpecError, match="lack \\['pipe'\\]"):
                    ct.PipelineParallelGrid(topology=ct.ProcessTopology(["data", "model"], [4, 2]))
                with pytest.raises(MeshSpecError, match="cannot express"):
                    ct.PipelineParallelGrid(mesh=DeepSpeedDeviceMesh(MeshSpec.build(8, dp=4, sp=2)))
            # nothing but the (dp, sp) mesh's own groups was created
            assert calls == [[0, 2, 4, 6], [0, 1]]  # rank 0's dp and sp groups
            # an axis no mesh dim says (size > 1): DeepSpeed's grid, without a mesh (tests/compat/test_subclass_shapes.py)
            extra = ct.PipelineParallelGrid(topology=ct.ProcessTopology(["pipe", "data", "x"], [2, 2, 2]))
            assert ct.grid_mesh(extra) is None
            assert (extra.pp_group, extra.dp_group, extra.ds_model_world_size) == ([0, 4], [0, 2], 4)
            # axes of size 1 that have no mesh dim are fine; a custom axis order is honoured
            grid = ct.PipelineParallelGrid(topology=ct.ProcessTopology(["data", "pipe", "x"], [4, 2, 1]))
            assert grid.pp_group == [0, 1] or grid.global_rank != 0
            assert grid.dp_group == [0, 2, 4, 6]
        finally:
            cgroups._release_process_group_references()


def test_grid_construction_is_collective_safe():
    """Each rank creates its own groups; any two ranks create the groups they share in the same order."""
    factory = make_topology_factory(2, 2, 3, True)
    sequences = {rank: compat_grid(rank, 12, factory, [{}])[1] for rank in range(12)}
    for a in sequences:
        assert sequences[a] and all(a in c for c in sequences[a])
        for b in sequences:
            both = [[c for c in sequences[r] if a in c and b in c] for r in (a, b)]
            assert both[0] == both[1], (a, b)


def test_topology_constructors_warn_once_per_call_site():
    def build():
        return ct.PipeDataParallelTopology(num_pp=2, num_dp=2)

    with pytest.warns(
        LegacyAPIDeprecationWarning, match=r"^TODOV1: deepspeed\.runtime\.pipe\.topology\.PipeDataParallelTopology"
    ):
        build()
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default", LegacyAPIDeprecationWarning)
        build()
        build()
        ct.PipeDataParallelTopology(num_pp=1, num_dp=4)  # a second call site
    assert [str(w.message).split(" ")[1] for w in caught] == [
        "deepspeed.runtime.pipe.topology.PipeDataParallelTopology",
        "deepspeed.runtime.pipe.topology.PipeDataParallelTopology",
    ]
