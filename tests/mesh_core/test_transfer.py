"""mesh_core.transfer: the plan moves every element exactly where the destination layout needs it
(simulated in one process, no torch.distributed); the gloo run is the RL example's test."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mesh_core import MeshSpec, MeshSpecError
from mesh_core.transfer import ParamLayout, plan_transfer

pytestmark = pytest.mark.torch_releases

WORLD = 8


@st.composite
def specs(draw):
    n = draw(st.sampled_from([1, 2, 4, 8]))
    start = draw(st.integers(0, WORLD - n))
    ranks = list(range(start, start + n))
    if draw(st.booleans()):
        ranks = draw(st.permutations(list(range(WORLD))))[:n]
    sizes, left = {}, n
    for dim in draw(st.permutations(["tp", "pp", "dp"])):
        size = draw(st.sampled_from([d for d in (1, 2, 4) if left % d == 0]))
        sizes[dim], left = size, left // size
    sizes["dp"] *= left
    order = draw(st.permutations(["pp", "dp", "tp"]))
    return MeshSpec.build(WORLD, ranks=ranks, order=order, **sizes)


def layout_for(spec, shape, shard_dim, stage):
    if spec.dim_size("pp") == 1:
        stage = None
    elif stage is not None:
        stage %= spec.dim_size("pp")
    return ParamLayout(shape, shard_dim=shard_dim, stage=stage)


def simulate(src, dst, full, src_layouts, dst_layouts):
    """Run a plan by hand: each rank's shard tensors, then every piece copied sender → receiver."""
    from mesh_core.transfer._in_job import _holders, _local

    shards = {}
    for name, tensor in full.items():
        for rank, box in _holders(src, src_layouts[name], name, "source"):
            shards[("src", rank, name)] = tensor[tuple(slice(lo, hi) for lo, hi in box)].clone()
        for rank, box in _holders(dst, dst_layouts[name], name, "destination"):
            shards[("dst", rank, name)] = torch.full([hi - lo for lo, hi in box], float("nan"))
    pieces = plan_transfer(src, dst, src_layouts, dst_layouts)
    for p in pieces:
        data = shards[("src", p.src, p.name)][_local(p.box, p.src_box)]
        target = shards[("dst", p.dst, p.name)][_local(p.box, p.dst_box)]
        assert torch.isnan(target).all(), "an element is written twice"
        target.copy_(data)
    return shards, pieces


@settings(max_examples=60, deadline=None)
@given(
    src=specs(),
    dst=specs(),
    shard=st.sampled_from([(None, None), (0, None), (1, None), (0, 1), (1, 0)]),
    stages=st.tuples(st.none() | st.integers(0, 3), st.none() | st.integers(0, 3)),
)
def test_plan_delivers_every_element_bit_for_bit(src, dst, shard, stages):
    shape = (8, 4)
    src_layouts = {"w": layout_for(src, shape, shard[0], stages[0]), "b": layout_for(src, (8,), None, stages[0])}
    dst_layouts = {"w": layout_for(dst, shape, shard[1], stages[1]), "b": layout_for(dst, (8,), None, stages[1])}
    full = {"w": torch.randn(shape), "b": torch.randn(8)}
    shards, pieces = simulate(src, dst, full, src_layouts, dst_layouts)
    from mesh_core.transfer._in_job import _holders

    for name, tensor in full.items():
        for rank, box in _holders(dst, dst_layouts[name], name, "destination"):
            assert torch.equal(shards[("dst", rank, name)], tensor[tuple(slice(lo, hi) for lo, hi in box)])
    for p in pieces:  # a rank that holds what it needs copies locally
        holds = {r for r, box in _holders(src, src_layouts[p.name], p.name, "source") if box == p.src_box}
        assert (p.src == p.dst) == (p.dst in holds)


def test_actor_tp2_to_rollout_dp2_plan():
    actor = MeshSpec.build(4, tp=2, ranks=[0, 1])
    rollout = MeshSpec.build(4, dp=2, ranks=[2, 3])
    src = {"up": ParamLayout((8, 4), shard_dim=0), "down": ParamLayout((4, 8), shard_dim=1)}
    dst = {name: ParamLayout(layout.shape) for name, layout in src.items()}
    pieces = plan_transfer(actor, rollout, src, dst)
    assert {(p.name, p.src, p.dst, p.box) for p in pieces} == {
        ("up", 0, 2, ((0, 4), (0, 4))),
        ("up", 1, 2, ((4, 8), (0, 4))),
        ("up", 0, 3, ((0, 4), (0, 4))),
        ("up", 1, 3, ((4, 8), (0, 4))),
        ("down", 0, 2, ((0, 4), (0, 4))),
        ("down", 1, 2, ((0, 4), (4, 8))),
        ("down", 0, 3, ((0, 4), (0, 4))),
        ("down", 1, 3, ((0, 4), (4, 8))),
    }


def test_replicas_share_the_sending():
    src = MeshSpec.build(8, dp=2, tp=2, ranks=range(4))  # tp shards held by 2 replicas each
    dst = MeshSpec.build(8, dp=4, ranks=range(4, 8))
    pieces = plan_transfer(src, dst, {"w": ParamLayout((4,), shard_dim=0)}, {"w": ParamLayout((4,))})
    senders = sorted(p.src for p in pieces)
    assert senders == [0, 0, 1, 1, 2, 2, 3, 3]


