"""Check that every rank of the world builds the same mesh, before any group is created.

Group creation needs every member of a group to call: a rank that builds a different mesh
issues different creation calls and the job hangs with no message. :func:`check_same_mesh` runs
over the mesh's own ranks only (non-members of a sub-world mesh take no part):

- a mesh over the whole world all-gathers a 32-byte digest of the mesh description over the
  default group (one small collective); only when digests differ does it gather the full
  descriptions to name the fields and ranks that disagree;
- a sub-world mesh exchanges the digests through the default store among its members (O(1) store
  operations per member, no communicator): each member publishes its description, counts itself
  under its digest and waits until all members arrived; a member whose digest count is short of the
  member count reads the descriptions and raises. A member that disagrees on the rank set itself
  looks for the others under another key: the wait then times out with a message naming how many
  members arrived.
"""

from __future__ import annotations

import hashlib
import json
import logging
import weakref
from collections import Counter
from datetime import timedelta
from typing import Any, Mapping, Optional, Sequence

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

from .spec import MeshSpec, MeshSpecError

logger = logging.getLogger(__name__)

DIGEST_WORDS = 4  # 4 x int64 = the first 32 bytes of a sha256
SKIPPED_BACKENDS = ("fake",)  # its collectives are no-ops: nothing to compare
STORE_PREFIX = "mesh_core/check"
# per world: how many sub-world checks each rank set has run (the same on every member)
_CHECKS: "weakref.WeakKeyDictionary[Any, Counter]" = weakref.WeakKeyDictionary()


def mesh_fields(spec: MeshSpec, **options: Any) -> dict[str, str]:
    """The mesh description every rank must agree on, one printable value per field."""
    fields = {
        "world_size": str(spec.world_size),
        "dims": ", ".join(f"{n}={s}" for n, s in zip(spec.names, spec.sizes)),
        "ranks": _ranks_text(spec.ranks),
        "ep": str(spec.ep),
        "data_before_expert": str(spec.data_before_expert),
    }
    fields.update({name: _option_text(value) for name, value in sorted(options.items())})
    return fields


def digest(fields: Mapping[str, str]) -> list[int]:
    """A fixed-size digest of the fields (as signed int64 words, for a tensor collective)."""
    raw = hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).digest()
    return [int.from_bytes(raw[8 * i : 8 * i + 8], "little", signed=True) for i in range(DIGEST_WORDS)]


def check_same_mesh(spec: MeshSpec, *, timeout: Optional[timedelta] = None, **options: Any) -> None:
    """Raise :class:`MeshSpecError` on every member if the mesh's ranks disagree on the mesh.

    Called by the members of the mesh only (every member, in the same order); ``options`` are the
    constructor arguments that change which groups are created (flatten, p2p_groups, backend).
    Skipped for a one-rank mesh and the fake backend. ``timeout`` bounds a sub-world mesh's wait
    for its members (default: the store's timeout).
    """
    if not dist.is_initialized() or spec.size == 1 or dist.get_backend() in SKIPPED_BACKENDS:
        return
    fields = mesh_fields(spec, **options)
    if spec.size == dist.get_world_size():
        _check_over_world(fields)
    else:
        _check_over_store(spec, fields, timeout)


def _check_over_world(fields: dict[str, str]) -> None:
    device = _collective_device()
    mine = torch.tensor(digest(fields), dtype=torch.int64, device=device)
    gathered = torch.empty(dist.get_world_size() * DIGEST_WORDS, dtype=torch.int64, device=device)
    _all_gather_single(gathered, mine)
    rows = gathered.view(-1, DIGEST_WORDS)
    if bool((rows == mine).all()):
        return
    # every rank saw the same mismatch, so every rank takes part in this second gather
    everyone: list[Optional[dict[str, str]]] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, fields)
    raise MeshSpecError(describe_disagreement(everyone))  # type: ignore[arg-type]


def _check_over_store(spec: MeshSpec, fields: dict[str, str], timeout: Optional[timedelta]) -> None:
    store = c10d._get_default_store()
    members = sorted(spec.ranks)
    set_id = hashlib.sha1(",".join(map(str, members)).encode(), usedforsecurity=False).hexdigest()
    counts = _CHECKS.setdefault(c10d._get_default_group(), Counter())
    prefix = f"{STORE_PREFIX}/{set_id}/{counts[set_id]}"
    counts[set_id] += 1
    mine = "".join(f"{w & 0xFFFFFFFFFFFFFFFF:016x}" for w in digest(fields))
    store.set(f"{prefix}/fields/{dist.get_rank()}", json.dumps(fields))
    store.add(f"{prefix}/digest/{mine}", 1)
    if store.add(f"{prefix}/arrived", 1) == len(members):
        store.set(f"{prefix}/done", "1")
    try:
        if timeout is None:
            store.wait([f"{prefix}/done"])
        else:
            store.wait([f"{prefix}/done"], timeout)
    except (RuntimeError, dist.DistError) as err:
        arrived = store.add(f"{prefix}/arrived", 0)
        raise MeshSpecError(
            f"only {arrived} of the {len(members)} ranks of {spec.describe()} started checking it ({err}); "
            "the others build a different mesh (or none): every member must build the same mesh in the same order"
        ) from None
    if store.add(f"{prefix}/digest/{mine}", 0) == len(members):
        return
    per_rank = [json.loads(store.get(f"{prefix}/fields/{r}")) for r in members]
    raise MeshSpecError(describe_disagreement(per_rank, ranks=members))


def describe_disagreement(per_rank: Sequence[Mapping[str, str]], ranks: Optional[Sequence[int]] = None) -> str:
    """A message naming each differing field and which ranks hold which value (``per_rank[i]``
    belongs to ``ranks[i]``, default rank ``i``)."""
    parts = []
    ranks = list(range(len(per_rank))) if ranks is None else list(ranks)
    for name in per_rank[0]:
        holders: dict[str, list[int]] = {}
        for rank, fields in zip(ranks, per_rank):
            holders.setdefault(fields.get(name, "<missing>"), []).append(rank)
        if len(holders) > 1:
            values = "; ".join(f"{value!r} on {_ranks_text(ranks, 'rank')}" for value, ranks in holders.items())
            parts.append(f"{name}: {values}")
    return (
        "ranks disagree on the mesh, so creating its groups would hang; every rank must build the same "
        "mesh in the same order. Differing fields: " + " | ".join(parts)
    )


def _all_gather_single(output: torch.Tensor, value: torch.Tensor) -> None:
    # torch 2.13 renamed all_gather_into_tensor (now deprecated, with a FutureWarning per call)
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    gather(output, value)


def _collective_device() -> torch.device:
    # the device the default group's collectives run on (cuda for nccl, cpu for gloo)
    return dist.distributed_c10d._get_object_coll_device(None)  # type: ignore[attr-defined]


def _option_text(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_option_text(v) for v in value) + "]"
    return str(value)


def _ranks_text(ranks: Sequence[int], noun: str = "") -> str:
    prefix = f"{noun}s " if noun and len(ranks) > 1 else (f"{noun} " if noun else "")
    if isinstance(ranks, range) and ranks.step == 1:
        return prefix + (f"{ranks.start}..{ranks.stop - 1}" if len(ranks) > 1 else str(ranks.start))
    ranks = list(ranks)
    runs = []
    start = prev = ranks[0]
    for r in ranks[1:] + [None]:  # type: ignore[list-item]
        if r is not None and r == prev + 1:
            prev = r
            continue
        runs.append(str(start) if start == prev else f"{start}..{prev}")
        if r is not None:
            start = prev = r
    return prefix + ",".join(runs)
