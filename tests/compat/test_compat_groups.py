"""compat.groups against the real deepspeed==0.19.8 ``deepspeed.utils.groups`` (fake process-group backend).

Each scenario runs twice, once on DeepSpeed (its own grid as mpu) and once on compat (compat's grid),
as the same rank of a fresh fake world; return values and the rank lists of every group must match,
and compat must create each of legacy's rank sets (once), never a set legacy does not create.
"""

from __future__ import annotations

import contextlib
import io
import warnings

import pytest
import torch.distributed as dist
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import compat.groups as cgroups
from compat import topology as ctopology
from compat.deprecation import HOT_PROBES, LegacyAPIDeprecationWarning, warn_legacy
from fakepg import fake_world, group_count, record_new_groups
from mesh_core import DeepSpeedDeviceMesh, MeshSpec, MeshSpecError
from mesh_core.runtime_hooks import registry_for_world

pytestmark = [
    pytest.mark.deepspeed,
    pytest.mark.filterwarnings("ignore::compat.deprecation.LegacyAPIDeprecationWarning"),
    pytest.mark.torch_releases,
]


# --- harness ---------------------------------------------------------------------------------
def ranks_of(group):
    return None if group is None else sorted(dist.get_process_group_ranks(group))


def outcome(fn, *args, **kwargs):
    """A call's value, or the built-in exception type it raised (a subclass with a clearer text,
    e.g. compat's ``KeyError`` for a missing SP group, counts as the built-in type it extends)."""
    try:
        return fn(*args, **kwargs)
    except Exception as err:  # noqa: BLE001 - the type is part of the contract
        return next(c.__name__ for c in type(err).__mro__ if c.__module__ == "builtins")


def legacy_modules():
    from deepspeed.runtime.pipe import topology
    from deepspeed.utils import groups

    return groups, topology


def run_legacy(rank, world, scenario, **kwargs):
    with fake_world(rank, world, deepspeed_comm=True), contextlib.redirect_stdout(io.StringIO()):
        groups, topology = legacy_modules()
        return scenario(groups, topology, **kwargs)


def run_compat(rank, world, scenario, *, legacy_sets=(), **kwargs):
    """Run on compat; with ``legacy_sets``, also return those rank sets the world's registry lacks."""
    with fake_world(rank, world, deepspeed_comm=True):
        try:
            view, calls = scenario(cgroups, ctopology, **kwargs)
            registry = registry_for_world()
            # member-only creation: this rank holds the legacy rank sets it belongs to
            missing = [s for s in legacy_sets if rank in s and not registry.has(s)]
            return (view, calls, missing) if legacy_sets else (view, calls)
        finally:
            cgroups._release_process_group_references()


def assert_same(rank, world, scenario, **kwargs):
    """Run on both; the views match; every rank set legacy created exists in compat, and compat
    created no rank set legacy does not (WORLD stands in for the whole world), each only once."""
    theirs, legacy_calls = run_legacy(rank, world, scenario, **kwargs)
    full = tuple(range(world))
    legacy_sets = {tuple(c) for c in legacy_calls} - {full}
    ours, compat_calls, missing = run_compat(rank, world, scenario, legacy_sets=legacy_sets or {full}, **kwargs)
    assert ours == theirs
    assert missing == [] or missing == [full]
    assert {tuple(c) for c in compat_calls} <= legacy_sets
    assert all(rank in c for c in compat_calls)  # member-only creation
    assert len(compat_calls) == len({tuple(c) for c in compat_calls})
    return ours, legacy_calls, compat_calls


def grid(topology, pp, mp, dp):
    if mp > 1:
        return topology.PipelineParallelGrid(
            topology=topology.PipeModelDataParallelTopology(num_pp=pp, num_mp=mp, num_dp=dp)
        )
    return topology.PipelineParallelGrid(topology=topology.PipeDataParallelTopology(num_pp=pp, num_dp=dp))


