"""Member-only group creation on the fake backend: a rank issues one creation call per distinct
group it belongs to and nothing else; non-members of a sub-world mesh issue nothing; group names
depend on the rank set alone; the creation path is a typed decision."""

from __future__ import annotations

import logging

import pytest
import torch
import torch.distributed as dist
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch.distributed import distributed_c10d as c10d

import mesh_core.registry as registry_mod
from fakepg import fake_world, record_new_groups
from mesh_core import DeepSpeedDeviceMesh, MeshLayout, MeshSpec
from mesh_core.registry import (
    CreationInputs,
    CreationPath,
    GroupNamingError,
    choose_creation_path,
    group_name_for,
)

pytestmark = pytest.mark.torch_releases

DIMS = ("pp", "dp", "sp", "tp")


@st.composite
def big_layouts(draw):
    """Random layouts up to 65,536 ranks: sizes are powers of two, ep divides the data ranks."""
    exps = {d: draw(st.integers(0, 4)) for d in DIMS}
    world_exp = min(16, sum(exps.values()) + draw(st.integers(0, 4)))
    total = sum(exps.values())
    while total > world_exp:  # shrink to fit 2**16
        d = max(exps, key=exps.get)
        exps[d] -= 1
        total -= 1
    world = 2**world_exp
    sizes = {d: 2**e for d, e in exps.items() if d != "dp"}
    order = draw(st.permutations(DIMS))
    spec = MeshSpec.build(world, order=order, **sizes)
    data = spec.data_size
    ep = draw(st.sampled_from([e for e in (1, 2, 4, 8) if data % e == 0]))
    spec = MeshSpec.build(world, order=order, ep=ep, data_before_expert=draw(st.booleans()), **sizes)
    flatten = draw(st.sampled_from([(), (("dp", "sp"),), (("pp", "tp"), ("dp", "sp", "tp"))]))
    p2p = draw(st.booleans())
    rank = draw(st.integers(0, world - 1))
    return spec, flatten, p2p, rank


def expected_sets(spec: MeshSpec, rank: int, flatten, p2p) -> set[tuple[int, ...]]:
    """The distinct rank sets ``rank`` belongs to among the groups the mesh builds (layout math),
    minus the whole world (served by the default group, no call)."""
    layout = MeshLayout(spec)
    dims = [(n,) for n, s in zip(spec.names, spec.sizes) if s > 1] or [spec.names[:1]]
    dims += [tuple(layout.normalize(f)) for f in flatten]
    if spec.ep > 1:
        dims += [("ep",), ("edp",)]
    sets = {tuple(sorted(layout.group_ranks(d, rank))) for d in dims}
    if p2p and spec.dim_size("pp") > 1:
        for peer in (layout.stage_peer(rank, 1), layout.stage_peer(rank, -1)):
            sets.add(tuple(sorted({rank, peer})))
    return {s for s in sets if len(s) < spec.world_size}


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(big_layouts())
def test_calls_per_rank_equal_the_distinct_groups_it_belongs_to(case):
    spec, flatten, p2p, rank = case
    with fake_world(rank, spec.world_size), record_new_groups() as calls:
        mesh = DeepSpeedDeviceMesh(spec, flatten=flatten, p2p_groups=p2p)
        assert mesh.registry.created == len(calls)
    assert sorted(map(tuple, calls)) == sorted(expected_sets(spec, rank, flatten, p2p))


@pytest.mark.parametrize("world", [1024, 8192, 65536])
def test_calls_are_independent_of_world_size(world):
    spec = MeshSpec.build(world, pp=8, tp=8, ep=8)
    with fake_world(world - 1, world), record_new_groups() as calls:
        DeepSpeedDeviceMesh(spec, flatten=[("dp",)])
    assert len(calls) == 5  # pp, dp, tp, ep, edp; the flattened dp is dp


