"""The pure half of a weight sync between two jobs: what each rank holds, the verdict, the plan.

Every rank of both jobs publishes a record (:func:`sender_record` / :func:`receiver_record`); every
rank computes the same :func:`verdict` over all records (one :class:`~mesh_core.MeshSpecError`
naming the parameters, values and ranks, or the agreed parameters), then the same :func:`plan_sync`.

A sender rank describes what it holds of each parameter as boxes of the full tensor:

- a whole tensor (ZeRO-0/1/2, a plain module) or a tensor-parallel shard (AutoTP, given layouts):
  one box;
- a ZeRO-3 partition (a contiguous range of the flattened parameter, DeepSpeed's ``ds_tensor``):
  the range cut into at most ``2 * ndim - 1`` boxes, each contiguous in the partition (``offset``
  says where), so each is sent straight from the partition, with no gather.

Every box of a receiver's shard is sent by the sender ranks holding it: when several hold the same
box (replicas), the box is cut into one part per replica, each replica sending one part
(multi-sender), so no sender's link carries more than its share.
"""

from __future__ import annotations

import functools
import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence

from ..rendezvous import differing_fields, ranks_text
from ..spec import MeshSpecError
from ._agree import conversion_refused, dtype_of

Box = tuple[tuple[int, int], ...]
KEY_SEP = "\x1f"  # "name<SEP>index": one source tensor (a holding) of a parameter
SPLIT_MIN_BYTES = 64 << 10  # a piece smaller than this is not cut between replicas (its messages cost more)
MAX_LISTED = 6


@dataclass(frozen=True)
class Holding:
    """A box of a parameter that a sender rank holds; ``offset``: its start in a flat partition (ZeRO-3)."""

    rank: int
    box: Box
    offset: Optional[int]
    index: int  # this holding's number among the rank's holdings of the parameter
    address: Optional[int] = None  # where its tensor (host, contiguous) is in the rank's memory, when published


@dataclass(frozen=True)
class SyncPiece:
    """One piece to move: ``box`` of the source tensor ``key`` (a holding) from ``src`` to ``dst``."""

    name: str  # the key: parameter name and holding index (see :func:`key_of`)
    src: int
    dst: int
    box: Box
    src_box: Box
    dst_box: Box


@dataclass
class Verdict:
    """What every rank of both jobs computed alike from all records."""

    shapes: dict[str, tuple[int, ...]]
    wire: dict[str, str]  # dtype the parameter travels in
    landing: dict[str, str]  # dtype it lands in
    holdings: dict[str, list[Holding]]
    targets: dict[str, list[tuple[int, Box]]]  # receiver (bridge rank, box)
    writable: frozenset = frozenset()  # (name, receiver bridge rank): a contiguous host shard that takes reads


def key_of(name: str, index: int) -> str:
    return f"{name}{KEY_SEP}{index}"


def index_of(key: str) -> int:
    return int(key.rpartition(KEY_SEP)[2])


def name_of(key: str) -> str:
    return key.rpartition(KEY_SEP)[0]


def flat_boxes(shape: Sequence[int], start: int, stop: int) -> list[tuple[Box, int]]:
    """The flat range ``[start, stop)`` of a row-major tensor of ``shape`` as (box, first flat index)
    boxes, each contiguous in flat order."""
    return list(_flat_boxes(tuple(shape), start, stop))


@functools.lru_cache(maxsize=4096)  # a sender reads the same partitions at every sync
def _flat_boxes(shape: tuple[int, ...], start: int, stop: int) -> tuple[tuple[Box, int], ...]:
    return tuple(_cut(shape, start, stop))


def _cut(shape: tuple[int, ...], start: int, stop: int) -> list[tuple[Box, int]]:
    stop = min(stop, math.prod(shape))
    if start >= stop:
        return []
    if not shape:
        return [((), 0)]
    inner = math.prod(shape[1:])
    rest = tuple((0, s) for s in shape[1:])
    r0, c0 = divmod(start, inner)
    r1, c1 = divmod(stop, inner)
    out: list[tuple[Box, int]] = []

    def row(r: int, lo: int, hi: int) -> None:
        out.extend((((r, r + 1),) + box, r * inner + first) for box, first in _cut(shape[1:], lo, hi))

    if r0 == r1:
        row(r0, c0, c1)
        return out
    if c0:
        row(r0, c0, inner)
        r0 += 1
    if r1 > r0:
        out.append((((r0, r1),) + rest, r0 * inner))
    if c1:
        row(r1, 0, c1)
    return out


def sender_param(shape: Sequence[int], dtype: str, device: str, boxes: Sequence[tuple[Box, Optional[int]]]) -> dict:
    return {
        "shape": list(shape),
        "dtype": dtype,
        "device": device,
        "holds": [[[list(d) for d in box], offset] for box, offset in boxes],
    }


