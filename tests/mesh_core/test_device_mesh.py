"""DeepSpeedDeviceMesh on the fake process-group backend: groups equal the layout math, creation
is collective-safe (same calls in the same order on every rank) and rank sets are shared."""

from __future__ import annotations

import random

import pytest
import torch.distributed as dist
from hypothesis import given, settings
from hypothesis import strategies as st
from test_layout import dim_sets, specs

from fakepg import fake_world, record_new_groups
from mesh_core import DeepSpeedDeviceMesh, MeshLayout, MeshSpec, MeshSpecError
from mesh_core.runtime_hooks import registry_for_world

pytestmark = pytest.mark.torch_releases


def ranks_of(group) -> list[int]:
    return dist.get_process_group_ranks(group)


@settings(max_examples=40, deadline=None)
@given(specs(max_ranks=2048, sub_world=True), st.randoms(use_true_random=False))
def test_groups_equal_layout_math(spec, rnd):
    layout = MeshLayout(spec)
    for rank in rnd.sample(range(spec.world_size), min(3, spec.world_size)):
        with fake_world(rank, spec.world_size):
            mesh = DeepSpeedDeviceMesh(spec, flatten=[spec.names[:2]] if len(spec.names) > 1 else ())
            if not layout.contains(rank):
                assert not mesh.is_member and mesh.device_mesh is None
                with pytest.raises(MeshSpecError, match="not a member"):
                    mesh.get_group(spec.names[0])
                continue
            for dims in dim_sets(spec) + [("ep",), ("edp",)]:
                expected = layout.group_ranks(dims, rank)
                assert ranks_of(mesh.get_group(dims)) == sorted(expected)
                assert mesh.get_group_ranks(dims) == expected
                assert mesh.size(dims) == len(expected)
                assert mesh.get_local_rank(dims) == expected.index(rank)
            if mesh.device_mesh is not None:
                assert mesh.device_mesh.mesh.flatten().tolist() == list(spec.ranks)


def shared_order(calls_a, calls_b, a, b):
    """The rank sets holding both ranks, in the order each of them created them."""
    both = lambda calls: [c for c in calls if a in c and b in c]  # noqa: E731
    return both(calls_a), both(calls_b)