def expert_view(groups, name):
    ep_ranks = groups._get_expert_parallel_group_ranks(name)
    edp_ranks = groups._get_expert_data_parallel_group_ranks(name)
    return {
        "ep_group": ranks_of(groups._get_expert_parallel_group(name)),
        "ep_ranks": (type(ep_ranks).__name__, list(ep_ranks)),
        "edp_group": ranks_of(groups._get_expert_data_parallel_group(name)),
        "edp_ranks": (type(edp_ranks).__name__, list(edp_ranks)),
        "ep_ws": groups._get_expert_parallel_world_size(name),
        "ep_rank": groups._get_expert_parallel_rank(name),
        "edp_ws": groups._get_expert_data_parallel_world_size(name),
        "edp_rank": groups._get_expert_data_parallel_rank(name),
        "bcast": groups._get_expert_broadcast_src_rank(name),
        "max": groups._get_max_expert_size(),
        "max_name": groups._get_max_expert_size_name(),
        "max_group": ranks_of(groups._get_max_expert_parallel_group()),
        "names": sorted(groups._get_expert_parallel_group_dict()),
        "edp_names": sorted(groups._get_expert_data_parallel_group_dict()),
        "emp": groups._get_expert_model_parallel_world_size(),
    }


# --- expert parallel ---------------------------------------------------------------------------
def scenario_expert_legacy_path(groups, topology, *, pp, mp, dp, eps, dbe, how):
    if how == "mpu":
        groups.mpu = grid(topology, pp, mp, dp)
    before = {"max": groups._get_max_expert_size(), "name": groups._get_max_expert_size_name()}
    with record_new_groups() as calls:
        for ep in eps:
            groups._create_expert_and_data_parallel(
                ep, pp_size=pp if how == "pp_size" else None, use_data_before_expert_parallel_=dbe
            )
    views = {ep: expert_view(groups, f"ep_size_{ep}") for ep in eps}
    return (before, views), calls


def divisors(n):
    return [d for d in range(1, n + 1) if n % d == 0]


@st.composite
def expert_cases(draw, max_ranks=2048):
    pp = draw(st.sampled_from([1, 2, 4]))
    mp = draw(st.sampled_from([1, 2]))
    dp = draw(st.sampled_from([1, 2, 3, 4, 8, 16, 64, 256]))
    while pp * mp * dp > max_ranks:
        dp //= 2
    world = pp * mp * dp
    stage = world // pp
    eps = draw(st.lists(st.sampled_from(divisors(stage)), min_size=1, max_size=2, unique=True))
    how = draw(st.sampled_from(["mpu", "pp_size", "none"] if pp > 1 else ["none", "mpu"]))
    return dict(pp=pp, mp=mp, dp=dp, eps=eps, dbe=draw(st.booleans()), how=how), draw(st.integers(0, world - 1))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(expert_cases())
@example((dict(pp=2, mp=2, dp=4, eps=[2, 4], dbe=False, how="mpu"), 13))  # legacy_api.md W=16 examples
@example((dict(pp=1, mp=2, dp=8, eps=[4], dbe=True, how="none"), 6))
@example((dict(pp=4, mp=2, dp=256, eps=[8], dbe=False, how="mpu"), 1999))  # W=2048
def test_expert_and_data_parallel_legacy_path(case):
    kwargs, rank = case
    world = kwargs["pp"] * kwargs["mp"] * kwargs["dp"]
    if kwargs["how"] == "none":
        kwargs = dict(kwargs, pp=1, mp=1, dp=world) | {"eps": [e for e in kwargs["eps"] if world % e == 0]}
    (before, views), _, _ = assert_same(rank, world, scenario_expert_legacy_path, **kwargs)
    assert before == {"max": None, "name": "ep_size_None"}
    for ep, view in views.items():
        assert view["ep_ranks"][0] == "range"  # the legacy path stores range objects
        assert view["ep_ws"] == ep


def scenario_expert_new_path(groups, topology, *, ep, mp, pp, mode, folding=False):
    spec = None
    if folding:  # AutoEP + AutoTP: DeepSpeed's own folding spec object, passed to both
        from deepspeed.module_inject.auto_ep_folding import build_folding_spec

        spec = build_folding_spec(world_size=dist.get_world_size(), pp_size=pp, tp_size=mp, ep_size=ep)
    with record_new_groups() as calls:
        groups._create_expert_and_data_parallel(ep, mp_size=mp, pp_size=pp, mp_mode=mode, folding_spec=spec)
        groups._create_expert_and_data_parallel(ep, mp_size=mp, pp_size=pp, mp_mode=mode, folding_spec=spec)  # cached
    return expert_view(groups, f"ep_size_{ep}"), calls


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.sampled_from([2, 4]),
    st.sampled_from([1, 2]),
    st.sampled_from([2, 4, 8, 32, 128]),
    st.sampled_from(["tp", "sp", "folding"]),
    st.data(),
)
@example(2, 1, 8, "tp", None)  # legacy_api.md: new, ep=2, mp=2, 'tp' (W=16)
def test_expert_and_data_parallel_mp_path(mp, pp, per_stage_groups, mode, data):
    world = mp * pp * per_stage_groups
    stage = world // pp
    ep = data.draw(st.sampled_from(divisors(stage))) if data is not None else 2
    rank = data.draw(st.integers(0, world - 1)) if data is not None else 5
    folding = mode == "folding"
    view, _, _ = assert_same(
        rank, world, scenario_expert_new_path, ep=ep, mp=mp, pp=pp, mode="tp" if folding else mode, folding=folding
    )
    assert view["ep_ranks"][0] == "list"


