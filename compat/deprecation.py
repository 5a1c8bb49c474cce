"""Deprecation warnings for the legacy process-group APIs the compat layer re-implements.

Every legacy entry point warns with a :class:`LegacyAPIDeprecationWarning` whose message starts with
``TODOV1:`` and says what to write: the next step of the legacy API's catalog row
(:mod:`ds_mesh_advice`, which the codemods' ``TODOV1`` comments read too), or a site's own, and the
``ds-migrate --explain <code>`` that prints the row; lines of at most 100 characters. It
warns once per call site per job: rank 0 shows it (a third-party package's: local rank 0 of each
node, whose installed packages can differ), the other ranks stay quiet unless a filter asks every
occurrence (``"error"``, ``"always"``); standard ``warnings`` filters silence it or turn it into an error.

A call site already warned about costs one frame lookup and one dict probe; ``warnings`` itself is
only consulted the first time a site is seen (and again after any change to the warning filters,
so ``simplefilter("error")`` later still raises).

Hot getters (``hot=True`` entries, the ones DeepSpeed calls on every step) bound that cost instead:
they probe their call sites on their first :data:`HOT_PROBES` calls after each filter change, then
stop (a frame lookup costs more than the getter itself, and in a launch-bound training step the
probes alone cost about 0.25%). A call site a hot getter first reaches after that is not reported;
probing costs about a millisecond per getter and filter change.
"""

from __future__ import annotations

import os
import shlex
import sys
import warnings
from types import FrameType
from typing import Optional

import ds_mesh_advice
from _ds_mesh_startup import LOCAL_RANK_VARS, RANK_VARS

__all__ = [
    "HOT_PROBES",
    "LegacyAPIDeprecationWarning",
    "LegacyEntry",
    "ThirdPartyLegacyWarning",
    "end_probing",
    "job_ranks",
    "legacy_entry",
    "speaks_here",
    "warn_legacy",
]

HOT_PROBES = 1_000  # call-site probes per hot getter and filter change


class LegacyAPIDeprecationWarning(DeprecationWarning):
    """A legacy DeepSpeed process-group API was called; the message names its mesh replacement."""


class ThirdPartyLegacyWarning(LegacyAPIDeprecationWarning):
    """A legacy API was called by an installed third-party package (not the user's code); shown once
    per package. Silence with ``warnings.filterwarnings("ignore", category=ThirdPartyLegacyWarning)``."""


_third_party_warned: set[str] = set()  # distributions already warned about


def _advice(legacy_name: str, replacement: str, row: str) -> tuple[str, str]:
    """``(what to write, where the rest is)`` for a warning: the catalog row's next step (and its
    full replacement where that says more) when ``replacement`` is the row's, else ``replacement``
    itself; ``ds-migrate --explain <code>`` for a catalog row, else MIGRATION.md."""
    try:
        cat = ds_mesh_advice.row(row)
    except KeyError:
        cat = None
    if cat is not None and replacement == cat.advice:
        step = cat.next_step + (f" (in full: {cat.advice})" if cat.short else "")
    else:
        verb = replacement.split(" ", 1)[0]
        step = replacement if verb in ds_mesh_advice.NEXT_VERBS else f"use {replacement}"
    where = f"ds-migrate --explain {shlex.quote(cat.code)}" if cat is not None else f"MIGRATION.md row '{row}'"
    return step, where


def third_party_message(legacy_name: str, replacement: str, row: str, dist: str, version: str, where: str) -> str:
    step, see = _advice(legacy_name, replacement, row)
    return ds_mesh_advice.wrap(
        f"TODOV1: {legacy_name} is called by {dist} {version} ({where}), not your code: your script needs no "
        f"change. {dist} uses a deprecated DeepSpeed API (its replacement: {step}; {see}); the warning goes "
        f"away with a {dist} release that stops calling it (upgrade {dist}, or report it to {dist}). Shown once "
        "per package; silence it with warnings.filterwarnings('ignore', "
        "category=compat.deprecation.ThirdPartyLegacyWarning)."
    )


def message(legacy_name: str, replacement: str, row: str) -> str:
    """The warning text: what to write instead of ``legacy_name``, in lines of at most 100 characters."""
    step, see = _advice(legacy_name, replacement, row)
    return ds_mesh_advice.wrap(f"TODOV1: {legacy_name} is deprecated; {step} ({see})")


