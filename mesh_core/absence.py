"""Ranks that never joined a mesh: the typed error, which of them built no mesh at all, and hints.

When a mesh's consistency check (:mod:`mesh_core.consistency`) runs out of time, every waiting
member raises :class:`AbsentRanksError`, which names the mesh, the ranks that arrived and the
missing ones, and among the missing ones those that have *built no mesh in this world* (``quiet``):
a rank that never reached ``mesh_core`` at all, e.g. one that runs plain ``torch.distributed`` code,
not a rank that builds another mesh or is merely late. Each process announces itself once per world
(:func:`announce`, one store operation) the first time it checks a mesh, or earlier where a layer above
knows it will (the shim, when ``deepspeed.initialize`` starts); the members of a failed check wait,
bounded, for the announced ones to read the verdict (:func:`builders`).

A layer above that knows every one of its ranks announces itself early (the shim: when the world is
up) can bound the wait for the others with :func:`set_quiet_bound`: a check whose missing members
include one that has announced nothing within that bound gives up then, on every waiting member,
instead of at the process-group timeout (a member that announced itself is still waited for up to
the timeout: it is late, not absent).

A layer above ``mesh_core`` that knows why ranks may be missing adds its explanation with
:func:`add_hint` (a callable ``hint(error) -> str | None``, consulted when the error is raised);
:func:`remove_hint` takes it back. A hint that fails is logged and left out: it never replaces the
error.
"""

from __future__ import annotations

import logging
import threading
import weakref
from datetime import timedelta
from typing import Any, Callable, Optional, Sequence

from .spec import MeshSpecError

logger = logging.getLogger(__name__)

BUILDERS_KEY = "mesh_core/builders"  # every rank that has checked a mesh in this world, as "r,"

Hint = Callable[["AbsentRanksError"], Optional[str]]
QuietBound = Callable[[], Optional[timedelta]]

_hints: list[Hint] = []
_quiet_bound: Optional[QuietBound] = None
_lock = threading.Lock()
_announced: "weakref.WeakSet[Any]" = weakref.WeakSet()  # worlds (default groups) this process announced itself in


class AbsentRanksError(MeshSpecError):
    """Some members of a mesh did not start building it within the timeout.

    ``arrived`` / ``missing``: the members that did / did not start checking the mesh (``missing`` is
    empty when this rank itself came after the others gave up, ``None`` when the store went away before
    this rank could read the arrivals); ``quiet``: the missing ranks that have built no mesh at all in
    this world; ``hints``: what the layers above added (also the message's tail)."""

    def __init__(
        self,
        message: str,
        *,
        mesh: str,
        rank: int,
        arrived: Sequence[int],
        missing: Optional[Sequence[int]],
        quiet: Optional[Sequence[int]],
        timeout: timedelta,
    ) -> None:
        self.mesh = mesh
        self.rank = rank
        self.arrived = list(arrived)
        self.missing = None if missing is None else list(missing)
        self.quiet = None if quiet is None else list(quiet)
        self.timeout = timeout
        self.hints = _collect_hints(self)
        super().__init__(" ".join([message if not self.hints or message.endswith(".") else message + ".", *self.hints]))


def add_hint(hint: Hint) -> None:
    """Consult ``hint(error)`` for every later :class:`AbsentRanksError` (once, however often added)."""
    with _lock:
        if hint not in _hints:
            _hints.append(hint)


def remove_hint(hint: Hint) -> None:
    """Stop consulting ``hint`` (nothing happens if it is not registered)."""
    with _lock:
        if hint in _hints:
            _hints.remove(hint)


def set_quiet_bound(bound: Optional[QuietBound]) -> None:
    """Bound the wait of every later mesh check for members that have not announced themselves:
    ``bound()`` (asked at each check) is the bound, ``None`` (or a ``bound()`` of ``None``) none of its
    own, the check's timeout then."""
    global _quiet_bound
    with _lock:
        _quiet_bound = bound


def quiet_bound() -> Optional[timedelta]:
    """The bound :func:`set_quiet_bound` set for this check (``None``: the check's own timeout)."""
    with _lock:
        bound = _quiet_bound
    return None if bound is None else bound()


def announce(store: Any, world: Any, rank: int) -> None:
    """Record once per world that this rank builds meshes (one store append)."""
    with _lock:
        if world in _announced:
            return
        _announced.add(world)
    store.append(BUILDERS_KEY, f"{rank},")


def builders(store: Any) -> Optional[set[int]]:
    """The ranks that have announced themselves in this world (``None`` if the store cannot say)."""
    try:
        raw = store.get(BUILDERS_KEY).decode() if store.check([BUILDERS_KEY]) else ""
    except (RuntimeError, NotImplementedError, AttributeError):
        return None
    return {int(r) for r in raw.split(",") if r}


def quiet_ranks(store: Any, missing: Sequence[int]) -> Optional[list[int]]:
    """The ranks of ``missing`` that have never announced themselves (``None`` if the store cannot say)."""
    known = builders(store)
    return None if known is None else [r for r in missing if r not in known]


def _collect_hints(error: AbsentRanksError) -> list[str]:
    with _lock:
        hints = list(_hints)
    out = []
    for hint in hints:
        try:
            text = hint(error)
        except Exception:  # a hint must never replace the error it explains
            logger.exception("a hint for %s failed; it is left out", type(error).__name__)
            continue
        if text:
            out.append(text)
    return out