def scenario_expert_tp(groups, topology, *, pp, mp, dp, ep, dbe):
    mpu = grid(topology, pp, mp, dp)
    groups.mpu = mpu
    with record_new_groups() as calls:
        groups._create_expert_data_and_model_parallel(ep, mpu=mpu, use_data_before_expert_parallel_=dbe)
    return expert_view(groups, f"ep_size_{ep}"), calls


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from([1, 2]), st.sampled_from([1, 2, 4]), st.sampled_from([2, 4, 8, 64]), st.booleans(), st.data())
@example(1, 2, 8, False, None)  # legacy_api.md: expert-TP, mpu tp=2, ep=4 (W=16)
def test_expert_data_and_model_parallel(pp, mp, dp, dbe, data):
    world = pp * mp * dp
    ep = data.draw(st.sampled_from(divisors(dp))) if data is not None else 4
    rank = data.draw(st.integers(0, world - 1)) if data is not None else 9
    view, _, _ = assert_same(rank, world, scenario_expert_tp, pp=pp, mp=mp, dp=dp, ep=ep, dbe=dbe)
    assert view["emp"] == mp


@settings(max_examples=60, deadline=None)
@given(
    st.sampled_from([1, 2, 4]),
    st.sampled_from([1, 2, 4]),
    st.sampled_from([1, 2, 4, 8, 16, 96]),
    st.booleans(),
    st.data(),
)
def test_get_expert_parallel_ranks_is_pure_and_equal(tp, pp, dp, dbe, data):
    groups, _ = legacy_modules()
    world = tp * pp * dp
    ep = data.draw(st.sampled_from(divisors(dp)))
    if dbe and (world // ep // tp // pp) == 0:
        return
    assert cgroups._get_expert_parallel_ranks(world, tp, ep, pp, dbe) == groups._get_expert_parallel_ranks(
        world, tp, ep, pp, dbe
    )


def test_expert_src_rank_is_the_groups_first_rank():
    """_get_expert_parallel_src_rank: 0.19.8's formula is only right for consecutive EP groups."""

    def scenario(groups, topology):
        groups._create_expert_and_data_parallel(2, use_data_before_expert_parallel_=True)
        return groups._get_expert_parallel_src_rank("ep_size_2"), ranks_of(
            groups._get_expert_parallel_group("ep_size_2")
        )

    legacy_src, group = run_legacy(5, 8, scenario)
    ours, same_group = run_compat(5, 8, scenario)
    assert group == same_group == [1, 5]
    assert legacy_src == 4  # the formula's answer: not even a member
    assert ours == 1


def test_expert_errors_are_clear():
    with fake_world(0, 12):
        try:
            with record_new_groups() as calls:
                with pytest.raises(MeshSpecError, match="pp=5 does not divide world_size=12"):
                    cgroups._create_expert_and_data_parallel(2, pp_size=5)
                with pytest.raises(AssertionError, match="6 is not divisible by 4"):
                    cgroups._create_expert_and_data_parallel(4, pp_size=2)
                with pytest.raises(NotImplementedError):
                    cgroups._create_expert_and_data_parallel(2, mp_size=2, use_data_before_expert_parallel_=True)
                with pytest.raises(AssertionError, match="not initialized"):
                    cgroups._get_expert_parallel_group("ep_size_2")
                with pytest.raises(AssertionError):
                    cgroups._get_max_expert_parallel_group()  # "ep_size_None", as in DeepSpeed
            assert calls == []
        finally:
            cgroups._release_process_group_references()


# --- AutoTP / lettered API ---------------------------------------------------------------------
def tp_view(groups):
    return {
        "tp": ranks_of(groups.get_tensor_model_parallel_group()),
        "mp": ranks_of(groups.get_model_parallel_group()),
        "same": groups.get_model_parallel_group() is groups.get_tensor_model_parallel_group(),
        "dp": ranks_of(groups.get_data_parallel_group()),
        "tp_ws": groups.get_tensor_model_parallel_world_size(),
        "mp_ws": groups.get_model_parallel_world_size(),
        "tp_rank": groups.get_tensor_model_parallel_rank(),
        "mp_rank": groups.get_model_parallel_rank(),
        "src": groups.get_tensor_model_parallel_src_rank(),
        "dp_ws": groups.get_data_parallel_world_size(),
        "dp_rank": groups.get_data_parallel_rank(),
        "zp": groups._zero_param_parallel_is_initialized(),
    }


def scenario_autotp(groups, topology, *, tp, new_group_path):
    before = [outcome(groups.get_tensor_model_parallel_group), outcome(groups.get_data_parallel_world_size)]
    with record_new_groups() as calls:
        if new_group_path:
            first = groups._init_tp_groups_with_new_group(tp)
        else:
            first = groups._init_tp_mesh_device(tp)
        again = groups._init_tp_mesh_device(tp)
    view = tp_view(groups)
    view["returned"] = [ranks_of(g) for g in first]
    view["returned_mp_is_tp"] = first[1] is groups.get_tensor_model_parallel_group()
    view["again"] = again
    view["before"] = before
    groups.set_tensor_model_parallel_world_size(7)
    groups.set_tensor_model_parallel_rank(3)
    view["overridden"] = (
        groups.get_tensor_model_parallel_world_size(),
        groups.get_tensor_model_parallel_rank(),
        groups.get_model_parallel_rank(),
        groups.get_tensor_model_parallel_src_rank(),  # the formula, with the override, as in DeepSpeed
    )
    return view, calls


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from([1, 2, 4, 8]), st.sampled_from([1, 2, 3, 16, 128]), st.booleans(), st.data())
@example(2, 8, False, None)  # legacy_api.md: W=16, tp=2
def test_autotp_init_and_lettered_getters(tp, dp, new_group_path, data):
    world = tp * dp
    rank = data.draw(st.integers(0, world - 1)) if data is not None else 11
    view, _, _ = assert_same(rank, world, scenario_autotp, tp=tp, new_group_path=new_group_path)
    assert view["again"] is None and view["before"] == ["AssertionError", "AssertionError"]