def test_bad_layouts_raise_before_anything():
    a, b = MeshSpec.build(4, tp=2, ranks=[0, 1]), MeshSpec.build(4, dp=2, ranks=[2, 3])
    with pytest.raises(MeshSpecError, match="does not split evenly over tp=2"):
        plan_transfer(a, b, {"w": ParamLayout((3,), shard_dim=0)}, {"w": ParamLayout((3,))})
    with pytest.raises(MeshSpecError, match=r"shape \(4,\) at the source but \(5,\)"):
        plan_transfer(a, b, {"w": ParamLayout((4,))}, {"w": ParamLayout((5,))})
    with pytest.raises(MeshSpecError, match=r"only on one side: \['v', 'w'\]"):
        plan_transfer(a, b, {"w": ParamLayout((4,))}, {"v": ParamLayout((4,))})
    with pytest.raises(MeshSpecError, match="shard_dim=2 is out of range"):
        ParamLayout((4, 4), shard_dim=2)


# --- buckets and the dtype policy (pure) -------------------------------------------------------


@settings(max_examples=25, deadline=None)
@given(
    src=specs(),
    dst=specs(),
    shard=st.sampled_from([(None, None), (0, None), (1, None), (0, 1)]),
    bucket=st.sampled_from([4, 24, 64, 200, 1 << 20]),
    itemsize=st.sampled_from([1, 2, 4, 8]),
)
def test_buckets_cover_every_remote_element_once_within_the_bound(src, dst, shard, bucket, itemsize):
    from mesh_core.transfer._buckets import box_numel, schedule

    src_l = {"w": layout_for(src, (8, 4), shard[0], None), "b": layout_for(src, (8,), None, None)}
    dst_l = {"w": layout_for(dst, (8, 4), shard[1], None), "b": layout_for(dst, (8,), None, None)}
    pieces = plan_transfer(src, dst, src_l, dst_l)
    buckets = schedule(pieces, lambda name, rank: itemsize, bucket)
    assert [b.tag for b in buckets] == list(range(len(buckets)))
    covered = {}
    for b in buckets:
        assert b.nbytes <= max(bucket, itemsize) + 15 or len(b.items) == 1  # one element may exceed a tiny bucket
        ends = [(i.offset, i.offset + i.nbytes) for i in b.items]
        assert all(lo % 16 == 0 for lo, _ in ends) and all(a[1] <= c[0] for a, c in zip(ends, ends[1:]))
        for item in b.items:
            assert item.nbytes == box_numel(item.box) * itemsize
            for cell in _cells(item.box):
                key = (b.src, b.dst, item.name, cell)
                assert key not in covered, "an element travels twice"
                covered[key] = True
    expected = {(p.src, p.dst, p.name, cell) for p in pieces if p.src != p.dst for cell in _cells(p.box)}
    assert set(covered) == expected


def _cells(box):
    import itertools

    return itertools.product(*(range(lo, hi) for lo, hi in box))


def test_split_box_cuts_outer_dims_first():
    from mesh_core.transfer._buckets import split_box

    assert split_box(((0, 4), (0, 8)), 4, 64) == [((0, 2), (0, 8)), ((2, 4), (0, 8))]
    assert split_box(((0, 2), (0, 8)), 4, 16) == [
        ((0, 1), (0, 4)),
        ((0, 1), (4, 8)),
        ((1, 2), (0, 4)),
        ((1, 2), (4, 8)),
    ]
    assert split_box(((0, 3),), 8, 4) == [((0, 1),), ((1, 2),), ((2, 3),)]  # an element larger than the bound


def test_large_boxes_travel_alone_small_ones_share():
    from mesh_core.transfer._buckets import schedule

    a, b = MeshSpec.build(4, tp=2, ranks=[0, 1]), MeshSpec.build(4, dp=2, ranks=[2, 3])
    # a big box between two small ones (a norm after each block's weights) does not part them
    layouts = {"a_small": ParamLayout((4,)), "b_big": ParamLayout((64, 4)), "c_small": ParamLayout((4,))}
    pieces = plan_transfer(a, b, layouts, layouts)
    assert [p.name for p in pieces if p.dst == 2] == ["a_small", "b_big", "c_small"]  # plan order
    buckets = schedule(pieces, lambda n, r: 4, 1024)
    to_2 = [sorted(i.name for i in bk.items) for bk in buckets if bk.dst == 2]
    assert sorted(to_2) == [["a_small", "c_small"], ["b_big"]]


@pytest.mark.parametrize(
    "wire,target,ok",
    [
        (torch.bfloat16, torch.float16, True),
        (torch.float32, torch.float64, True),
        (torch.float32, torch.float16, True),
        (torch.float32, torch.float32, True),
        (torch.int64, torch.int64, True),
        (torch.complex64, torch.complex128, True),
        (torch.float32, torch.int32, False),
        (torch.int32, torch.float32, False),
        (torch.int32, torch.int64, False),
        (torch.bool, torch.uint8, False),
        (torch.complex64, torch.float32, False),
    ],
)
def test_dtype_policy_converts_float_to_float_only(wire, target, ok):
    from mesh_core.transfer._agree import conversion_refused

    assert (conversion_refused(wire, target) is None) == ok


def test_disagreeing_records_name_the_field_values_and_ranks():
    from mesh_core.transfer._agree import merge

    base = {
        "meshes": ["A", "B"],
        "layouts": {"source": {"w": [[4], None, ["tp"], None, None]}, "destination": None},
        "dtypes": {"source": {}, "destination": None},
        "problems": [],
        "flags": {},
    }
    other = {
        **base,
        "layouts": {
            "source": {"w": [[4], 0, ["tp"], None, None]},
            "destination": {"w": [[4], None, ["tp"], None, None]},
        },
    }
    with pytest.raises(
        MeshSpecError,
        match=r"source parameter 'w': shape \(4,\) on ranks 0..1; shape \(4,\) split on "
        r"dim 0 over tp on rank 2",
    ):
        merge([0, 1, 2], [base, base, other])
    with pytest.raises(MeshSpecError, match=r"rank 1: boom"):
        merge([0, 1], [base, {**base, "problems": ["boom"]}])