class LegacyEntry:
    """One legacy API: its warning text and the call sites that already warned."""

    __slots__ = ("legacy_name", "replacement", "row", "text", "sites", "_seen", "hot", "budget")

    def __init__(self, legacy_name: str, replacement: str, row: Optional[str] = None, *, hot: bool = False) -> None:
        self.legacy_name = legacy_name
        self.replacement = replacement
        self.row = row or legacy_name
        self.text = message(legacy_name, replacement, self.row)
        # f_lasti -> code object of the last site seen at that offset (the fast-path probe)
        self.sites: dict[int, object] = {}
        self._seen: set[tuple[object, int]] = set()
        self.hot = hot
        self.budget = HOT_PROBES if hot else 0  # probes left (hot entries only)

    def probe(self, frame: FrameType) -> None:
        """A hot getter's call-site check (the getter tests ``budget`` first)."""
        self.budget -= 1
        if self.sites.get(frame.f_lasti) is not frame.f_code:
            self.hit(frame)

    def warn(self, depth: int = 1) -> None:
        """Warn for the caller ``depth`` frames above the caller of this method, once per site."""
        frame = sys._getframe(depth + 1)
        if self.sites.get(frame.f_lasti) is not frame.f_code:
            self.hit(frame)

    def hit(self, frame: FrameType) -> None:
        """Slow path: a site not seen since the last filter change."""
        key = (frame.f_code, frame.f_lasti)  # holds the code: its id cannot be reused by another
        if key not in self._seen and self._third_party(frame):
            self._seen.add(key)
        elif key not in self._seen:
            module_globals = frame.f_globals
            module = module_globals.get("__name__", "<unknown>")
            if speaks_here(LegacyAPIDeprecationWarning, self.text, module, frame.f_lineno):
                warnings.warn_explicit(
                    self.text,
                    LegacyAPIDeprecationWarning,
                    frame.f_code.co_filename,
                    frame.f_lineno,
                    module,
                    module_globals.setdefault("__warningregistry__", {}),
                    module_globals,
                )
            self._seen.add(key)  # only after warn returned: an "error" filter keeps raising
        self.sites[frame.f_lasti] = frame.f_code

    def _third_party(self, frame: FrameType) -> bool:
        """A site inside an installed package: one warning per package saying so; True if handled."""
        from .call_sites import third_party

        owner = third_party(frame)
        if owner is None:
            return False
        dist, version = owner
        if dist not in _third_party_warned:
            module_globals = frame.f_globals
            name = str(module_globals.get("__name__", "<unknown>"))
            filename = frame.f_code.co_filename
            where = f"{filename.replace(os.sep, '/').rsplit('-packages/', 1)[-1]}:{frame.f_lineno}"
            text = third_party_message(self.legacy_name, self.replacement, self.row, dist, version, where)
            # installed packages (and their versions) can differ between nodes: once per node
            if speaks_here(ThirdPartyLegacyWarning, text, name, frame.f_lineno, per_node=True):
                warnings.warn_explicit(
                    text,
                    ThirdPartyLegacyWarning,
                    frame.f_code.co_filename,
                    frame.f_lineno,
                    name,
                    module_globals.setdefault("__warningregistry__", {}),
                    module_globals,
                )
            _third_party_warned.add(dist)  # after warn returned: an "error" filter keeps raising
        return True

    def reset(self) -> None:
        self.sites.clear()
        self._seen.clear()
        self.budget = HOT_PROBES if self.hot else 0


# --- one warning per job, not one per rank -------------------------------------------------------
# RANK_VARS / LOCAL_RANK_VARS: the launchers' rank variables (one list, the start-up hook's)
LOUD_ACTIONS = ("error", "always")  # filters that ask every occurrence, so every rank obeys them


def _env_rank(names: tuple[str, ...]) -> Optional[int]:
    for name in names:
        value = os.environ.get(name, "").strip()
        if value.isdigit():
            return int(value)
    return None


