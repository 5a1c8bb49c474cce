"""Run a transfer plan as flat byte buckets: one message per bucket of each (sender, receiver) pair.

:func:`schedule` is pure (the same on every rank): the remote pieces of each pair, split into boxes
that fit ``bucket_bytes`` and packed in plan order into buckets of at most ``bucket_bytes`` (a box
of 256 KiB or a quarter bucket or more travels alone, unless ``pack_strided`` and it is strided
on both sides; the small boxes on either side of it share buckets all the same); the buckets of
all pairs are ordered round by round (each pair's first bucket, then the second, ...), and a
bucket's index in that order is its message tag. A lone box contiguous on a side is sent from /
received into the tensor itself there.

:func:`execute` posts and waits this rank's buckets in that global order, in rounds: each round's
messages are posted as one ``torch.distributed.batch_isend_irecv`` (on NCCL one group of the
world's communicator: no communicator is created per peer, none while messages are in flight), with
at most ``buffer_bytes`` of buckets needing a buffer in flight (at least one round; ``window`` full
buckets by default) and ``MAX_IN_FLIGHT`` messages in all: every rank posts a prefix of its
buckets and waits on its oldest round, so the oldest unfinished bucket of the whole transfer is
posted on both ends and completes (no deadlock). The next round is packed while the previous ones
travel; each received bucket is copied once into its destinations.
"""

from __future__ import annotations

import functools
import math
from collections import deque
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import torch
import torch.distributed as dist

from .. import torch_compat
from ._devices import tensor_device

Box = tuple[tuple[int, int], ...]
ALIGN = 16  # byte offset of each piece in a bucket (any dtype's view of it is aligned)
DEFAULT_BUCKET_BYTES = 16 << 20
# buffers in flight per rank: at most DEFAULT_WINDOW x bucket_bytes bytes (64 MiB by default); with 2,
# a receiver of strided pieces (received into buffers, then placed) was ~10% slower from 256 MB on
DEFAULT_WINDOW = 4
MAX_IN_FLIGHT = 64  # messages in flight per rank
# a box of at least min(ALONE_BYTES, bucket_bytes / 4) travels alone: when it is contiguous on a
# side, that side sends from / receives into the tensor itself (no packing copy); packing pays off
# for the many small tensors (biases, norms), whose messages would cost more than their bytes
ALONE_BYTES = 256 << 10


@dataclass(frozen=True)
class Item:
    """A box of one parameter inside a bucket (``box`` in full-tensor coordinates)."""

    name: str
    box: Box
    src_box: Box
    dst_box: Box
    offset: int
    nbytes: int

    @functools.cached_property
    def src_index(self) -> tuple[slice, ...]:
        """The box inside the sender's shard."""
        return local_index(self.box, self.src_box)

    @functools.cached_property
    def dst_index(self) -> tuple[slice, ...]:
        """The box inside the receiver's shard."""
        return local_index(self.box, self.dst_box)

    @functools.cached_property
    def shape(self) -> list[int]:
        return [hi - lo for lo, hi in self.box]


@dataclass(frozen=True)
class Bucket:
    src: int
    dst: int
    tag: int
    items: tuple[Item, ...]
    nbytes: int


def box_numel(box: Box) -> int:
    return math.prod(hi - lo for lo, hi in box)


def local_index(box: Box, shard: Box) -> tuple[slice, ...]:
    return tuple(slice(lo - slo, hi - slo) for (lo, hi), (slo, _) in zip(box, shard))


