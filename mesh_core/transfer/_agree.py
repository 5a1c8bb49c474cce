"""Pre-flight of a weight transfer: this rank's checks, then one agreement among every rank of both meshes.

Each participant builds a *record*: the two meshes, the layouts it knows (both sides in the plain
API, its own side for engines), the dtype and device of every tensor it sends or receives, what its
world moves data on (:mod:`mesh_core.transfer._devices`), and every problem found in its own tensors
(missing, ``None``, wrong shape, a cast that is refused, a device the world cannot use). The records are
exchanged through the default store among the participants only (no communicator, no message on the
data path), in two steps:

- every call: one :func:`mesh_core.rendezvous.arrive` of the participants, each flagging "my record
  changed or has a problem"; when no participant flags anything, the previous call's agreed result
  is reused;
- otherwise every participant publishes its record, reads all of them, and computes the same verdict:
  one :class:`~mesh_core.MeshSpecError` (naming parameters, values and ranks) on every participant,
  or the merged layouts and dtypes the transfer runs with.

A participant that never arrives (it disagrees on who takes part, or is not calling) makes the others'
wait end after ``timeout`` with an error naming the ranks that arrived and the missing ones.

Dtype policy (what :func:`check_dtypes` enforces): the data travel in the sender's dtype (after the
source layout's ``dtype`` cast, if given) and are converted on arrival like ``Tensor.copy_``; between
floating-point dtypes that rounds (bf16 actor → fp16 rollout is the usual case; a value beyond the
target's range becomes inf, as with ``copy_``). Any other dtype change (float ↔ int, int32 → int64,
bool, complex ↔ real) is refused before a message is sent: it would truncate or reinterpret values.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import weakref
from collections import Counter
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Callable, Mapping, Optional, Sequence

import torch
import torch.distributed as dist

from .. import torch_compat
from ..rendezvous import arrive, differing_fields, forget, ranks_text
from ..spec import MeshSpec, MeshSpecError
from ._devices import agreed_problems

logger = logging.getLogger(__name__)

STORE_PREFIX = "mesh_core/transfer"
MAX_LISTED = 6  # problems / parameters named in one message
SIDES = ("source", "destination")
ABSENT = "<not given>"
REFUSED = (
    "only equal dtypes or floating-point to floating-point are converted (it would truncate or reinterpret values)"
)
_ROUNDS: "weakref.WeakKeyDictionary[Any, Counter]" = weakref.WeakKeyDictionary()
_AGREED: "weakref.WeakKeyDictionary[Any, dict]" = weakref.WeakKeyDictionary()
_PUBLISHED: "weakref.WeakKeyDictionary[Any, dict]" = (
    weakref.WeakKeyDictionary()
)  # per rank set: did its last round publish records


@dataclass(frozen=True)
class TensorMeta:
    """What the agreement needs of one tensor: its shape, the dtype it travels / lands in, its device."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    device: str = "cpu"  # "cuda:1": the device it is sent from / received into


@dataclass
class Agreed:
    """The outcome every participant computed alike: layouts per side and dtypes per (name, rank)."""

    layouts: dict[str, dict[str, tuple]]  # side -> name -> layout fields
    dtypes: dict[str, dict[tuple[str, int], str]]  # side -> (name, rank) -> dtype name
    flags: dict[str, Any] = field(default_factory=dict)  # side -> merged side flags (e.g. gather)
    cache: dict = field(default_factory=dict)  # what the caller derives from it (plan, buckets)


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def dtype_of(name: str) -> torch.dtype:
    value = getattr(torch, name, None)
    if not isinstance(value, torch.dtype):
        raise MeshSpecError(f"unknown dtype {name!r}")
    return value


def conversion_refused(wire: torch.dtype, target: torch.dtype) -> Optional[str]:
    """Why data sent as ``wire`` must not land in ``target`` (None: equal, or float → float)."""
    if wire == target or (wire.is_floating_point and target.is_floating_point):
        return None
    if wire.is_complex and target.is_complex:
        return None
    return REFUSED