def scenario_create_model_parallel(groups, topology, *, mp):
    with record_new_groups() as calls:
        dp_group, mp_group = groups._create_model_parallel(mp)
    return ([ranks_of(dp_group), ranks_of(mp_group), outcome(groups.get_data_parallel_group)]), calls


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from([1, 2, 4, 8, 64]), st.sampled_from([1, 2, 5, 16]), st.data())
def test_create_model_parallel(mp, dp, data):
    world = mp * dp
    rank = data.draw(st.integers(0, world - 1))
    view, _, _ = assert_same(rank, world, scenario_create_model_parallel, mp=mp)
    assert view[2] == "AssertionError"  # no module state is set, as in DeepSpeed (its bug B3)
    # mp larger than the world is clamped to the world
    assert_same(rank, world, scenario_create_model_parallel, mp=world * 2)


# --- data / model / sequence parallel resolution ----------------------------------------------------
def resolution_view(groups):
    return {
        "dp": ranks_of(groups._get_data_parallel_group()),
        "dp_ws": groups._get_data_parallel_world_size(),
        "dp_rank": groups._get_data_parallel_rank(),
        "dp_ranks": outcome(lambda: list(groups._get_data_parallel_group_ranks())),
        "mp_ws": groups._get_model_parallel_world_size(),
        "sp_ws": groups._get_sequence_parallel_world_size(),
        "sp_rank": groups._get_sequence_parallel_rank(),
        "sp": outcome(lambda: ranks_of(groups._get_sequence_parallel_group())),
        "sdp": ranks_of(groups._get_sequence_data_parallel_group()),
        "sdp_ws": groups._get_sequence_data_parallel_world_size(),
        "sdp_rank": groups._get_sequence_data_parallel_rank(),
        "bcast": groups._get_broadcast_src_rank(),
        "world": ranks_of(groups._clone_world_group()),
    }


