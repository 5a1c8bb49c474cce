"""Property tests of the pure layout math (no torch.distributed)."""

from __future__ import annotations

import itertools
import math
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mesh_core import MeshLayout, MeshSpec, MeshSpecError

pytestmark = pytest.mark.torch_releases

SIZES = [1, 2, 3, 4, 8]


@st.composite
def specs(draw, max_ranks: int = 4096, sub_world: bool = True):
    """Random valid specs: random dims, sizes, order, optional HSDP, ep and sub-world ranks."""
    hsdp = draw(st.booleans())
    names = ["pp", "sp", "tp"] + (["dp_replicate", "dp_shard"] if hsdp else ["dp"])
    sizes = {}
    for name in names:
        sizes[name] = draw(st.sampled_from(SIZES))
        if math.prod(sizes.values()) > max_ranks:
            sizes[name] = 1
    n = math.prod(sizes.values())
    order = draw(st.permutations(names))
    world = n
    ranks = None
    if sub_world and draw(st.booleans()):
        world = n + draw(st.integers(0, 64))
        rng = random.Random(draw(st.integers(0, 2**32)))
        ranks = rng.sample(range(world), n)
    data = [n_ for n_ in order if n_ in ("dp", "dp_replicate", "dp_shard", "sp")]
    data_size = math.prod(sizes[d] for d in data)
    ep = draw(st.sampled_from([d for d in range(1, data_size + 1) if data_size % d == 0]))
    # one dim is sometimes inferred rather than given
    given_sizes = dict(sizes)
    if draw(st.booleans()):
        given_sizes[draw(st.sampled_from(names))] = "auto"
    spec = MeshSpec.build(world, order=order, ranks=ranks, ep=ep, data_before_expert=draw(st.booleans()), **given_sizes)
    return spec


def dim_sets(spec: MeshSpec):
    singles = [(n,) for n in spec.names]
    pairs = list(itertools.combinations(spec.names, 2))
    return singles + pairs + [tuple(spec.names)]


def assert_partition(groups, ranks):
    flat = [r for g in groups for r in g]
    assert sorted(flat) == sorted(ranks)
    assert len({len(g) for g in groups}) == 1


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(specs())
def test_groups_partition_and_sizes_multiply(spec):
    layout = MeshLayout(spec)
    assert math.prod(spec.sizes) == spec.size == len(spec.ranks)
    for dims in dim_sets(spec) + [("ep",), ("edp",)]:
        groups = layout.groups(dims)
        assert_partition(groups, spec.ranks)
        size = math.prod(spec.dim_size(d) for d in dims) if dims[0] not in ("ep", "edp") else spec.dim_size(dims[0])
        assert len(groups[0]) == size
    assert spec.dim_size("ep") * spec.dim_size("edp") == spec.data_size


@settings(max_examples=150, deadline=None)
@given(specs(), st.randoms(use_true_random=False))
def test_coordinates_round_trip_and_group_queries_agree(spec, rnd):
    layout = MeshLayout(spec)
    sample = rnd.sample(spec.ranks, min(16, spec.size))
    for rank in sample:
        coord = layout.coordinate(rank)
        assert layout.rank_at(**coord) == rank
        assert all(0 <= coord[n] < s for n, s in zip(spec.names, spec.sizes))
        for dims in dim_sets(spec) + [("ep",), ("edp",)]:
            mine = layout.group_ranks(dims, rank)
            assert rank in mine
            assert mine in layout.groups(dims)
            assert mine[layout.coordinate_of(rank, dims)] == rank