def receiver_param(shape: Sequence[int], dtype: str, device: str, box: Box, writable: bool = False) -> dict:
    """``writable``: the shard is a contiguous host tensor, which same-host reads can fill."""
    return {"shape": list(shape), "dtype": dtype, "device": device, "box": [list(d) for d in box], "writable": writable}


def record(
    side: str,
    job_size: int,
    params: Mapping[str, dict],
    problems: Sequence[str],
    backend: str,
    memory: Optional[dict] = None,
    addresses: Optional[Mapping[str, Optional[int]]] = None,
) -> dict:
    """One rank's record (JSON-able); ``memory``: its :class:`~mesh_core.transfer._memory.Endpoint`'s
    fields, when it takes part in same-host reads; ``addresses`` (a sender's): where each holding's
    tensor is in its memory, by key (see :func:`key_of`), None where it cannot be read (not a
    contiguous host tensor). The addresses are not part of what must stay equal for a cached
    agreement (a record's digest is taken without them): tensors that moved are announced on their own."""
    return {
        "side": side,
        "job": job_size,
        "params": {n: params[n] for n in sorted(params)},
        "problems": list(problems),
        "backend": backend,
        "memory": memory,
        "addresses": dict(addresses or {}),
    }


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _box_problem(box: Any, shape: Sequence[int]) -> Optional[str]:
    """Why ``box`` (from another process) is not a box inside a tensor of ``shape``, or None."""
    if not isinstance(box, list) or len(box) != len(shape):
        return f"box {box!r} is not {len(shape)} (start, stop) pairs"
    for dim, (pair, size) in enumerate(zip(box, shape)):
        if not (
            isinstance(pair, list)
            and len(pair) == 2
            and all(_is_int(v) for v in pair)
            and 0 <= pair[0] <= pair[1] <= size
        ):
            return f"box {box!r} leaves the shape {tuple(shape)} in dim {dim}"
    return None


def record_problem(rec: Any, side: str) -> Optional[str]:
    """Why a record read from the store (another process's) is not a well-formed ``side`` record, or
    None: its fields and their types, every parameter's shape, and every box inside its shape (a
    sender's holdings, a receiver's shard), a sender's offsets and addresses only for what it holds."""
    if not isinstance(rec, dict) or rec.get("side") != side:
        return f"not a {side}'s record"
    if not (
        _is_int(rec.get("job"))
        and isinstance(rec.get("params"), dict)
        and isinstance(rec.get("problems"), list)
        and all(isinstance(p, str) for p in rec["problems"])
        and isinstance(rec.get("backend"), str)
        and isinstance(rec.get("addresses", {}), dict)
    ):
        return "its fields are not of their types"
    memory = rec.get("memory")
    if memory is not None and not (
        isinstance(memory, dict)
        and isinstance(memory.get("host"), str)
        and all(_is_int(memory.get(f)) for f in ("pid", "token_address"))
        and isinstance(memory.get("token"), str)
    ):
        return "its memory endpoint is malformed"
    keys = set()
    for name, p in rec["params"].items():
        if not (
            isinstance(p, dict)
            and isinstance(p.get("shape"), list)
            and all(_is_int(d) and d >= 0 for d in p["shape"])
            and isinstance(p.get("dtype"), str)
            and isinstance(p.get("device"), str)
        ):
            return f"parameter {name!r} is malformed"
        try:
            dtype_of(p["dtype"])
        except MeshSpecError:
            return f"parameter {name!r} has dtype {p['dtype']!r}"
        if side == "receiver":
            problem = _box_problem(p.get("box"), p["shape"])
            if problem:
                return f"parameter {name!r}: {problem}"
            continue
        if not isinstance(p.get("holds"), list):
            return f"parameter {name!r} is malformed"
        for i, held in enumerate(p["holds"]):
            if not (
                isinstance(held, list) and len(held) == 2 and (held[1] is None or _is_int(held[1]) and held[1] >= 0)
            ):
                return f"parameter {name!r}: holding {i} is malformed"
            problem = _box_problem(held[0], p["shape"])
            if problem:
                return f"parameter {name!r}: {problem}"
            keys.add(key_of(name, i))
    for key, at in rec.get("addresses", {}).items():
        if key not in keys or not (at is None or _is_int(at)):
            return f"an address is announced for {key.replace(KEY_SEP, ' #')!r}, which it does not hold"
    return None


def who(bridge_rank: int, senders: int) -> str:
    """``sender rank 2`` / ``receiver rank 0``: a bridge rank named by its job and its rank there."""
    return f"sender rank {bridge_rank}" if bridge_rank < senders else f"receiver rank {bridge_rank - senders}"