def record_for(
    specs: tuple[MeshSpec, MeshSpec],
    layouts: Mapping[str, Optional[Mapping[str, tuple]]],
    metas: Mapping[str, Optional[Mapping[str, TensorMeta]]],
    problems: Sequence[str],
    flags: Mapping[str, Any],
    world: Optional[Mapping[str, Any]] = None,
) -> dict:
    """This rank's record (JSON-able); ``world`` is :meth:`WorldDevices.fields`."""
    return {
        "meshes": [specs[0].describe(), specs[1].describe()],
        "layouts": {
            side: None if layouts.get(side) is None else {n: list(v) for n, v in sorted(layouts[side].items())}
            for side in SIDES
        },
        "dtypes": {
            side: None if metas.get(side) is None else {n: dtype_name(m.dtype) for n, m in sorted(metas[side].items())}
            for side in SIDES
        },
        "devices": {
            side: None if metas.get(side) is None else {n: m.device for n, m in sorted(metas[side].items())}
            for side in SIDES
        },
        "world": dict(world or {}),
        "problems": list(problems),
        "flags": {k: flags[k] for k in sorted(flags)},
    }


def agree(
    participants: Sequence[int], record: dict, *, key: str, timeout: Optional[timedelta]
) -> tuple[Agreed, Callable[[], None]]:
    """Exchange ``record`` with every participant: the same :class:`Agreed` or error on each, and
    this rank's clean-up to run once the transfer's messages are done (off the critical path: this
    round's last arrival deletes the round before's store keys, every participant being past it)."""
    store = torch_compat.default_store()
    members = sorted(participants)
    world = torch_compat.default_group()
    set_id = hashlib.sha1(",".join(map(str, members)).encode(), usedforsecurity=False).hexdigest()
    rounds = _ROUNDS.setdefault(world, Counter())
    round_no = rounds[set_id]
    rounds[set_id] += 1
    prefix = f"{STORE_PREFIX}/{set_id}/{round_no}"
    raw = json.dumps(record, sort_keys=True)
    mine = hashlib.sha256(raw.encode()).hexdigest()
    cache = _AGREED.setdefault(world, {})
    previous = cache.get(key)
    flagged = bool(record["problems"]) or previous is None or previous[0] != mine
    wait = timeout if timeout is not None else store.timeout
    absent = functools.partial(_absent, members, timeout=wait)
    published = _PUBLISHED.setdefault(world, {})
    arrival = arrive(store, prefix, members, wait, absent, flag=flagged)
    before = f"{STORE_PREFIX}/{set_id}/{round_no - 1}"
    finish = (
        functools.partial(_forget_round, store, before, members, published.get(set_id, False))
        if arrival.last and round_no
        else _nothing
    )
    published[set_id] = arrival.flagged > 0
    if arrival.flagged == 0:
        return previous[1], finish  # type: ignore[index]
    cache.pop(key, None)
    store.set(f"{prefix}/record/{dist.get_rank()}", raw)
    arrive(store, f"{prefix}/published", members, wait, absent)
    records = [json.loads(v) for v in _get_all(store, [f"{prefix}/record/{r}" for r in members])]
    try:
        agreed = merge(members, records)
    except MeshSpecError:
        finish()
        raise
    cache[key] = (mine, agreed)
    return agreed, finish


def merge(members: Sequence[int], records: Sequence[dict]) -> Agreed:
    """The verdict over all records (pure: every participant computes the same one)."""
    problems = [f"rank {r}: {p}" for r, rec in zip(members, records) for p in rec["problems"]]
    problems += agreed_problems(members, records)
    if problems:
        raise MeshSpecError(_listing("transfer refused before any message was sent", problems))
    differ = differing_fields(
        [{"meshes (source -> destination)": " -> ".join(rec["meshes"])} for rec in records], members
    )
    layouts: dict[str, dict[str, tuple]] = {}
    for side in SIDES:
        known = [(r, rec["layouts"][side]) for r, rec in zip(members, records) if rec["layouts"][side] is not None]
        if not known:
            raise MeshSpecError(f"no rank gave the {side} layouts: the ranks of the {side} mesh must pass them")
        names = sorted(set().union(*(set(v) for _, v in known)))
        rows = [{f"{side} parameter {n!r}": _layout_text(v.get(n)) for n in names} for _, v in known]
        differ += differing_fields(rows, [r for r, _ in known], absent=ABSENT)
        layouts[side] = {n: tuple(v) for n, v in known[0][1].items()}
    for side in SIDES:
        values = {json.dumps(rec["flags"].get(side)) for rec in records if rec["flags"].get(side) is not None}
        if len(values) > 1:
            differ += differing_fields(
                [{f"{side} engine": json.dumps(rec["flags"].get(side))} for rec in records], members
            )
    if differ:
        raise MeshSpecError(
            _listing(
                "ranks disagree on the transfer, so it would hang or deliver wrong values; "
                "every rank of both meshes must pass the same meshes and layouts",
                differ,
            )
        )
    dtypes = {
        side: {(n, r): d for r, rec in zip(members, records) for n, d in (rec["dtypes"][side] or {}).items()}
        for side in SIDES
    }
    flags = {
        side: next((rec["flags"][side] for rec in records if rec["flags"].get(side) is not None), None)
        for side in SIDES
    }
    return Agreed(layouts, dtypes, flags)


