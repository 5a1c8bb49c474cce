"""A rendezvous of a rank set through the default store, and the texts that name ranks and fields.

:func:`arrive` is the one barrier the pre-flight checks use (the mesh consistency check, the weight
transfer's agreement): no communicator, O(1) store operations per member, and never a hang where a
message could speak:

- each member appends its rank to the arrivals and counts itself in (optionally *flagging*: "I need
  the slow path", and *marking*: a second, independent yes/no); the last member to arrive marks the
  round done, with the numbers that flagged and marked;
- a member whose wait runs out marks the round abandoned instead, atomically (``compare_set``), so
  a late member either completes the round for everyone or learns that it was given up; a caller
  may also give up earlier (``give_up``: after a shorter wait, when the arrivals so far say the round
  cannot complete, e.g. a missing member that never announced itself);
- either way every member that gives up or comes late raises, naming the ranks that arrived and the
  missing ones (the caller words the message); before raising, those members wait for each other
  (:data:`LEAVE_WAIT_S` at most) so that the member whose process holds the store does not end it
  while another still reads the verdict: until every member that has arrived so far (a late one
  included) has counted itself out, and every member the caller still ``expects`` (one known to be on
  its way, e.g. a rank that runs the same library) has arrived and counted itself out;
- a store that went away (its process ended) is an error of the same kind, not a raw backend error.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Callable, Collection, Mapping, Optional, Sequence

import torch.distributed as dist

from .row_major import coord_along
from .spec import MeshSpecError

DONE, ABANDONED = "done", "abandoned"
ROUND_KEYS = ("who", "arrived", "state", "left")
LEAVE_WAIT_S = 10.0  # how long the members of a failed round wait for each other before raising (at most)
_POLL_S = 0.05

# (wait, predicate): after ``wait``, give the round up when ``predicate(arrived so far)`` is true
GiveUp = tuple[timedelta, Callable[[set[int]], bool]]
# (arrived, missing) -> the message or the exception to raise; ``missing`` is empty when this rank came
# after the others gave up, None when the store went away before this rank could read the arrivals
# (``arrived`` is then this rank alone)
AbsentMessage = Callable[[list[int], "list[int] | None"], "str | BaseException"]


@dataclass(frozen=True)
class Arrival:
    """The outcome of one :func:`arrive`, the same on every member (``last``: this rank completed it)."""

    flagged: int
    last: bool
    marked: int = 0


def arrive(
    store: Any,
    prefix: str,
    members: Sequence[int],
    timeout: timedelta,
    absent: AbsentMessage,
    *,
    flag: bool = False,
    expected: Optional[Callable[[], Collection[int]]] = None,
    rank: Optional[int] = None,
    mark: bool = False,
    give_up: Optional[GiveUp] = None,
) -> Arrival:
    """Count this rank in at ``prefix`` and wait for every one of ``members``.

    Returns how many members passed ``flag`` (and ``mark``); raises :class:`~mesh_core.MeshSpecError` with
    ``absent(arrived, missing)`` when not all arrived within ``timeout``. ``expected()``: the members
    known to be on their way; before raising, this rank also waits (bounded) until those have the
    verdict. ``rank``: this member's number among ``members`` (default: its rank in the default
    group). ``give_up=(wait, predicate)``: after ``wait`` (shorter than ``timeout``), the round is given
    up at once if ``predicate(arrived)`` is true, else waited for until ``timeout``."""
    n = len(members)
    rank = dist.get_rank() if rank is None else rank
    try:
        store.append(f"{prefix}/who", f"{rank},")
        # one counter: arrivals + (n+1) x flags + (n+1)^2 x marks (each at most n)
        value = store.add(f"{prefix}/arrived", 1 + (n + 1) * int(flag) + (n + 1) ** 2 * int(mark))
        state_key = f"{prefix}/state"
        last = value % (n + 1) == n
        if last:
            flags, marks = coord_along(value, n + 1, n + 1), value // (n + 1) ** 2  # the counter's digits base n+1
            state = store.compare_set(state_key, "", f"{DONE}:{flags}" + (f":{marks}" if marks else "")).decode()
        else:
            state = _await_or_give_up(store, prefix, timeout, give_up)
        if state.startswith(DONE):
            _, flags_text, marks_text = (state.split(":") + ["0", "0"])[:3]
            return Arrival(int(flags_text or 0), last, int(marks_text or 0))
        arrived = sorted(_arrived(store, prefix))
        error = _as_error(absent(arrived, sorted(set(members) - set(arrived))))
    except (RuntimeError, dist.DistError) as err:  # the store is gone: its process ended
        raise _as_error(absent([rank], None)) from err
    try:
        _leave_together(store, prefix, expected, min(timeout.total_seconds(), LEAVE_WAIT_S))
    except (RuntimeError, dist.DistError):
        pass  # the store ended once the others had left: this rank has its verdict already
    raise error


def _as_error(outcome: "str | BaseException") -> BaseException:
    return outcome if isinstance(outcome, BaseException) else MeshSpecError(outcome)


def _leave_together(store: Any, prefix: str, expected: Optional[Callable[[], Collection[int]]], wait_s: float) -> None:
    """Count this member out of a failed round and wait (``wait_s`` at most) until every member that
    has arrived (re-read: a late one counts) has counted itself out, and every ``expected()`` member has
    arrived."""
    left = store.add(f"{prefix}/left", 1)
    deadline = time.monotonic() + wait_s
    while True:
        arrived = _arrived(store, prefix)  # a member appends itself first: this is every member on its way in
        if left >= len(arrived) and not set(expected() if expected else ()) - arrived:
            return
        if time.monotonic() >= deadline:
            return
        time.sleep(_POLL_S)
        left = store.add(f"{prefix}/left", 0)


def _arrived(store: Any, prefix: str) -> set[int]:
    return {int(r) for r in store.get(f"{prefix}/who").decode().split(",") if r}


def _await_or_give_up(store: Any, prefix: str, timeout: timedelta, give_up: Optional[GiveUp]) -> str:
    """:func:`_await` of the round's state, cut short by ``give_up`` (see :func:`arrive`)."""
    key = f"{prefix}/state"
    if give_up is None or give_up[0] >= timeout:
        return _await(store, key, timeout)
    wait, predicate = give_up
    try:
        store.wait([key], wait)
        return store.get(key).decode()
    except (RuntimeError, dist.DistError):
        if not store.check([key]) and predicate(_arrived(store, prefix)):
            return store.compare_set(key, "", ABANDONED).decode()  # a last arrival in between wins
    return _await(store, key, timeout - wait)