def _ranks(ranks: Sequence[int], senders: int) -> str:
    s = [r for r in ranks if r < senders]
    r = [x - senders for x in ranks if x >= senders]
    parts = ([f"sender {ranks_text(s, 'rank')}"] if s else []) + ([f"receiver {ranks_text(r, 'rank')}"] if r else [])
    return " and ".join(parts)


def _box(value: Sequence) -> Box:
    return tuple((int(lo), int(hi)) for lo, hi in value)


def _volume(box: Box) -> int:
    return math.prod(hi - lo for lo, hi in box)


def _intersect(a: Box, b: Box) -> Optional[Box]:
    box = tuple((max(al, bl), min(ah, bh)) for (al, ah), (bl, bh) in zip(a, b))
    return box if all(lo < hi for lo, hi in box) else None


def _listing(head: str, items: Sequence[str]) -> str:
    more = f" | ... and {len(items) - MAX_LISTED} more" if len(items) > MAX_LISTED else ""
    return f"{head}: " + " | ".join(items[:MAX_LISTED]) + more


def verdict(records: Sequence[dict], senders: int, jobs: Optional[Sequence[int]] = None) -> Verdict:
    """The agreed parameters, or one :class:`MeshSpecError` (the same on every rank): ``records[b]``
    is bridge rank ``b``'s (senders first, then each receiving job's ranks, ``jobs`` their sizes;
    default: one receiving job). Every receiving job must hold the same parameters (names, shapes,
    dtypes); their layouts may differ."""
    head = "weight sync refused before any message was sent"
    problems = [f"{who(b, senders)}: {p}" for b, rec in enumerate(records) for p in rec["problems"]]
    if problems:
        raise MeshSpecError(_listing(head, problems))
    jobs = list(jobs) if jobs is not None else [len(records) - senders]
    sides = [("sender", 0, list(range(senders)))]
    for k, size in enumerate(jobs):
        start = senders + sum(jobs[:k])
        sides.append(("receiver" if len(jobs) == 1 else f"receiving job {k}", start, list(range(start, start + size))))

    def params_row(b: int) -> dict:
        return {f"parameter {n!r}": f"shape {tuple(p['shape'])} {p['dtype']}" for n, p in records[b]["params"].items()}

    differ: list[str] = []
    for side, start, ranks in sides:
        rows = [dict({"job size": str(records[b]["job"])}, **params_row(b)) for b in ranks]
        differ += [f"{side} job: {d}" for d in differing_fields(rows, [b - start for b in ranks], absent="<absent>")]
    if len(jobs) > 1:  # one model for every receiving job (the wire and landing dtypes are agreed once)
        firsts = [start for _, start, _ in sides[1:]]
        differ += [
            f"receiving jobs (by number): {d}"
            for d in differing_fields([params_row(b) for b in firsts], list(range(len(jobs))), absent="<absent>")
        ]
    backends = differing_fields([{"backend": rec["backend"]} for rec in records], list(range(len(records))), show=str)
    if differ or backends:
        raise MeshSpecError(_listing(f"{head}: the ranks of one job disagree", differ + backends))
    send, recv = records[0]["params"], records[senders]["params"]
    only_send, only_recv = sorted(set(send) - set(recv)), sorted(set(recv) - set(send))
    if only_send or only_recv:
        raise MeshSpecError(
            f"{head}: the two jobs hold different models: parameters only the sender has: "
            f"{only_send[:MAX_LISTED]}; only the receiver has: {only_recv[:MAX_LISTED]}"
        )
    mismatch = []
    for name in sorted(send):
        s, r = send[name], recv[name]
        if s["shape"] != r["shape"]:
            mismatch.append(f"{name!r}: shape {tuple(s['shape'])} on the sender, {tuple(r['shape'])} on the receiver")
        elif conversion_refused(dtype_of(s["dtype"]), dtype_of(r["dtype"])):
            mismatch.append(
                f"{name!r}: sent as {s['dtype']}, received into {r['dtype']} (only equal dtypes or "
                "floating point to floating point are converted)"
            )
    if mismatch:
        raise MeshSpecError(_listing(f"{head}: the two jobs hold different models", mismatch))
    holdings: dict[str, list[Holding]] = defaultdict(list)
    targets: dict[str, list[tuple[int, Box]]] = defaultdict(list)
    writable = set()
    for b in range(senders):
        at = records[b].get("addresses") or {}
        for name, p in records[b]["params"].items():
            holdings[name] += [
                Holding(b, _box(box), offset, i, at.get(key_of(name, i))) for i, (box, offset) in enumerate(p["holds"])
            ]
    for b in range(senders, len(records)):
        for name, p in records[b]["params"].items():
            targets[name].append((b, _box(p["box"])))
            if p.get("writable"):
                writable.add((name, b))
    gaps = _coverage(holdings, targets, senders)
    if gaps:
        raise MeshSpecError(
            _listing(f"{head}: the receiver's shards are not covered by what the sender ranks hold", gaps)
        )
    return Verdict(
        {n: tuple(p["shape"]) for n, p in send.items()},
        {n: p["dtype"] for n, p in send.items()},
        {n: p["dtype"] for n, p in recv.items()},
        dict(holdings),
        dict(targets),
        frozenset(writable),
    )