def scenario_resolution(groups, topology, *, source, dp, sp, pp, mp):
    from torch.distributed.device_mesh import init_device_mesh

    if source == "mesh_device":
        groups.mesh_device = init_device_mesh("cpu", (dp, sp), mesh_dim_names=("data_parallel", "sequence_parallel"))
    elif source == "grid":
        groups.mpu = grid(topology, pp, mp, dp * sp // (pp * mp))
    elif source == "sp_mpu":
        from deepspeed.runtime.sequence_parallel import parallel_state_sp

        parallel_state_sp.initialize_sequence_parallel(sp)
        groups.mpu = parallel_state_sp
    with record_new_groups() as calls:
        view = resolution_view(groups)
    return view, calls


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.sampled_from(["none", "mesh_device", "grid", "sp_mpu"]),
    st.sampled_from([1, 2, 4]),
    st.sampled_from([2, 4, 32]),
    st.data(),
)
def test_dp_sp_resolution(source, sp, dp, data):
    world = dp * sp
    if source == "sp_mpu" and sp == 1:
        sp = 2
        world = dp * sp
    pp = data.draw(st.sampled_from(divisors(world)))
    mp = data.draw(st.sampled_from(divisors(world // pp)))
    rank = data.draw(st.integers(0, world - 1))
    assert_same(rank, world, scenario_resolution, source=source, dp=dp, sp=sp, pp=pp, mp=mp)


# --- ZeRO++ hpZ groups, world clone, all-to-all ---------------------------------------------------
def scenario_zero_param(groups, topology, *, size):
    before = [groups._zero_param_parallel_is_initialized(), groups._get_zero_param_intra_parallel_group()]
    with record_new_groups() as calls:
        groups._create_zero_param_parallel_group(size)
    view = [
        before,
        ranks_of(groups._get_zero_param_intra_parallel_group()),
        groups._get_zero_param_intra_parallel_rank_in_mygroup(),
        groups._get_zero_param_intra_parallel_group_world_size(),
        list(groups._get_zero_param_intra_parallel_group_ranks()),
        groups._zero_param_parallel_is_initialized(),
        outcome(groups._create_zero_param_parallel_group, size),
    ]
    return view, calls


@settings(max_examples=15, deadline=None)
@given(st.sampled_from([2, 4, 8, 12, 1024]), st.data())
def test_zero_param_groups(world, data):
    size = data.draw(st.sampled_from(divisors(world) + [world * 2]))
    rank = data.draw(st.integers(0, world - 1))
    view, _, _ = assert_same(rank, world, scenario_zero_param, size=size)
    assert view[0] == [False, None] and view[-1] == "AssertionError" and view[-2] is None


def scenario_all_to_all(groups, topology):
    with record_new_groups() as calls:
        first = groups._get_local_all_to_all_group()
        second = groups._get_local_all_to_all_group()
    view = {name: "non-member" if g is dist.GroupMember.NON_GROUP_MEMBER else ranks_of(g) for name, g in first.items()}
    return (view, first is second, len(calls)), calls


@pytest.mark.parametrize("world,local_size", [(16, 4), (16, 8), (8, 16), (4, 4), (6, 2)])
def test_local_all_to_all_groups(world, local_size, monkeypatch):
    monkeypatch.setenv("LOCAL_SIZE", str(local_size))  # the CPU accelerator's devices per node
    theirs, _ = run_legacy(world - 1, world, scenario_all_to_all)
    ours, compat_calls = run_compat(world - 1, world, scenario_all_to_all)
    assert ours[:2] == theirs[:2]
    # legacy creates every group again on each call; compat creates each rank set once
    assert ours[2] == len({tuple(c) for c in compat_calls}) < theirs[2]


# --- teardown ----------------------------------------------------------------------------------
def test_release_process_group_references():
    with fake_world(2, 8, deepspeed_comm=True):
        try:
            cgroups._init_tp_mesh_device(2)
            cgroups._create_expert_and_data_parallel(2)
            cgroups._create_expert_and_data_parallel(4)
            cgroups._create_zero_param_parallel_group(2)
            cgroups.mpu, cgroups.mesh_device, cgroups.expert_tensor_parallel_world_size = object(), None, 2
            held = cgroups._get_expert_parallel_group_dict()
            # a subgroup: only references to that very object go
            ep4 = cgroups._get_expert_parallel_group("ep_size_4")
            cgroups._release_process_group_references(ep4)
            assert sorted(held) == ["ep_size_2"] and "ep_size_4" not in cgroups._EXPERT_PARALLEL_GROUP_RANKS
            cgroups.set_tensor_model_parallel_world_size(5)
            cgroups._release_process_group_references(cgroups.get_tensor_model_parallel_group())
            assert (
                cgroups._TENSOR_MODEL_PARALLEL_GROUP is None and cgroups._MPU_TENSOR_MODEL_PARALLEL_WORLD_SIZE is None
            )
            assert cgroups.get_data_parallel_group() is not None
            # the world: everything, including the default mesh and the engine-written attributes
            mesh = DeepSpeedDeviceMesh(MeshSpec.build(8, dp=4, tp=2))
            cgroups.bind_mesh(mesh)
            cgroups._release_process_group_references()
            assert held == {} and cgroups._get_expert_data_parallel_group_dict() == {}
            assert (cgroups.mpu, cgroups.mesh_device, cgroups.expert_tensor_parallel_world_size) == (None, None, 1)
            assert cgroups.bound_mesh() is None and cgroups._ZERO_PARAM_INTRA_PARALLEL_GROUP is None
            with pytest.raises(AssertionError):
                cgroups.get_data_parallel_group()
        finally:
            cgroups._release_process_group_references()


def test_initialize_is_deprecated():
    with pytest.raises(cgroups.DeprecatedException, match="pass the desired ep_size"):
        cgroups.initialize(ep_size=2)


# --- the default mesh ----------------------------------------------------------------------------
def test_bind_mesh_serves_getters_from_the_mesh():
    with fake_world(6, 16):
        try:
            mesh = DeepSpeedDeviceMesh(MeshSpec.build(16, pp=2, dp=2, sp=2, tp=2, ep=2))
            with record_new_groups() as calls:
                cgroups.bind_mesh(mesh)
            assert calls == [[0, 2, 4, 6]]  # rank 6's (dp, sp) group only
            assert cgroups.bound_mesh() is mesh
            assert cgroups.get_tensor_model_parallel_group() is mesh.get_group("tp")
            assert cgroups.get_data_parallel_group() is mesh.get_group("dp")
            assert cgroups.get_tensor_model_parallel_src_rank() == 6
            assert cgroups._get_data_parallel_group() is mesh.get_group("dp")
            assert list(cgroups._get_data_parallel_group_ranks()) == mesh.get_group_ranks("dp") == [2, 6]
            assert cgroups._get_sequence_parallel_group() is mesh.get_group("sp")
            assert cgroups._get_sequence_parallel_world_size() == 2 and cgroups._get_sequence_parallel_rank() == 1
            assert cgroups._get_sequence_data_parallel_group() is mesh.get_group(("dp", "sp"))
            assert cgroups._get_sequence_data_parallel_world_size() == 4
            assert cgroups._get_broadcast_src_rank() == 0
            assert cgroups._get_expert_parallel_group("ep_size_2") is mesh.expert_groups(2).ep_group
            assert cgroups._get_expert_data_parallel_group_ranks("ep_size_2") == mesh.expert_groups(2).edp_ranks
            with record_new_groups() as calls:
                assert cgroups._init_tp_mesh_device(2) is None  # TP groups exist (the mesh's)
                cgroups._create_expert_and_data_parallel(2)  # the mesh's ep_size_2 wins
            assert calls == []
            cgroups.bind_mesh(None)
            assert cgroups.bound_mesh() is None
            assert ranks_of(cgroups._get_data_parallel_group()) == list(range(16))
            with pytest.raises(TypeError, match="DeepSpeedDeviceMesh"):
                cgroups.bind_mesh(object())  # type: ignore[arg-type]
        finally:
            cgroups._release_process_group_references()


def test_init_tp_reuses_a_bound_mesh_with_innermost_tp():
    with fake_world(5, 8):
        try:
            mesh = DeepSpeedDeviceMesh(MeshSpec.build(8, dp=4, tp=2))
            cgroups.bind_mesh(mesh)
            cgroups.bind_mesh(None)  # unbound, but its groups exist
            with record_new_groups() as calls:
                dp_group, tp_group = cgroups._init_tp_mesh_device(2)
            assert calls == []  # identical rank sets: the existing communicators are reused
            assert ranks_of(tp_group) == [4, 5] and ranks_of(dp_group) == [1, 3, 5, 7]
        finally:
            cgroups._release_process_group_references()


# --- fewer communicators, collective safety ---------------------------------------------------------
def scenario_megatron_plus_autotp(groups, topology):
    """A (pipe=1, data=4, model=2) grid, AutoTP tp=2, MoE ep=2 and the world clone."""
    start = registry_for_world().created if groups is cgroups else group_count()
    with record_new_groups() as calls:
        groups.mpu = grid(topology, 1, 2, 4)
        groups._init_tp_mesh_device(2)
        groups._create_expert_and_data_parallel(2)
        groups._clone_world_group()
    grid_dp, tp_dp = groups.mpu.get_data_parallel_group(), groups.get_data_parallel_group()
    end = registry_for_world().created if groups is cgroups else group_count()
    return (ranks_of(grid_dp) == ranks_of(tp_dp), grid_dp is tp_dp, end - start), calls


def test_fewer_communicators_than_legacy_for_duplicate_rank_sets():
    """Legacy creates the grid's DP groups again as _DATA_PARALLEL_GROUP (and TP as slice, EP, ...)."""
    (legacy_same, legacy_shared, legacy_count), legacy_calls = run_legacy(3, 8, scenario_megatron_plus_autotp)
    (same, shared, count), calls = run_compat(3, 8, scenario_megatron_plus_autotp)
    assert legacy_same and same and shared and not legacy_shared
    assert legacy_count == len(legacy_calls)
    # compat serves the world clone as WORLD and creates only rank 3's own groups
    assert sum(1 for c in legacy_calls if 3 in c) > len({tuple(c) for c in legacy_calls if 3 in c})  # duplicates
    distinct = {tuple(c) for c in legacy_calls if 3 in c} - {tuple(range(8))}
    assert count == len(calls) == len(distinct)


def test_group_creation_is_collective_safe():
    """Every rank issues the same creation calls, in the same order, for a mixed legacy sequence."""

    def scenario(groups, topology):
        with record_new_groups() as calls:
            groups.mpu = grid(topology, 2, 2, 3)
            groups._init_tp_mesh_device(2)
            groups._create_expert_and_data_parallel(3)
            groups._create_expert_data_and_model_parallel(3, mpu=groups.mpu)
            groups._create_zero_param_parallel_group(4)
            groups._create_model_parallel(4)
        return calls, calls

    sequences = {rank: run_compat(rank, 12, scenario)[0] for rank in range(12)}
    for a in sequences:  # member-only: any two ranks create the groups they share in the same order
        assert sequences[a] and all(a in c for c in sequences[a])
        for b in sequences:
            both = [[c for c in sequences[r] if a in c and b in c] for r in (a, b)]
            assert both[0] == both[1], (a, b)


# --- deprecation warnings ------------------------------------------------------------------------
@pytest.mark.filterwarnings("default::compat.deprecation.LegacyAPIDeprecationWarning")
def test_legacy_calls_warn_once_per_call_site_and_obey_filters():
    with fake_world(0, 4):
        try:
            cgroups._create_expert_and_data_parallel(2)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("default", LegacyAPIDeprecationWarning)
                for _ in range(3):
                    cgroups._get_expert_parallel_group("ep_size_2")  # one site
                cgroups._get_expert_parallel_group("ep_size_2")  # another site
            assert len(caught) == 2 and all(w.category is LegacyAPIDeprecationWarning for w in caught)
            assert str(caught[0].message) == (
                "TODOV1: deepspeed.utils.groups._get_expert_parallel_group is deprecated; use\n"
                "  <mesh>.expert_groups(N).ep_group (ds-migrate --explain _get_expert_parallel_group)"
            )
            assert caught[0].filename == __file__
            with warnings.catch_warnings():
                warnings.simplefilter("error", LegacyAPIDeprecationWarning)
                for _ in range(2):  # an error filter raises on every call
                    with pytest.raises(LegacyAPIDeprecationWarning, match="^TODOV1: "):
                        cgroups._get_data_parallel_group()
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("ignore", LegacyAPIDeprecationWarning)
                cgroups._get_data_parallel_group()
                cgroups.get_tensor_model_parallel_world_size  # attribute access alone never warns
            assert caught == []
        finally:
            cgroups._release_process_group_references()


def test_warn_legacy_names_the_replacement_and_row():
    def shim():
        warn_legacy("deepspeed.example.old", "mesh.new()", "deepspeed.example.old")

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        for _ in range(3):
            shim()  # one call site of the shim
        shim()  # another
    text = "TODOV1: deepspeed.example.old is deprecated; use mesh.new() (MIGRATION.md row\n  'deepspeed.example.old')"
    assert [str(w.message) for w in caught] == [text, text]
    assert caught[0].lineno != caught[1].lineno and caught[0].filename == __file__
    assert issubclass(LegacyAPIDeprecationWarning, DeprecationWarning)


def test_every_legacy_function_is_shimmed():
    """compat.groups has every function of deepspeed.utils.groups 0.19.8, with the same parameters."""
    import inspect

    legacy, _ = legacy_modules()
    names = [n for n, v in vars(legacy).items() if inspect.isfunction(v) and v.__module__ == legacy.__name__]
    assert len(names) > 50
    for name in names:
        ours = getattr(cgroups, name)
        assert list(inspect.signature(ours).parameters) == list(inspect.signature(getattr(legacy, name)).parameters), (
            name
        )
        source = inspect.getsource(ours)
        assert "# TODOV1:" in source, name
    for attr in ("mpu", "mesh_device", "expert_tensor_parallel_world_size", "_DEVICE_MESH_SPLIT_UNSUPPORTED"):
        assert getattr(cgroups, attr) == getattr(legacy, attr)


def test_compat_imports_without_deepspeed():
    import subprocess
    import sys

    code = (
        "import sys; import compat, compat.groups, compat.topology, compat.mpu; "
        "assert 'deepspeed' not in sys.modules, sorted(m for m in sys.modules if m.startswith('deepspeed')); "
        "assert 'compat.install' not in sys.modules and callable(compat.install) and callable(compat.uninstall)"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


@pytest.mark.filterwarnings("default::compat.deprecation.LegacyAPIDeprecationWarning")
def test_hot_getters_bound_their_call_site_probing():
    """Hot getters stop probing call sites after HOT_PROBES calls; any filter change re-arms them."""
    entry = cgroups._W_EP_GROUP
    assert entry.hot and not cgroups._W_EP_GROUP_RANKS.hot
    with fake_world(0, 4):
        try:
            cgroups._create_expert_and_data_parallel(2)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("default", LegacyAPIDeprecationWarning)
                assert entry.budget == HOT_PROBES
                entry.budget = 1
                cgroups._get_expert_parallel_group("ep_size_2")  # site A: probed, warns
                cgroups._get_expert_parallel_group("ep_size_2")  # site B: budget spent, not probed
                assert entry.budget == 0 and len(caught) == 1
                warnings.simplefilter("default", LegacyAPIDeprecationWarning)  # a filter change re-arms
                assert entry.budget == HOT_PROBES
                for _ in range(2):
                    cgroups._get_expert_parallel_group("ep_size_2")  # site C: probed again, warns once
            assert len(caught) == 2 and caught[0].lineno != caught[1].lineno
        finally:
            cgroups._release_process_group_references()


def test_unbinding_restores_autotp_groups():
    """Engines re-bind their own state around each step: an AutoTP engine's groups survive another engine's mesh."""
    with fake_world(3, 8):
        try:
            dp_group, tp_group = cgroups._init_tp_mesh_device(2)
            other = DeepSpeedDeviceMesh(MeshSpec.build(8, dp=2, tp=4))
            cgroups.bind_mesh(other)
            assert cgroups.get_tensor_model_parallel_world_size() == 4
            cgroups.bind_mesh(None)
            assert cgroups.get_tensor_model_parallel_group() is tp_group
            assert cgroups.get_data_parallel_group() is dp_group and cgroups.get_tensor_model_parallel_world_size() == 2
            assert cgroups.bound_mesh() is None
        finally:
            cgroups._release_process_group_references()


def test_a_getter_prologue_warns_at_its_caller_and_names_itself_on_a_wrong_grid():
    """The shared prologue of the non-hot getters: the warning is the caller's line, once per site;
    with no single grid, the error names the getter called."""
    from compat import engine_scope

    with fake_world(0, 4):
        try:
            cgroups.bind_mesh(DeepSpeedDeviceMesh.build(tp=2))
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("default", LegacyAPIDeprecationWarning)
                for _ in range(2):
                    assert cgroups.get_tensor_model_parallel_world_size() == 2  # one site
            assert len(caught) == 1 and caught[0].filename == __file__
            assert "get_tensor_model_parallel_world_size is deprecated" in str(caught[0].message)
            cgroups._set_wrong_grid(engine_scope.AmbiguousGrid(["a", "b"]))
            with pytest.raises(
                engine_scope.WrongGridError,
                match=r"^deepspeed\.utils\.groups\.get_tensor_model_parallel_world_size\(\) was called",
            ):
                cgroups.get_tensor_model_parallel_world_size()
        finally:
            cgroups._set_wrong_grid(None)
            cgroups._release_process_group_references()