def _await(store: Any, key: str, timeout: timedelta) -> str:
    """The value of ``key`` once set, or (``timeout`` run out) what ``compare_set`` leaves there:
    ``ABANDONED``, or the value a late last arrival set in between."""
    try:
        if timeout == getattr(store, "timeout", None):
            return store.get(key).decode()  # waits with the store's own timeout: one round trip
        store.wait([key], timeout)
    except (RuntimeError, dist.DistError):
        pass
    return store.compare_set(key, "", ABANDONED).decode()  # the current value if set


def forget(store: Any, prefix: str, keys: Sequence[str] = ROUND_KEYS) -> None:
    """Delete a finished round's keys (once every member is past it)."""
    for key in keys:
        try:
            store.delete_key(f"{prefix}/{key}")
        except (RuntimeError, NotImplementedError, AttributeError):
            return


def differing_fields(
    rows: Sequence[Mapping[str, str]],
    ranks: Sequence[int],
    *,
    absent: str = "<missing>",
    show: Callable[[str], str] = str,
) -> list[str]:
    """``"field: value on ranks …; other on rank …"`` for each field whose value differs between
    ``rows`` (``rows[i]`` belongs to ``ranks[i]``), fields in first-seen order."""
    fields = list(dict.fromkeys(name for row in rows for name in row))
    out = []
    for name in fields:
        holders: dict[str, list[int]] = {}
        for rank, row in zip(ranks, rows):
            holders.setdefault(row.get(name, absent), []).append(rank)
        if len(holders) > 1:
            out.append(f"{name}: " + "; ".join(f"{show(v)} on {ranks_text(rs, 'rank')}" for v, rs in holders.items()))
    return out


def ranks_text(ranks: Sequence[int], noun: str = "") -> str:
    """``"ranks 0..3,6"``: ranks as runs (``noun`` pluralised when there are several)."""
    prefix = f"{noun}s " if noun and len(ranks) > 1 else (f"{noun} " if noun else "")
    if isinstance(ranks, range) and ranks.step == 1:
        return prefix + (f"{ranks.start}..{ranks.stop - 1}" if len(ranks) > 1 else str(ranks.start))
    ranks = list(ranks)
    if not ranks:
        return prefix + "none"
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