def check_dtypes(pieces: Sequence[Any], agreed: Agreed) -> None:
    """Raise (alike on every rank) if a piece would land in a dtype its sent dtype must not become."""
    refused = []
    seen = set()
    for p in pieces:
        wire = agreed.dtypes["source"][(p.name, p.src)]
        target = agreed.dtypes["destination"][(p.name, p.dst)]
        reason = conversion_refused(dtype_of(wire), dtype_of(target))
        if reason and (p.name, wire, target) not in seen:
            seen.add((p.name, wire, target))
            refused.append(f"{p.name!r}: sent as {wire} by rank {p.src}, received into {target} on rank {p.dst}")
    if refused:
        raise MeshSpecError(_listing(f"transfer refused before any message was sent: {REFUSED}", refused))


def _layout_text(fields: Optional[Sequence]) -> str:
    if fields is None:
        return "<not given>"
    shape, shard_dim, over, stage, dtype = fields
    text = f"shape {tuple(shape)}"
    if shard_dim is not None:
        text += f" split on dim {shard_dim} over {'x'.join(over)}"
    if stage is not None:
        text += f" on stage {stage}"
    return text + (f" cast to {dtype}" if dtype else "")


def _listing(head: str, items: Sequence[str]) -> str:
    more = f" | ... and {len(items) - MAX_LISTED} more" if len(items) > MAX_LISTED else ""
    return f"{head}: " + " | ".join(items[:MAX_LISTED]) + more


def _absent(
    members: Sequence[int], arrived: Sequence[int], missing: Optional[Sequence[int]], timeout: timedelta
) -> str:
    if missing is None:
        return (
            f"transfer: rank {dist.get_rank()} could not finish the agreement of the ranks taking part "
            f"({ranks_text(members, 'rank')}): the store went away (the process that held it ended, most likely "
            f"after waiting {timeout} for missing ranks: see its message)"
        )
    if not missing:
        return (
            f"transfer: rank {dist.get_rank()} started it after the other ranks taking part "
            f"({ranks_text(members, 'rank')}) gave up waiting for it ({timeout}); every rank of both meshes "
            "must call it with the same meshes, in the same order as its other transfers"
        )
    return (
        f"transfer: only {len(arrived)} of the {len(members)} ranks taking part ({ranks_text(members, 'rank')}) "
        f"started it within {timeout} (arrived: {ranks_text(arrived, 'rank')}; missing: {ranks_text(missing, 'rank')}); "
        "every rank of both meshes must call it with the same meshes, in the same order as its other transfers"
    )


def _get_all(store, keys: list[str]) -> list[bytes]:
    multi_get = getattr(store, "multi_get", None)
    if multi_get is not None:
        try:
            return list(multi_get(keys))
        except (RuntimeError, NotImplementedError):
            pass
    return [store.get(k) for k in keys]


def _forget_round(store: Any, prefix: str, members: Sequence[int], published: bool) -> None:
    """Delete a finished round's keys (its records too when it published them)."""
    forget(store, prefix)
    if published:
        forget(store, f"{prefix}/published")
        forget(store, prefix, [f"record/{r}" for r in members])


def _nothing() -> None:
    return None