@pytest.mark.parametrize("world", [8, 64, 1024])
def test_members_issue_the_same_calls_in_the_same_order(world):
    """Each rank creates only its own groups; any two ranks create the groups they share in the
    same order (so no rendezvous waits on a peer that is elsewhere)."""
    spec = MeshSpec.build(world, pp=2, tp=2, sp=2, ep=2)
    sequences = {}
    for rank in sorted({0, 1, 2, world // 2, world // 2 + 1, world - 1}):
        with fake_world(rank, world), record_new_groups() as calls:
            DeepSpeedDeviceMesh(spec, flatten=[("dp", "sp"), ("pp", "tp")], p2p_groups=True)
            DeepSpeedDeviceMesh.build(ranks=range(world // 2, world), tp=2).ensure_group(("dp", "tp"))
        assert all(rank in c for c in calls) and len({tuple(c) for c in calls}) == len(calls)
        sequences[rank] = calls
    for a in sequences:
        for b in sequences:
            mine, theirs = shared_order(sequences[a], sequences[b], a, b)
            assert mine == theirs, (a, b)
    assert len(sequences[0]) > 0


def test_identical_rank_sets_are_created_once():
    with fake_world(3, 16), record_new_groups() as calls:
        a = DeepSpeedDeviceMesh.build(pp=2, tp=2)
        # dims pp, dp, tp: rank 3's own groups only
        assert calls == [[3, 11], [1, 3, 5, 7], [2, 3]]
        b = DeepSpeedDeviceMesh.build(pp=2, tp=2)
        assert len(calls) == 3  # the same layout again: nothing new
        assert a.get_group("tp") is b.get_group("tp")
        # a different layout over the same world shares what coincides: tp=2 groups, and its
        # dp=(pp x dp of a) groups equal a's flattened (pp, dp) groups
        a.get_group(("pp", "dp"))
        n = len(calls)
        c = DeepSpeedDeviceMesh.build(tp=2)
        assert len(calls) == n
        assert c.get_group("dp") is a.get_group(("pp", "dp"))
        # a sub-world mesh (the first pipeline stage of a) is made only of a's groups
        d = DeepSpeedDeviceMesh.build(ranks=range(0, 8), tp=2)
        assert len(calls) == n
        assert d.get_group("tp") is b.get_group("tp") and d.get_group("dp") is a.get_group("dp")
        # ... while tp=4 over ranks 8..15 involves rank 3 in nothing
        e = DeepSpeedDeviceMesh.build(ranks=range(8, 16), tp=4)
        assert len(calls) == n and not e.is_member and e.ensure_group("tp") is None
        assert len(calls) == n


def test_world_spanning_group_reuses_the_default_group():
    with fake_world(1, 8), record_new_groups() as calls:
        mesh = DeepSpeedDeviceMesh.build(pp=2, flatten=[("pp", "dp")])
        assert mesh.get_group(("pp", "dp")) is dist.group.WORLD
        assert calls == [[1, 5], [0, 1, 2, 3]]  # this rank's pp and dp groups


def test_size_one_dims_are_not_devicemesh_dims():
    with fake_world(5, 8):
        mesh = DeepSpeedDeviceMesh.build(pp=1, tp=2, sp=1)
        assert mesh.mesh_dim_names == ("dp", "tp")
        assert mesh.size("sp") == 1 and mesh.get_local_rank("pp") == 0
        assert ranks_of(mesh.get_group("sp")) == [5]


def test_hsdp_mesh_exposes_flattened_dp():
    with fake_world(6, 16):
        mesh = DeepSpeedDeviceMesh.build(dp_replicate=2, dp_shard=4, tp=2)
        assert mesh.device_mesh.mesh_dim_names == ("dp_replicate", "dp_shard", "tp")
        assert ranks_of(mesh.get_group("dp")) == [0, 2, 4, 6, 8, 10, 12, 14]
        assert ranks_of(mesh["dp_shard"].get_group()) == [0, 2, 4, 6]


def test_pipeline_p2p_groups_and_stage_to_global():
    with fake_world(2, 8):
        mesh = DeepSpeedDeviceMesh.build(pp=4, tp=2, p2p_groups=True)
        assert mesh.p2p_pair() == [2, 4]
        assert ranks_of(mesh.p2p_group(4)) == [2, 4]
        assert ranks_of(mesh.p2p_group(0)) == [0, 2]
        assert mesh.stage_to_global(3) == 6 and mesh.stage_to_global(0, tp=1) == 1
        # with pp=2 the p2p pair equals the pp group: one communicator
        two = DeepSpeedDeviceMesh.build(pp=2, tp=2, p2p_groups=True)
        assert two.p2p_group(two.p2p_pair()[1]) is two.get_group("pp")


def test_expert_groups_of_other_sizes_are_created_on_demand():
    with fake_world(5, 16):
        mesh = DeepSpeedDeviceMesh.build(pp=2, ep=2)
        assert ranks_of(mesh.get_group("ep")) == [4, 5]
        four = mesh.expert_groups(4)
        assert four.ep_ranks == [4, 5, 6, 7] and four.edp_ranks == [1, 5]
        assert ranks_of(four.ep_group) == [4, 5, 6, 7]
        assert mesh.expert_groups(4) is four
        with pytest.raises(MeshSpecError, match="ep_size=3 is not valid"):
            mesh.expert_groups(3)


def test_destroy_releases_only_unshared_groups():
    with fake_world(0, 8):
        registry = registry_for_world()
        a = DeepSpeedDeviceMesh.build(tp=2)
        b = DeepSpeedDeviceMesh.build(tp=4)
        sets = registry.rank_sets
        assert b.destroy() == 2  # its tp [0..3] and dp [0,4] groups (rank 0's); nothing a shares
        assert registry.rank_sets < sets
        assert ranks_of(a.get_group("tp")) == [0, 1]
        with pytest.raises(MeshSpecError, match="destroyed"):
            b.get_group("tp")
        assert b.destroy() == 0


def test_several_meshes_coexist_without_shared_state():
    """An actor (tp=2) and a reference model (dp only) on one world, and two half-world models."""
    with fake_world(6, 8):
        actor = DeepSpeedDeviceMesh.build(tp=2)
        reference = DeepSpeedDeviceMesh.build()
        left = DeepSpeedDeviceMesh.build(ranks=range(0, 4), tp=2)
        right = DeepSpeedDeviceMesh.build(ranks=range(4, 8), pp=2)
        assert ranks_of(actor.get_group("dp")) == [0, 2, 4, 6]
        assert reference.get_group("dp") is dist.group.WORLD
        assert not left.is_member and right.is_member
        assert ranks_of(right.get_group("pp")) == [4, 6]
        assert ranks_of(right.get_group("dp")) == [6, 7]


def test_large_world_sampled_ranks_match_layout():
    world = 8192
    spec = MeshSpec.build(world, pp=8, tp=8, ep=8)
    layout = MeshLayout(spec)
    for rank in random.Random(0).sample(range(world), 2):
        with fake_world(rank, world):
            mesh = DeepSpeedDeviceMesh(spec)
            for dims in ("pp", "dp", "tp", "ep", "edp"):
                assert ranks_of(mesh.get_group(dims)) == sorted(layout.group_ranks(dims, rank))


def test_registry_forgets_a_group_destroyed_elsewhere():
    with fake_world(2, 8):
        registry = registry_for_world()
        mesh = DeepSpeedDeviceMesh.build(tp=2)
        tp = mesh.get_group("tp")
        dist.destroy_process_group(tp)
        assert registry.forget(tp) == 1 and registry.forget(tp) == 0
        again = DeepSpeedDeviceMesh.build(tp=2)
        assert again.get_group("tp") is not tp and ranks_of(again.get_group("tp")) == [2, 3]


def test_rank_and_size_mean_what_torch_means():
    """``get_rank()`` is the global rank and ``size()`` counts every rank of the mesh (torch's
    DeviceMesh); a coordinate is ``get_local_rank(dim)``, torch's name, also by dim index."""
    with fake_world(13, 16):
        mesh = DeepSpeedDeviceMesh.build(ranks=range(8, 16), pp=2, tp=2)  # pp x dp x tp = 2 x 2 x 2
        torch_mesh = mesh.device_mesh
        assert mesh.get_rank() == torch_mesh.get_rank() == 13
        assert mesh.size() == torch_mesh.size() == 8
        for index, dim in enumerate(mesh.mesh_dim_names):
            assert mesh.get_local_rank(dim) == mesh.get_local_rank(index) == torch_mesh.get_local_rank(dim)
            assert mesh.size(dim) == mesh.size(index) == torch_mesh.size(index)
        assert [mesh.get_local_rank(d) for d in ("pp", "dp", "tp")] == [1, 0, 1]
        assert mesh.get_local_rank(("dp", "tp")) == 1 and mesh.size(("dp", "tp")) == 4
        with pytest.raises(MeshSpecError, match="name the mesh dim"):
            mesh.get_local_rank()
        with pytest.raises(MeshSpecError, match="out of range"):
            mesh.size(3)
        assert DeepSpeedDeviceMesh.build(ranks=range(8, 16), tp=8).get_local_rank() == 5  # a 1-D mesh


def test_the_old_get_rank_of_a_dim_warns_once_and_still_answers(monkeypatch):
    from mesh_core import renamed

    monkeypatch.setattr(renamed, "_warned", set())
    with fake_world(5, 8):
        mesh = DeepSpeedDeviceMesh.build(pp=2, tp=2)
        with pytest.warns(renamed.MeshAPIDeprecationWarning, match=r"TODOV1: .*get_local_rank\(dims\)") as caught:
            assert mesh.get_rank("tp") == mesh.get_local_rank("tp") == 1
            assert mesh.get_rank(("pp", "dp")) == mesh.get_local_rank(("pp", "dp")) == 2
        assert len(caught) == 1


def test_the_mesh_owns_its_expert_table(monkeypatch):
    """Sizes the mesh builds are served as ``ep_size_N``; a name registered first wins; the table
    is read through methods (read-only views); the old attributes read it with one deprecation."""
    from mesh_core import renamed
    from mesh_core.runtime_hooks import expert_group_names, expert_groups_named, register_expert_groups

    monkeypatch.setattr(renamed, "_warned", set())
    with fake_world(3, 8):
        mesh = DeepSpeedDeviceMesh.build(tp=2, ep=2)
        two = mesh.expert_groups()
        assert mesh.experts.built(2) is two and mesh.experts.named()["ep_size_2"] is two
        other = mesh.expert_groups(4)
        assert register_expert_groups(mesh, "ep_size_4", two) is other  # taken: the first wins
        assert register_expert_groups(mesh, "custom", two) is two and expert_groups_named(mesh, "custom") is two
        assert expert_group_names(mesh) == ["ep_size_2", "ep_size_4", "custom"]
        assert mesh.experts.built_named() == {"ep_size_2": two, "ep_size_4": other, "custom": two}
        with pytest.raises(TypeError):
            mesh.experts.named()["x"] = two  # type: ignore[index]
        with pytest.warns(renamed.MeshAPIDeprecationWarning, match="experts.named()"):
            assert dict(mesh.expert_names) == dict(mesh.experts.named())
        with pytest.warns(renamed.MeshAPIDeprecationWarning, match="experts.sizes()"):
            assert dict(mesh.built_expert_groups) == {2: two, 4: other}
        with pytest.raises(AttributeError, match="no_such"):
            mesh.no_such
        mesh.destroy()
        assert not mesh.experts.named() and mesh.experts.built(2) is None


def test_an_mpu_view_names_ranks_as_the_mesh_does(monkeypatch):
    """``mesh_of(mpu)``'s view answers ``get_rank()`` / ``get_local_rank(dim)`` as a mesh does."""
    from mesh_core import renamed
    from mesh_core.runtime_hooks import MpuMesh

    class Mpu:
        @staticmethod
        def get_data_parallel_rank() -> int:
            return 3

    monkeypatch.setattr(renamed, "_warned", set())
    with fake_world(6, 8):
        view = MpuMesh(Mpu())
        assert view.get_rank() == 6 and view.get_local_rank("dp") == 3 and view.get_local_rank("pp") == 0
        with pytest.warns(renamed.MeshAPIDeprecationWarning):
            assert view.get_rank("dp") == 3