@settings(max_examples=20, deadline=None)
@given(st.integers(1, 12), st.data())
def test_non_members_of_a_sub_world_mesh_issue_no_calls(log_half, data):
    world = 2**log_half * 2
    members = range(world // 2, world)
    rank = data.draw(st.integers(0, world // 2 - 1))
    tp = data.draw(st.sampled_from([t for t in (1, 2, 4) if (world // 2) % t == 0]))
    with fake_world(rank, world), record_new_groups() as calls:
        sub = DeepSpeedDeviceMesh.build(ranks=members, tp=tp, flatten=[("dp", "tp")], p2p_groups=False)
        assert not sub.is_member and sub.device_mesh is None
        assert sub.ensure_group("tp") is None and sub.ensure_group(("dp", "tp")) is None
        if (world // 2 // tp) % 2 == 0:
            assert sub.expert_groups(2).ep_group is None
        assert sub.destroy() == 0
    assert calls == []


def test_members_of_a_sub_world_mesh_need_no_non_member():
    """Members build the sub-world mesh alone: the non-members never construct it."""
    with fake_world(5, 8), record_new_groups() as calls:
        sub = DeepSpeedDeviceMesh.build(ranks=[4, 5, 6, 7], tp=2)
        assert sub.device_mesh is not None and sub.device_mesh.mesh.tolist() == [[4, 5], [6, 7]]
        assert dist.get_process_group_ranks(sub.device_mesh.get_group("dp")) == [5, 7]
    assert calls == [[5, 7], [4, 5]]


def test_device_mesh_holds_the_registry_groups():
    with fake_world(3, 16):
        mesh = DeepSpeedDeviceMesh.build(pp=2, tp=4)
        for name in ("pp", "dp", "tp"):
            assert mesh.device_mesh.get_group(name) is mesh.get_group(name)
            assert mesh.device_mesh.get_group(name).group_name.startswith("mesh_core.")


def test_group_names_depend_on_the_rank_set_alone():
    """torch's own member-only name depends on what the calling rank did before (its salt is
    ``len(_world.pg_names)`` up to torch 2.13 and the group counter, which the namer then advances,
    from 2.14), so two members with different histories would disagree; the registry's name does
    not, and its creations leave torch's counter alone."""
    names = {}
    for rank, history in ((0, True), (2, False)):
        with fake_world(rank, 8):
            if history:  # rank 0 also took part in groups rank 2 is not in
                dist.new_group([0, 1], use_local_synchronization=True)
                DeepSpeedDeviceMesh.build(ranks=[0, 1], tp=2)
            count = c10d._world.group_count
            mesh = DeepSpeedDeviceMesh.build(tp=2)
            assert c10d._world.group_count == count
            torch_named = dist.new_group([0, 2, 4, 6], use_local_synchronization=True)
            names[rank] = (mesh.get_group("dp").group_name, torch_named.group_name)
    assert names[0][0] == names[2][0] == group_name_for((None, (0, 2, 4, 6)))
    assert names[0][1] != names[2][1]  # plain torch would give the two members different store prefixes


def test_recreated_rank_set_gets_a_new_generation_name():
    with fake_world(0, 8):
        first = DeepSpeedDeviceMesh.build(tp=2)
        name = first.get_group("tp").group_name
        first.destroy()
        again = DeepSpeedDeviceMesh.build(tp=2)
        assert again.get_group("tp").group_name != name
        assert again.get_group("tp").group_name == group_name_for((None, (0, 1)), 1)


def test_a_torch_that_ignores_the_name_fails_loudly(monkeypatch):
    import contextlib

    monkeypatch.setattr(registry_mod, "_named", lambda name: contextlib.nullcontext())
    with fake_world(0, 8):
        with pytest.raises(GroupNamingError, match="depends on the rank set alone"):
            DeepSpeedDeviceMesh.build(tp=2)


def test_counter_named_creation_still_agrees_after_member_only_creation():
    """Member-only creation leaves c10d's world counter alone, so world-collective counter-named
    groups created afterwards (DeviceMesh's own, legacy DeepSpeed's) get equal names everywhere."""
    names = set()
    for rank in (0, 5):
        with fake_world(rank, 8):
            if rank == 0:
                DeepSpeedDeviceMesh.build(ranks=[0, 1, 2, 3], tp=2)
            before = c10d._world.group_count
            group = dist.new_group([0, 5])
            names.add((before, group.group_name if rank in (0, 5) else None))
    assert len(names) == 1


def test_debug_log_line_per_group(caplog):
    with fake_world(2, 8), caplog.at_level(logging.DEBUG, logger="mesh_core.registry"):
        DeepSpeedDeviceMesh.build(tp=2)
        DeepSpeedDeviceMesh.build(tp=2)
    lines = [r.getMessage() for r in caplog.records if r.name == "mesh_core.registry"]
    created = [line for line in lines if " created " in line]
    reused = [line for line in lines if " reused " in line]
    assert len(created) == 2 and len(reused) == 2
    assert "ranks=[2, 3]" in created[1] and "dims=tp" in created[1] and "MeshSpec(dp=4, tp=2" in created[1]


# --- the creation path: a typed decision ----------------------------------------------------------
BOUND = dict(bound_device=torch.device("cuda", 0), accelerator_available=True, supports_splitting=True)


@pytest.mark.parametrize(
    "inputs,path",
    [
        (CreationInputs(**BOUND, backend_requested=None, whole_world=True), CreationPath.SPLIT),
        (CreationInputs(**BOUND, backend_requested=None, whole_world=False), CreationPath.LOCAL),
        (CreationInputs(**BOUND, backend_requested="gloo", whole_world=True), CreationPath.LOCAL),
        (
            CreationInputs(**{**BOUND, "supports_splitting": False}, backend_requested=None, whole_world=True),
            CreationPath.LOCAL,
        ),
        (
            CreationInputs(**{**BOUND, "accelerator_available": False}, backend_requested=None, whole_world=True),
            CreationPath.LOCAL,
        ),
        (
            CreationInputs(**{**BOUND, "bound_device": None}, backend_requested=None, whole_world=True),
            CreationPath.LOCAL,
        ),
    ],
)
def test_creation_path_rule(inputs, path):
    assert choose_creation_path(inputs) is path


def test_fake_and_cpu_worlds_take_the_local_path():
    with fake_world(0, 8):
        inputs = CreationInputs.probe(None, whole_world=True)
        assert inputs.bound_device is None and not inputs.supports_splitting
        assert DeepSpeedDeviceMesh.build(tp=2).creation_path is CreationPath.LOCAL


def test_split_path_bookkeeping(monkeypatch):
    """The SPLIT path's registry logic (one call per partition with new sets, split children kept
    apart from member-only groups of the same rank sets). ``split_group`` itself needs an accelerator; here it is replaced by a stand-in
    that creates this rank's group member-only, so only the bookkeeping is under test."""
    splits = []

    def fake_split(split_ranks):
        splits.append([list(r) for r in split_ranks])
        mine = next((r for r in split_ranks if dist.get_rank() in r), None)
        if mine is None:
            return None
        return dist.new_group(mine, use_local_synchronization=True)  # named by the registry's split

    monkeypatch.setattr(dist, "split_group", fake_split)
    monkeypatch.setattr(
        "mesh_core.device_mesh.choose_creation_path",
        lambda inputs: CreationPath.SPLIT if inputs.whole_world else CreationPath.LOCAL,
    )
    with fake_world(2, 8):
        a = DeepSpeedDeviceMesh.build(tp=2)
        assert a.creation_path is CreationPath.SPLIT
        assert splits == [[[0, 2, 4, 6], [1, 3, 5, 7]], [[0, 1], [2, 3], [4, 5], [6, 7]]]
        assert a.registry.created == 2
        b = DeepSpeedDeviceMesh.build(pp=2, tp=2)  # tp partition known: no call for it
        assert len(splits) == 4 and a.get_group("tp") is b.get_group("tp")
        sub = DeepSpeedDeviceMesh.build(ranks=[0, 1, 2, 3], tp=2)  # sub-world: member-only
        assert sub.creation_path is CreationPath.LOCAL and len(splits) == 4
        # split children have keys of their own: a member-only request never shares one (which kind a
        # rank set got would depend on which thread of each rank reached it first)
        assert sub.get_group("tp") is not a.get_group("tp")
        assert sub.get_group("tp").group_name != a.get_group("tp").group_name