def job_ranks() -> tuple[int, int]:
    """``(rank, local rank)`` of this process in its job (``(0, 0)`` outside a distributed job)."""
    rank = _env_rank(RANK_VARS)
    dist = sys.modules.get("torch.distributed")  # never imports torch
    if dist is not None and getattr(dist, "is_available", lambda: False)() and dist.is_initialized():
        rank = dist.get_rank()
    rank = rank or 0
    local = _env_rank(LOCAL_RANK_VARS)
    return rank, rank if local is None else local


def filter_action(category: type, text: str, module: str, lineno: int) -> str:
    """The action the ``warnings`` filters take for this warning (as ``warnings.warn_explicit``
    decides it, without the once-per-location registries)."""
    for action, msg, cat, mod, line in warnings.filters:
        if _matches(msg, text) and issubclass(category, cat) and _matches(mod, module) and line in (0, lineno):
            return action
    return warnings.defaultaction


def _matches(pattern: object, value: str) -> bool:
    # as warnings' C code: None matches all, a plain str (a filter added by hand) only itself
    if pattern is None:
        return True
    if isinstance(pattern, str):
        return pattern == value
    return bool(pattern.match(value))  # type: ignore[attr-defined]


def speaks_here(category: type, text: str, module: str, lineno: int, *, per_node: bool = False) -> bool:
    """Whether this rank shows a TODOV1 warning: rank 0 of the job (``per_node``: local rank 0 of
    each node) shows it, the other ranks only when a filter asks every occurrence (``error``,
    ``always``), so one warning per call site per job, and ``"error"`` still raises everywhere."""
    rank, local = job_ranks()
    if (local if per_node else rank) == 0:
        return True
    return filter_action(category, text, module, lineno) in LOUD_ACTIONS


_ENTRIES: dict[str, LegacyEntry] = {}


def legacy_entry(
    legacy_name: str, replacement: str, row: Optional[str] = None, *, hot: bool = False, key: Optional[str] = None
) -> LegacyEntry:
    """The (shared) entry for a legacy API, for shims that inline the fast-path check (``key``: one
    entry per site-specific advice, e.g. the ``"mesh"`` section of each adopted mpu layout)."""
    key = legacy_name if key is None else key
    entry = _ENTRIES.get(key)
    if entry is None:
        entry = _ENTRIES[key] = LegacyEntry(legacy_name, replacement, row, hot=hot)
    return entry


def warn_legacy(legacy_name: str, replacement: str, row: Optional[str] = None) -> None:
    """Warn that ``legacy_name`` was called, once per call site of the function calling this."""
    entry = _ENTRIES.get(legacy_name) or legacy_entry(legacy_name, replacement, row)
    frame = sys._getframe(2)
    if entry.sites.get(frame.f_lasti) is not frame.f_code:
        entry.hit(frame)


def end_probing() -> None:
    """Stop every hot getter's call-site probing now, as its first :data:`HOT_PROBES` calls after
    the last filter change do (a benchmark of the steady state, after a filter change)."""
    for entry in _ENTRIES.values():
        entry.budget = 0


def _forget_sites() -> None:
    for entry in _ENTRIES.values():
        entry.reset()


def _hook_filter_changes() -> None:
    # warnings calls _filters_mutated() on every filter change (simplefilter, catch_warnings, ...);
    # a changed filter set may want a site warned (or raised) again.
    original = warnings._filters_mutated  # type: ignore[attr-defined]
    if getattr(original, "_compat_hook", False):
        return

    def filters_mutated() -> None:
        original()
        _forget_sites()

    filters_mutated._compat_hook = True  # type: ignore[attr-defined]
    warnings._filters_mutated = filters_mutated  # type: ignore[attr-defined]


def _show_by_default() -> None:
    """Show our category once per site unless some filter says otherwise.

    Python's stock ``ignore::DeprecationWarning`` entry would hide it outside ``__main__``; our
    ``default`` entry goes just before that entry, so users' own filters (earlier or later ones,
    ``-W`` options) still win.
    """
    if sys.warnoptions:
        return
    stock = ("ignore", None, DeprecationWarning, None, 0)
    filters = warnings.filters
    index = next((i for i, f in enumerate(filters) if f == stock), len(filters))
    if ("default", None, LegacyAPIDeprecationWarning, None, 0) not in filters:
        filters.insert(index, ("default", None, LegacyAPIDeprecationWarning, None, 0))
        warnings._filters_mutated()  # type: ignore[attr-defined]


_hook_filter_changes()
_show_by_default()