def split_box(box: Box, itemsize: int, limit: int) -> list[Box]:
    """``box`` cut along its outer dims into boxes of at most ``limit`` bytes (a single element may exceed it)."""
    if box_numel(box) * itemsize <= limit or not box:
        return [box]
    (lo, hi), rest = box[0], box[1:]
    row = box_numel(rest) * itemsize
    if row > limit:
        return [((i, i + 1),) + sub for i in range(lo, hi) for sub in split_box(rest, itemsize, limit)]
    step = max(1, limit // row)
    return [((i, min(i + step, hi)),) + rest for i in range(lo, hi, step)]


def schedule(
    pieces: Sequence, itemsize: Callable[[str, int], int], bucket_bytes: int, *, pack_strided: bool = False
) -> list[Bucket]:
    """The buckets of every remote piece; ``itemsize(name, src)`` is the travelling element size.

    A pair's small boxes are packed in plan order, past the boxes that travel alone between them.

    ``pack_strided``: a big box that is contiguous neither in its source nor in its destination shard
    is packed with its pair's other boxes instead of travelling alone: it is copied on both sides
    either way, and fewer messages go out. (A box contiguous on one side travels alone: that side
    sends it from / receives it into the tensor itself.)"""
    per_pair: dict[tuple[int, int], list[list[Item]]] = {}
    packing: dict[tuple[int, int], list[Item]] = {}  # the bucket the pair's next small box joins
    for p in pieces:
        if p.src == p.dst:
            continue
        size = itemsize(p.name, p.src)
        pair = (p.src, p.dst)
        buckets = per_pair.setdefault(pair, [])
        for box in split_box(p.box, size, bucket_bytes):
            nbytes = box_numel(box) * size
            alone = nbytes >= _alone_bytes(bucket_bytes) and not (
                pack_strided and not (is_contiguous_in(box, p.src_box) or is_contiguous_in(box, p.dst_box))
            )
            if alone:
                buckets.append([Item(p.name, box, p.src_box, p.dst_box, 0, nbytes)])
                continue
            current = packing.get(pair)
            if current is None or (current and _end(current) + nbytes > bucket_bytes):
                current = packing[pair] = []
                buckets.append(current)
            current.append(Item(p.name, box, p.src_box, p.dst_box, _end(current), nbytes))
    out: list[Bucket] = []
    rounds = max((len(b) for b in per_pair.values()), default=0)
    for r in range(rounds):
        for (src, dst), buckets in sorted(per_pair.items()):
            if r < len(buckets):
                out.append(Bucket(src, dst, len(out), tuple(buckets[r]), _end(buckets[r])))
    return out


def is_contiguous_in(box: Box, shard: Box) -> bool:
    """Whether ``box`` is one contiguous range of a row-major tensor holding ``shard``."""
    extents = [(hi - lo, shi - slo) for (lo, hi), (slo, shi) in zip(box, shard)]
    first = next((i for i, (extent, _) in enumerate(extents) if extent > 1), len(extents))
    return all(extent == whole for extent, whole in extents[first + 1 :])


def _alone_bytes(bucket_bytes: int) -> int:
    return max(1, min(ALONE_BYTES, bucket_bytes // 4))


def _end(items: Sequence[Item]) -> int:
    if not items:
        return 0
    last = items[-1]
    return -(-(last.offset + last.nbytes) // ALIGN) * ALIGN


class BufferPool:
    """Byte buffers kept between calls (a fresh buffer's first touch costs more than the copy into it)."""

    def __init__(self) -> None:
        self._free: list[torch.Tensor] = []
        self._pinned: set[int] = set()  # the page-locked buffers this pool made, by data pointer

    def take(self, nbytes: int, device: torch.device, pinned: bool = False) -> torch.Tensor:
        """A buffer of ``nbytes`` on ``device`` (``pinned``: page-locked host memory, for copies to and
        from a CUDA device)."""
        for i, buffer in enumerate(self._free):
            if buffer.numel() >= nbytes and buffer.device == device and (buffer.data_ptr() in self._pinned) == pinned:
                return self._free.pop(i)[:nbytes]
        if self._free:  # none is big enough: replace one, so the pool never holds more than are in flight
            self._pinned.discard(self._free.pop(0).data_ptr())
        buffer = torch.empty(nbytes, dtype=torch.uint8, device=device, pin_memory=pinned)
        if pinned:
            self._pinned.add(buffer.data_ptr())
        return buffer

    def give(self, buffer: torch.Tensor) -> None:
        base = buffer if buffer._base is None else buffer._base
        self._free.append(base)

    @property
    def nbytes(self) -> int:
        return sum(b.numel() for b in self._free)


@dataclass
class Run:
    """What :func:`execute` did on this rank."""

    sent_bytes: int = 0
    received_bytes: int = 0
    messages: int = 0
    peak_buffer_bytes: int = 0  # the most bytes of bucket buffers alive at once (zero-copy buckets: none)


def execute(
    buckets: Sequence[Bucket],
    source: Callable[[str], torch.Tensor],
    target: Callable[[str], torch.Tensor],
    wire_dtype: Callable[[str, int], torch.dtype],
    local: Callable[[], None],
    *,
    buffer_bytes: int,
    pool: Optional[BufferPool] = None,
    rank: Optional[int] = None,
    post: Optional[Callable[[list[tuple[bool, torch.Tensor, int, int]]], list]] = None,
    views: Optional[dict] = None,
    post_each: bool = False,
    wire_device: Optional[torch.device] = None,
) -> Run:
    """Send and receive this rank's buckets in rounds; ``local()`` runs once the first round is in flight.

    A round is the next buckets in the global order whose buffers (from ``pool``, given back after)
    fit half of ``buffer_bytes`` (at least one bucket) and at most ``MAX_IN_FLIGHT / 2`` messages,
    packed, then posted as one ``batch_isend_irecv``. The next round is posted before this rank waits
    on the oldest, while the buffers of the rounds in flight fit ``buffer_bytes`` (one round always
    may): every rank posts a prefix of its buckets and waits on its oldest round, so the oldest
    unfinished bucket of the whole transfer is posted on both ends and completes (no deadlock).
    Buckets sent from / received into the tensors themselves only count as messages. ``rank`` and
    ``post`` (``[(is_send, tensor, peer, tag)]`` -> works) run it on another channel than the
    default group (default: this rank of the world, one ``batch_isend_irecv`` per round). ``views``:
    a dict kept by a caller that runs the same buckets on the same tensors again: each bucket's
    regions of the tensors are sliced once, at the first run, and reused. ``post_each``: ``post`` takes
    messages one at a time (a channel that needs no grouping): within a round, what needs no packing is
    posted first, then each packed bucket as soon as it is packed, so the wire starts at once.
    ``wire_device``: the one device the channel moves messages from and into (gloo's: the host); a
    region on another device (a GPU) is staged through a buffer there, page-locked when the region is
    on a CUDA device (default: every message travels from / into its regions' own device)."""
    rank = dist.get_rank() if rank is None else rank
    post = _batch_on_world if post is None else post
    pool = pool if pool is not None else BufferPool()
    mine = deque(b for b in buckets if rank in (b.src, b.dst))
    run = Run()
    rounds: deque = deque()  # (posted [(bucket, buffer, owned)], works)
    alive = 0
    messages = 0
    round_bytes = max(1, buffer_bytes // 2)
    round_messages = max(1, MAX_IN_FLIGHT // 2)
    known: dict = views if views is not None else {}  # tag -> (this rank's regions of the bucket's items, direct)

    def regions(bucket: Bucket) -> tuple[list[torch.Tensor], Optional[torch.Tensor]]:
        found = known.get(bucket.tag)
        if found is None:
            sending = bucket.src == rank
            tensor_of = source if sending else target
            parts = [tensor_of(i.name)[i.src_index if sending else i.dst_index] for i in bucket.items]
            found = known[bucket.tag] = (parts, _direct(bucket, parts, wire_dtype, wire_device))
        return found

    def direct(bucket: Bucket) -> Optional[torch.Tensor]:
        return regions(bucket)[1]

    def next_round() -> list[Bucket]:
        chosen: list[Bucket] = []
        nbytes = 0
        for bucket in mine:
            if len(chosen) >= round_messages:
                break
            if direct(bucket) is None:
                if nbytes and nbytes + bucket.nbytes > round_bytes:
                    break
                nbytes += bucket.nbytes
            chosen.append(bucket)
        return chosen

    def post_rounds() -> None:
        nonlocal alive, messages
        while mine:
            chosen = next_round()
            need = sum(b.nbytes for b in chosen if direct(b) is None)
            if rounds and (alive + need > buffer_bytes or messages + len(chosen) > MAX_IN_FLIGHT):
                return
            for _ in chosen:
                mine.popleft()
            if post_each:  # what needs no packing goes out first; each packed bucket as soon as it is packed
                chosen = sorted(chosen, key=lambda b: b.src == rank and direct(b) is None)
            posted, ops, works = [], [], []
            for bucket in chosen:
                if bucket.src == rank:
                    if post_each and ops and direct(bucket) is None:
                        works += post(ops)
                        ops = []
                    buffer, owned = _pack(bucket, regions(bucket), wire_dtype, pool, wire_device)
                    ops.append((True, buffer, bucket.dst, bucket.tag))
                    run.sent_bytes += bucket.nbytes
                else:
                    buffer, owned = _landing(bucket, regions(bucket), pool, wire_device)
                    ops.append((False, buffer, bucket.src, bucket.tag))
                    run.received_bytes += bucket.nbytes
                alive += buffer.numel() if owned else 0
                posted.append((bucket, buffer, owned))
            works += post(ops)
            messages += len(posted)
            run.messages += len(posted)
            run.peak_buffer_bytes = max(run.peak_buffer_bytes, alive)
            rounds.append((posted, works))

    post_rounds()
    local()
    while rounds:
        posted, works = rounds.popleft()
        for work in works:
            work.wait()
        messages -= len(posted)
        for bucket, buffer, owned in posted:
            if bucket.dst == rank and owned:
                _unpack(bucket, buffer, regions(bucket)[0], wire_dtype)
            if owned:
                alive -= buffer.numel()
                pool.give(buffer)
        del posted, works
        post_rounds()
    return run


def _batch_on_world(ops: list[tuple[bool, torch.Tensor, int, int]]) -> list:
    return dist.batch_isend_irecv(
        [dist.P2POp(dist.isend if send else dist.irecv, tensor, peer, tag=tag) for send, tensor, peer, tag in ops]
    )


def _direct(
    bucket: Bucket, regions: list[torch.Tensor], wire_dtype, wire_device: Optional[torch.device]
) -> Optional[torch.Tensor]:
    """The bytes of a lone item's region when it can travel from / land in the tensor itself."""
    if len(regions) != 1:
        return None
    region = regions[0]
    if wire_device is not None and tensor_device(region) != wire_device:
        return None  # staged
    if region.dtype == wire_dtype(bucket.items[0].name, bucket.src) and region.is_contiguous():
        return region.reshape(-1).view(torch.uint8)
    return None


def _buffer(
    bucket: Bucket, parts: list[torch.Tensor], pool: BufferPool, wire_device: Optional[torch.device]
) -> torch.Tensor:
    if wire_device is None:
        return pool.take(bucket.nbytes, parts[0].device)
    staged_from_cuda = any(p.device.type == "cuda" for p in parts) and torch.cuda.is_available()
    return pool.take(bucket.nbytes, wire_device, pinned=staged_from_cuda and wire_device.type == "cpu")


def _slots(buffer: torch.Tensor, bucket: Bucket, wire_dtype) -> list[torch.Tensor]:
    """Each item's place in a bucket, as a tensor of its box's shape in the travelling dtype."""
    return [
        buffer[item.offset : item.offset + item.nbytes].view(wire_dtype(item.name, bucket.src)).view(item.shape)
        for item in bucket.items
    ]


def _pack(
    bucket: Bucket,
    regions: tuple[list[torch.Tensor], Optional[torch.Tensor]],
    wire_dtype,
    pool: BufferPool,
    wire_device: Optional[torch.device] = None,
) -> tuple[torch.Tensor, bool]:
    parts, direct = regions
    if direct is not None:
        return direct, False
    buffer = _buffer(bucket, parts, pool, wire_device)
    with torch.no_grad():
        torch_compat.foreach_copy_(_slots(buffer, bucket, wire_dtype), parts)
    return buffer, True


def _landing(
    bucket: Bucket,
    regions: tuple[list[torch.Tensor], Optional[torch.Tensor]],
    pool: BufferPool,
    wire_device: Optional[torch.device] = None,
) -> tuple[torch.Tensor, bool]:
    parts, direct = regions
    if direct is not None:
        return direct, False
    return _buffer(bucket, parts, pool, wire_device), True


def _unpack(bucket: Bucket, buffer: torch.Tensor, parts: list[torch.Tensor], wire_dtype) -> None:
    with torch.no_grad():
        torch_compat.foreach_copy_(parts, _slots(buffer, bucket, wire_dtype))


def local_copies(
    pieces: Sequence, source: Callable[[str], torch.Tensor], target: Callable[[str], torch.Tensor], rank: int
) -> int:
    """Copy the pieces this rank both holds and needs; the number of elements copied."""
    mine = [Item(p.name, p.box, p.src_box, p.dst_box, 0, 0) for p in pieces if p.src == p.dst == rank]
    if mine:
        with torch.no_grad():
            torch_compat.foreach_copy_(
                [target(i.name)[i.dst_index] for i in mine], [source(i.name)[i.src_index] for i in mine]
            )
    return sum(box_numel(i.box) for i in mine)