def _coverage(
    holdings: Mapping[str, list[Holding]], targets: Mapping[str, list[tuple[int, Box]]], senders: int
) -> list[str]:
    gaps = []
    for name, wanted in sorted(targets.items()):
        boxes = {h.box for h in holdings.get(name, [])}
        for rank, box in wanted:
            covered = sum(_volume(i) for i in (_intersect(b, box) for b in boxes) if i is not None)
            if covered != _volume(box):
                gaps.append(
                    f"{name!r}: {who(rank, senders)} needs box {box}, the senders hold {covered} of its "
                    f"{_volume(box)} elements"
                )
    return gaps


def plan_sync(agreed: Verdict, itemsize: Mapping[str, int]) -> list[SyncPiece]:
    """Every piece to move (the same list on every rank); ``itemsize`` by parameter name (wire dtype)."""
    pieces: list[SyncPiece] = []
    turn: dict[int, int] = defaultdict(int)  # per receiver: rotates the replicas sending its small pieces
    for name in sorted(agreed.targets):
        by_box: dict[Box, list[Holding]] = {}
        for h in agreed.holdings.get(name, []):
            by_box.setdefault(h.box, []).append(h)
        for dst, d_box in agreed.targets[name]:
            for s_box, replicas in by_box.items():
                box = _intersect(s_box, d_box)
                if box is None:
                    continue
                k = len(replicas)
                parts = _split(box, k) if k > 1 and _volume(box) * itemsize[name] >= SPLIT_MIN_BYTES else [box]
                for j, part in enumerate(parts):
                    holder = replicas[(turn[dst] + j) % k]
                    pieces.append(SyncPiece(key_of(name, holder.index), holder.rank, dst, part, s_box, d_box))
                turn[dst] += len(parts)
    return pieces


def _split(box: Box, k: int) -> list[Box]:
    """``box`` cut into at most ``k`` near-equal parts along its first dim long enough (else as is)."""
    for dim, (lo, hi) in enumerate(box):
        if hi - lo >= k:
            step, extra = divmod(hi - lo, k)
            parts, start = [], lo
            for j in range(k):
                stop = start + step + (j < extra)
                parts.append(box[:dim] + ((start, stop),) + box[dim + 1 :])
                start = stop
            return parts
    return [box]


def same_host_pairs(records: Sequence[dict], senders: int) -> dict[int, list[int]]:
    """Receiver bridge rank -> the sender ranks on its host (both publishing a memory endpoint): the
    pairs whose reachability the receivers probe."""
    out: dict[int, list[int]] = {}
    for b in range(senders, len(records)):
        mine = records[b].get("memory")
        if mine:
            near = [s for s in range(senders) if (records[s].get("memory") or {}).get("host") == mine["host"]]
            if near:
                out[b] = near
    return out


def holding_addresses(agreed: Verdict) -> dict[tuple[str, int, int], Optional[int]]:
    """(parameter, sender bridge rank, holding index) -> the address that sender published (or None)."""
    return {(name, h.rank, h.index): h.address for name, hs in agreed.holdings.items() for h in hs}


def split_reads(
    pieces: Sequence[SyncPiece], agreed: Verdict, readable: set[tuple[int, int]]
) -> tuple[list[SyncPiece], list[SyncPiece]]:
    """The pieces a receiver reads straight from its sender's memory, and the ones sent as messages.
    A piece is read when its receiver can read its sender (``readable``: (sender, receiver) bridge
    ranks), the sender's holding is a contiguous host tensor (it published an address), the
    receiver's shard is writable, and the dtype does not change on the way."""
    address = holding_addresses(agreed)
    reads, messages = [], []
    for p in pieces:
        name = name_of(p.name)
        read = (
            (p.src, p.dst) in readable
            and address.get((name, p.src, index_of(p.name))) is not None
            and (name, p.dst) in agreed.writable
            and agreed.wire[name] == agreed.landing[name]
        )
        (reads if read else messages).append(p)
    return reads, messages


def sync_bytes(pieces: Sequence[SyncPiece], itemsize: Mapping[str, int]) -> int:
    """Bytes the plan moves (what reaches the receivers)."""
    return sum(_volume(p.box) * itemsize[name_of(p.name)] for p in pieces)


def describe_missing(missing: Sequence[int], senders: int) -> str:
    return _ranks(missing, senders)
