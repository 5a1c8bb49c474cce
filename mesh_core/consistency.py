"""Check that the ranks of a mesh build the same mesh, before any group is created.

Group creation needs every member of a group to call: a rank that builds a different mesh
issues different creation calls and the job hangs with no message. :func:`check_same_mesh` runs
over the mesh's own ranks only (non-members of a sub-world mesh take no part) and goes through the
default store, for a whole-world mesh as for a sub-world one (no communicator, so no raw backend
error and no collective another thread could interleave with):

- each member publishes its description and its digest, counts itself under its digest, and meets
  the others in one :func:`mesh_core.rendezvous.arrive` (O(1) store operations per member; the wait
  is the process-group timeout by default, shorter for members that announced nothing where a layer
  above set :func:`mesh_core.absence.set_quiet_bound`): a late member either completes the check for
  everyone or learns it was given up — never half of each;
- a timed-out check raises :class:`~mesh_core.absence.AbsentRanksError` on every waiting member,
  naming the mesh, the ranks that arrived and the missing ones, and which of those have built no mesh
  at all in this world (plus the hints a layer above registered); a member arriving after that raises
  too (it would wait for groups nobody creates); a member late by less than the timeout is simply
  waited for;
- when digests differ, every member reads one description per distinct digest and raises, naming
  the fields and ranks that disagree; when they agree, each member deletes its description.

Checks of one rank set are told apart by a per-world count of earlier checks of that set, the same
on every member because every member checks its meshes in the same order. Two threads of one
process building meshes over the same rank set at once would break that order: that raises at
once (see :func:`rank_set_slot`, held by a mesh for its whole construction).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import threading
import weakref
from collections import Counter
from datetime import timedelta
from typing import Any, Iterator, Mapping, Optional, Sequence

import torch.distributed as dist

from . import absence, torch_compat
from .absence import AbsentRanksError
from .rendezvous import arrive, differing_fields, ranks_text
from .spec import MeshSpec, MeshSpecError

logger = logging.getLogger(__name__)

DIGEST_WORDS = 4  # 4 x int64 = the first 32 bytes of a sha256
SKIPPED_BACKENDS = ("fake",)  # its collectives are no-ops: nothing to compare


def announce_builder() -> None:
    """Record in the world's store that this rank builds meshes (once per world; nothing before
    ``init_process_group`` or on a world whose mesh checks are skipped). Lets a timed-out check name
    the ranks that never built a mesh at all."""
    if not dist.is_initialized() or dist.get_backend() in SKIPPED_BACKENDS:
        return
    absence.announce(torch_compat.default_store(), torch_compat.default_group(), dist.get_rank())


STORE_PREFIX = "mesh_core/check"
# per world: how many checks each rank set has run (the same on every member)
_CHECKS: "weakref.WeakKeyDictionary[Any, Counter]" = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()
_IN_FLIGHT: dict[tuple[int, str], tuple[int, int]] = {}  # (world, rank set) -> (thread, depth) building it
_CHECKING_THREADS: set[int] = set()  # threads that ever ran a check (for the disagreement hint)


class ConcurrentCheckError(MeshSpecError):
    """Two threads of one process built meshes over the same rank set at the same time."""


def mesh_fields(spec: MeshSpec, **options: Any) -> dict[str, str]:
    """The mesh description every rank must agree on, one printable value per field."""
    fields = {
        "world_size": str(spec.world_size),
        "dims": ", ".join(f"{n}={s}" for n, s in zip(spec.names, spec.sizes)),
        "ranks": ranks_text(spec.ranks),
        "ep": str(spec.ep),
        "data_before_expert": str(spec.data_before_expert),
    }
    fields.update({name: _option_text(value) for name, value in sorted(options.items())})
    return fields


def digest(fields: Mapping[str, str]) -> list[int]:
    """A fixed-size digest of the fields (as signed int64 words)."""
    raw = hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).digest()
    return [int.from_bytes(raw[8 * i : 8 * i + 8], "little", signed=True) for i in range(DIGEST_WORDS)]


def check_same_mesh(spec: MeshSpec, *, timeout: Optional[timedelta] = None, **options: Any) -> None:
    """Raise :class:`MeshSpecError` on every member if the mesh's ranks disagree on the mesh, or
    if some member has not started checking it when ``timeout`` runs out.

    Called by the members of the mesh only (every member, in the same order); ``options`` are the
    constructor arguments that change which groups are created (flatten, p2p_groups, backend).
    Skipped for a one-rank mesh and the fake backend. ``timeout`` bounds the wait for the other
    members (default: the default process group's timeout).
    """
    if not dist.is_initialized() or spec.size == 1 or dist.get_backend() in SKIPPED_BACKENDS:
        return
    _check_over_store(spec, mesh_fields(spec, **options), timeout)


def world_timeout() -> timedelta:
    """The default process group's timeout (the store's where the backend does not expose it)."""
    world = torch_compat.default_group()
    try:
        return torch_compat.backend_timeout(world, torch_compat.default_device())
    except (AttributeError, RuntimeError, TypeError):
        return torch_compat.default_store().timeout


@contextlib.contextmanager
def rank_set_slot(spec: MeshSpec) -> Iterator[None]:
    """Hold this process's slot for building a mesh over ``spec``'s rank set (re-entrant in one
    thread); raise :class:`ConcurrentCheckError` if another thread holds it."""
    slot = (id(torch_compat.default_group()), _set_id(sorted(spec.ranks)))
    me = threading.get_ident()
    with _LOCK:
        holder, depth = _IN_FLIGHT.get(slot, (me, 0))
        if holder != me:
            raise ConcurrentCheckError(
                f"two threads of rank {dist.get_rank()} build meshes over the ranks of {spec.describe()} at once; "
                "their order would differ between ranks and the groups could not be matched: build meshes over "
                "the same ranks from one thread, or one after the other in the same order on every rank"
            )
        _IN_FLIGHT[slot] = (me, depth + 1)
        _CHECKING_THREADS.add(me)
    try:
        yield
    finally:
        with _LOCK:
            if depth:
                _IN_FLIGHT[slot] = (me, depth)
            else:
                del _IN_FLIGHT[slot]


def _set_id(members: Sequence[int]) -> str:
    return hashlib.sha1(",".join(map(str, members)).encode(), usedforsecurity=False).hexdigest()


def _check_over_store(spec: MeshSpec, fields: dict[str, str], timeout: Optional[timedelta]) -> None:
    store = torch_compat.default_store()
    members = sorted(spec.ranks)
    set_id = _set_id(members)
    with rank_set_slot(spec):
        with _LOCK:
            counts = _CHECKS.setdefault(torch_compat.default_group(), Counter())
            prefix = f"{STORE_PREFIX}/{set_id}/{counts[set_id]}"
            counts[set_id] += 1
        _run_check(store, prefix, spec, members, fields, timeout or world_timeout())


def _run_check(
    store: Any, prefix: str, spec: MeshSpec, members: list[int], fields: dict[str, str], timeout: timedelta
) -> None:
    rank = dist.get_rank()
    mine = "".join(f"{w & 0xFFFFFFFFFFFFFFFF:016x}" for w in digest(fields))
    try:
        absence.announce(store, torch_compat.default_group(), rank)
        store.set(f"{prefix}/fields/{rank}", json.dumps(fields))
        store.set(f"{prefix}/digest_of/{rank}", mine)
        store.add(f"{prefix}/digest/{mine}", 1)
    except (RuntimeError, dist.DistError) as err:  # the store is gone: its process ended
        raise _absent_error(store, spec, members, [rank], None, timeout) from err
    bound = absence.quiet_bound()
    bound = bound if bound is not None and bound < timeout else None

    def absent_error(arrived: list[int], missing: Optional[list[int]]) -> AbsentRanksError:
        return _absent_error(store, spec, members, arrived, missing, timeout, bound)

    def any_quiet(arrived: set[int]) -> bool:  # a missing member that never announced itself
        return bool(absence.quiet_ranks(store, sorted(set(members) - arrived)))

    arrive(
        store,
        prefix,
        members,
        timeout,
        absent_error,
        expected=lambda: (absence.builders(store) or set()) & set(members),  # they get the verdict too
        give_up=None if bound is None else (bound, any_quiet),
    )
    if store.add(f"{prefix}/digest/{mine}", 0) == len(members):  # agreed: nobody reads descriptions
        store.delete_key(f"{prefix}/fields/{rank}")
        store.delete_key(f"{prefix}/digest_of/{rank}")
        return
    digests = [d.decode() for d in store.multi_get([f"{prefix}/digest_of/{r}" for r in members])]
    described: dict[str, dict[str, str]] = {}
    for r, d in zip(members, digests):  # one description per distinct digest
        if d not in described:
            described[d] = json.loads(store.get(f"{prefix}/fields/{r}"))
    message = describe_disagreement([described[d] for d in digests], ranks=members)
    if len(_CHECKING_THREADS) > 1:
        message += (
            " (meshes are built from several threads in this process: meshes over the same ranks must be "
            "built in the same order on every rank, so build them from one thread)"
        )
    raise MeshSpecError(message)


def _absent_error(
    store: Any,
    spec: MeshSpec,
    members: list[int],
    arrived: list[int],
    missing: Optional[list[int]],
    timeout: timedelta,
    bound: Optional[timedelta] = None,
) -> AbsentRanksError:
    """The error of a check given up (``bound``: the shorter wait for ranks that announced nothing)."""
    rank = dist.get_rank()
    quiet = absence.quiet_ranks(store, missing) if missing else ([] if missing == [] else None)
    waited = bound if bound is not None and quiet else timeout  # a quiet rank missing: the bound gave up
    if missing is None:
        message = (
            f"rank {rank} could not finish the check of {spec.describe()}: the store went away (the process that "
            "held it ended, most likely with the error of this check: see that rank's message, which names the "
            "missing ranks); some members did not start checking the mesh within "
            f"{timeout if bound is None else f'{bound} (ranks that had built no mesh) or {timeout} (the others)'}, "
            "or the store's process failed for another reason"
        )
    elif missing:
        of_those = "of those, " if quiet != missing else ""
        never = f"; {of_those}{ranks_text(quiet, 'rank')} built no mesh at all in this world" if quiet else ""
        one = len(missing) == 1
        they = "the missing rank builds" if one else "the missing ranks build"
        late = (
            f"or {'is' if one else 'are'} later than the process-group timeout"
            if waited == timeout
            else f"or {'has' if one else 'have'} started no mesh within {waited} (the wait for ranks that have built "
            f"none; ranks that have are waited for up to the process-group timeout, {timeout})"
        )
        message = (
            f"only {len(arrived)} of the {len(members)} ranks of {spec.describe()} started checking it within "
            f"{waited} (arrived: {ranks_text(arrived, 'rank')}; missing: {ranks_text(missing, 'rank')}{never}); "
            f"{they} a different mesh (or none), {late}: every member must build the same mesh in the same order"
        )
    else:
        gave_up = f"{timeout}" if bound is None else f"{bound} for a rank that announced nothing, {timeout} otherwise"
        message = (
            f"rank {rank} reached the check of {spec.describe()} after the other ranks gave up waiting for it "
            f"({gave_up}); it was later than that: every member must build the same mesh in the same order"
        )
    return AbsentRanksError(
        message, mesh=spec.describe(), rank=rank, arrived=arrived, missing=missing, quiet=quiet, timeout=waited
    )


def describe_disagreement(per_rank: Sequence[Mapping[str, str]], ranks: Optional[Sequence[int]] = None) -> str:
    """A message naming each differing field and which ranks hold which value (``per_rank[i]``
    belongs to ``ranks[i]``, default rank ``i``)."""
    ranks = list(range(len(per_rank))) if ranks is None else list(ranks)
    return (
        "ranks disagree on the mesh, so creating its groups would hang; every rank must build the same "
        "mesh in the same order. Differing fields: " + " | ".join(differing_fields(per_rank, ranks, show=repr))
    )


def _option_text(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_option_text(v) for v in value) + "]"
    return str(value)