@settings(max_examples=80, deadline=None)
@given(specs(max_ranks=256))
def test_groups_match_brute_force_definition(spec):
    """A group along D = the ranks whose coordinates agree with r's on every dim outside D."""
    layout = MeshLayout(spec)
    coords = {r: layout.coordinate(r) for r in spec.ranks}
    for dims in dim_sets(spec):
        outside = [n for n in spec.names if n not in dims]
        for rank in spec.ranks[:: max(1, spec.size // 8)]:
            expected = {s for s in spec.ranks if all(coords[s][k] == coords[rank][k] for k in outside)}
            assert set(layout.group_ranks(dims, rank)) == expected


@settings(max_examples=100, deadline=None)
@given(specs())
def test_flattened_groups_are_unions_of_component_groups(spec):
    layout = MeshLayout(spec)
    for a, b in itertools.combinations(spec.names, 2):
        for group in layout.groups((a, b))[:4]:
            union = {r for m in layout.group_ranks(b, group[0]) for r in layout.group_ranks(a, m)}
            assert set(group) == union


@settings(max_examples=100, deadline=None)
@given(specs())
def test_expert_groups_split_each_data_group(spec):
    layout = MeshLayout(spec)
    data_dims = spec.expert_data_dims
    for rank in spec.ranks[:: max(1, spec.size // 8)]:
        data = set(layout.group_ranks(data_dims, rank)) if data_dims else {rank}
        ep, edp = layout.group_ranks("ep", rank), layout.group_ranks("edp", rank)
        assert set(ep) <= data and set(edp) <= data
        assert set(ep) & set(edp) == {rank}
        assert len(ep) * len(edp) == len(data)


def test_expert_orders_match_deepspeed_worked_examples():
    # legacy_api.md §2.4, W=16, ep=2 and ep=4, both orders (checked against deepspeed in compat tests)
    ed = MeshLayout(MeshSpec.build(16, ep=2))
    assert ed.groups("ep") == [[2 * k, 2 * k + 1] for k in range(8)]
    assert ed.groups("edp") == [list(range(0, 16, 2)), list(range(1, 16, 2))]
    de = MeshLayout(MeshSpec.build(16, ep=4, data_before_expert=True))
    assert de.groups("ep") == [[i, i + 4, i + 8, i + 12] for i in range(4)]
    assert de.groups("edp") == [list(range(4 * k, 4 * k + 4)) for k in range(4)]


def test_pipeline_p2p_pairs_wrap_around():
    layout = MeshLayout(MeshSpec.build(6, pp=3))
    assert layout.p2p_pairs() == [[0, 2], [1, 3], [2, 4], [3, 5], [4, 0], [5, 1]]
    assert MeshLayout(MeshSpec.build(4)).p2p_pairs() == [[r, r] for r in range(4)]


def test_grid_order_matches_deepspeed_topology():
    # PipeModelDataParallelTopology(pp=2, mp=2, dp=2): rank = pipe*4 + data*2 + model
    layout = MeshLayout(MeshSpec.build(8, pp=2, dp=2, tp=2))
    for rank in range(8):
        assert layout.coordinate(rank) == {"pp": rank // 4, "dp": (rank // 2) % 2, "tp": rank % 2}


def test_sub_world_layout_uses_the_given_ranks():
    layout = MeshLayout(MeshSpec.build(16, ranks=range(8, 16), tp=2))
    assert layout.groups("tp") == [[8, 9], [10, 11], [12, 13], [14, 15]]
    assert layout.groups("dp") == [[8, 10, 12, 14], [9, 11, 13, 15]]
    with pytest.raises(MeshSpecError, match="rank 3 is not part"):
        layout.coordinate(3)


def test_hsdp_dp_is_the_flattened_pair():
    layout = MeshLayout(MeshSpec.build(16, dp_replicate=2, dp_shard=4, tp=2))
    assert layout.groups("dp") == layout.groups(("dp_replicate", "dp_shard"))
    assert layout.spec.dim_size("dp") == 8


def test_per_rank_queries_do_not_scale_with_world_size():
    """Per-rank queries never enumerate the world: they work on a 2**27-rank spec instantly."""
    spec = MeshSpec.build(2**27, pp=16, tp=8, sp=4)
    layout = MeshLayout(spec)
    rank = 2**27 - 3
    assert layout.rank_at(**layout.coordinate(rank)) == rank
    assert len(layout.group_ranks("tp", rank)) == 8
    assert layout.stage_peer(rank, 1) == rank - 15 * (2**27 // 16)
