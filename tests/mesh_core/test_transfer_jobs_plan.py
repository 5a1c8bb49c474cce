"""mesh_core.transfer._jobs_plan (pure): ZeRO-3 partitions as contiguous boxes, the plan delivering
every receiver element exactly once, replicas sharing the sending, and the verdict's refusals."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mesh_core import MeshSpecError
from mesh_core.transfer._buckets import is_contiguous_in, schedule
from mesh_core.transfer._jobs_plan import flat_boxes, name_of, plan_sync, receiver_param, record, sender_param, verdict

pytestmark = pytest.mark.torch_releases


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 5), min_size=0, max_size=4), st.data())
def test_a_flat_range_is_cut_into_contiguous_boxes_covering_it_once(shape, data):
    numel = math.prod(shape)
    start = data.draw(st.integers(0, numel))
    stop = data.draw(st.integers(start, numel + 3))
    full = torch.arange(numel).view(shape)
    seen = []
    for box, first in flat_boxes(shape, start, stop):
        region = full[tuple(slice(lo, hi) for lo, hi in box)]
        flat = region.reshape(-1)
        assert torch.equal(flat, torch.arange(first, first + flat.numel()))  # contiguous, starts where it says
        seen += flat.tolist()
    assert sorted(seen) == list(range(start, min(stop, numel)))
    assert len(flat_boxes(shape, start, stop)) <= max(1, 2 * len(shape) - 1)


def _zero3_records(shapes, senders):
    recs = []
    for r in range(senders):
        params = {}
        for name, shape in shapes.items():
            part = -(-math.prod(shape) // senders)
            holds = [(box, first - r * part) for box, first in flat_boxes(shape, r * part, (r + 1) * part)]
            params[name] = sender_param(shape, "float32", "cpu", holds)
        recs.append(record("sender", senders, params, [], "gloo"))
    return recs


def _tp_records(shapes, receivers, dims, dtype="float32", edit=None):
    recs = []
    for r in range(receivers):
        params = {}
        for name, shape in shapes.items():
            box = [(0, s) for s in shape]
            dim = dims.get(name)
            if dim is not None:
                step = shape[dim] // receivers
                box[dim] = (r * step, (r + 1) * step)
            params[name] = receiver_param(shape, dtype, "cpu", tuple(box))
        recs.append(record("receiver", receivers, edit(r, params) if edit else params, [], "gloo"))
    return recs


SHAPES = {"up": (18, 10), "down": (4, 18), "norm": (18,), "scalar": ()}
DIMS = {"up": 0, "down": 1}


def test_zero3_partitions_to_tp_shards_deliver_every_element_once():
    agreed = verdict(_zero3_records(SHAPES, 4) + _tp_records(SHAPES, 2, DIMS), 4)
    pieces = plan_sync(agreed, {n: 4 for n in SHAPES})
    for name, shape in SHAPES.items():
        for dst, box in agreed.targets[name]:
            got = torch.zeros([hi - lo for lo, hi in box] or [])
            for p in pieces:
                if name_of(p.name) == name and p.dst == dst:
                    assert p.src < 4
                    got[tuple(slice(lo - blo, hi - blo) for (lo, hi), (blo, _) in zip(p.box, box))] += 1
            assert torch.equal(got, torch.ones_like(got)), (name, dst)


def test_replicas_each_send_a_part_of_a_big_piece():
    shapes = {"w": (256, 256)}
    senders = [
        record(
            "sender", 4, {"w": sender_param((256, 256), "float32", "cpu", [(((0, 256), (0, 256)), None)])}, [], "gloo"
        )
        for _ in range(4)
    ]
    agreed = verdict(senders + _tp_records(shapes, 2, {"w": 0}), 4)
    pieces = plan_sync(agreed, {"w": 4})
    for dst in (4, 5):
        assert sorted(p.src for p in pieces if p.dst == dst) == [0, 1, 2, 3]


@pytest.mark.parametrize(
    "edit, words",
    [
        (
            lambda r, p: dict(p, extra=receiver_param((3,), "float32", "cpu", ((0, 3),))),
            "only the receiver has: ['extra']",
        ),
        (lambda r, p: dict(p, up=dict(p["up"], dtype="int64")), "'up': sent as float32, received into int64"),
        (
            lambda r, p: dict(p, up=dict(p["up"], shape=[10, 18])),
            "'up': shape (18, 10) on the sender, (10, 18) on the receiver",
        ),
        (
            lambda r, p: dict(p, norm=dict(p["norm"], shape=[17])) if r == 1 else p,
            "the ranks of one job disagree: receiver job: parameter 'norm': shape (18,) float32 on rank 0; shape (17,) float32 on rank 1",
        ),
    ],
)
def test_the_verdict_refuses_what_would_be_wrong(edit, words):
    with pytest.raises(MeshSpecError, match="refused before any message was sent") as err:
        verdict(_zero3_records(SHAPES, 4) + _tp_records(SHAPES, 2, DIMS, edit=edit), 4)
    assert words in str(err.value)


def test_a_shard_the_senders_do_not_hold_is_refused():
    recs = _zero3_records(SHAPES, 4)
    recs[3]["params"]["up"]["holds"] = []  # rank 3's part of 'up' is nowhere
    with pytest.raises(MeshSpecError, match="not covered by what the sender ranks hold: 'up': receiver rank 1"):
        verdict(recs + _tp_records(SHAPES, 2, DIMS), 4)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 4), min_size=0, max_size=4), st.data())
def test_is_contiguous_in_says_whether_a_box_is_one_range_of_its_shard(shape, data):
    box = []
    for size in shape:
        lo = data.draw(st.integers(0, size - 1))
        box.append((lo, data.draw(st.integers(lo + 1, size))))
    region = torch.arange(math.prod(shape)).view(shape)[tuple(slice(lo, hi) for lo, hi in box)]
    flat = region.reshape(-1)
    one_range = flat.numel() == 0 or torch.equal(flat, torch.arange(flat[0], flat[0] + flat.numel()))
    assert is_contiguous_in(tuple(box), tuple((0, s) for s in shape)) == one_range


def test_a_link_sends_a_box_contiguous_on_one_side_alone_and_packs_boxes_strided_on_both():
    shapes = {"up": (1024, 256), "down0": (512, 1024), "down1": (512, 1024)}  # boxes of 512 KiB: alone if not packed
    agreed = verdict(_zero3_records(shapes, 2) + _tp_records(shapes, 2, {"up": 0, "down0": 1, "down1": 1}), 2)
    pieces = plan_sync(agreed, {n: 4 for n in shapes})
    for pack_strided in (False, True):
        buckets = schedule(pieces, lambda key, src: 4, 16 << 20, pack_strided=pack_strided)
        items = [(b.src, b.dst, name_of(i.name), i.box) for b in buckets for i in b.items]
        assert sorted(items) == sorted((p.src, p.dst, name_of(p.name), p.box) for p in pieces)  # each box once
        # up's row blocks are contiguous on both sides; the column blocks of down* are strided in the
        # partitions but contiguous in the receivers' shards (received straight into them): all alone
        assert all(len(b.items) == 1 for b in buckets) and len(buckets) == 2 + 8
    # a box strided on both sides (a block of the middle dim inside a block of the last) is packed
    shapes = {"w": (4, 256, 256), "v": (4, 256, 256)}
    senders = [
        record(
            "sender",
            2,
            {
                n: sender_param(s, "float32", "cpu", [(((0, 4), (0, 256), (r * 128, r * 128 + 128)), None)])
                for n, s in shapes.items()
            },
            [],
            "gloo",
        )
        for r in range(2)
    ]  # split on dim 2
    agreed = verdict(senders + _tp_records(shapes, 2, {"w": 1, "v": 1}), 2)  # received split on dim 1
    pieces = plan_sync(agreed, {n: 4 for n in shapes})
    strided = [p for p in pieces if p.src != p.dst]
    assert strided and not any(
        is_contiguous_in(p.box, p.src_box) or is_contiguous_in(p.box, p.dst_box) for p in strided
    )
    packed = schedule(pieces, lambda key, src: 4, 16 << 20, pack_strided=True)
    assert {len(b.items) for b in packed} == {2} and len(packed) == 4  # w and v together, one bucket per pair
    assert all(len(b.items) == 1 for b in schedule(pieces, lambda key, src: 4, 16 << 20))
