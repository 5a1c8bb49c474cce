"""Deprecation warnings for the legacy process-group APIs the compat layer re-implements.

Every legacy entry point warns with a :class:`LegacyAPIDeprecationWarning` whose message starts with
``TODOV1:``, names the mesh replacement and the MIGRATION.md row (the legacy qualified name). It
warns once per call site, and standard ``warnings`` filters silence it or turn it into an error.

A call site already warned about costs one frame lookup and one dict probe; ``warnings`` itself is
only consulted the first time a site is seen (and again after any change to the warning filters,
so ``simplefilter("error")`` later still raises).

Hot getters (``hot=True`` entries) bound that cost instead: they probe their call sites on their
first :data:`HOT_PROBES` calls after each filter change, then stop (a frame lookup costs more than
the getter itself). A call site a hot getter first reaches after that is not reported; the total
probing cost stays under a few milliseconds per getter.
"""

from __future__ import annotations

import os
import sys
import warnings
from types import FrameType
from typing import Optional

__all__ = ["HOT_PROBES", "LegacyAPIDeprecationWarning", "LegacyEntry", "ThirdPartyLegacyWarning", "legacy_entry",
           "warn_legacy"]

HOT_PROBES = 100_000  # call-site probes per hot getter and filter change


class LegacyAPIDeprecationWarning(DeprecationWarning):
    """A legacy DeepSpeed process-group API was called; the message names its mesh replacement."""


class ThirdPartyLegacyWarning(LegacyAPIDeprecationWarning):
    """A legacy API was called by an installed third-party package (not the user's code); shown once
    per package. Silence with ``warnings.filterwarnings("ignore", category=ThirdPartyLegacyWarning)``."""


_third_party_warned: set[str] = set()  # distributions already warned about


def third_party_message(legacy_name: str, replacement: str, row: str, dist: str, version: str, where: str) -> str:
    return (f"TODOV1: {legacy_name} is called by {dist} {version} ({where}), not your code: your script needs no "
            f"change. {dist} uses a deprecated DeepSpeed API (its replacement: {replacement}; MIGRATION.md row "
            f"'{row}'); the warning goes away with a {dist} release that stops calling it (upgrade {dist}, or "
            f"report it to {dist}). Shown once per package; silence it with warnings.filterwarnings('ignore', "
            f"category=compat.deprecation.ThirdPartyLegacyWarning).")


def message(legacy_name: str, replacement: str, row: str) -> str:
    return f"TODOV1: {legacy_name} is deprecated; use {replacement} (MIGRATION.md row '{row}')"


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
            registry = module_globals.setdefault("__warningregistry__", {})
            warnings.warn_explicit(
                self.text,
                LegacyAPIDeprecationWarning,
                frame.f_code.co_filename,
                frame.f_lineno,
                module_globals.get("__name__", "<unknown>"),
                registry,
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
            warnings.warn_explicit(
                third_party_message(self.legacy_name, self.replacement, self.row, dist, version, where),
                ThirdPartyLegacyWarning, frame.f_code.co_filename, frame.f_lineno, name,
                module_globals.setdefault("__warningregistry__", {}), module_globals,
            )
            _third_party_warned.add(dist)  # after warn returned: an "error" filter keeps raising
        return True

    def reset(self) -> None:
        self.sites.clear()
        self._seen.clear()
        self.budget = HOT_PROBES if self.hot else 0


_ENTRIES: dict[str, LegacyEntry] = {}


def legacy_entry(legacy_name: str, replacement: str, row: Optional[str] = None, *, hot: bool = False) -> LegacyEntry:
    """The (shared) entry for a legacy API, for shims that inline the fast-path check."""
    entry = _ENTRIES.get(legacy_name)
    if entry is None:
        entry = _ENTRIES[legacy_name] = LegacyEntry(legacy_name, replacement, row, hot=hot)
    return entry


def warn_legacy(legacy_name: str, replacement: str, row: Optional[str] = None) -> None:
    """Warn that ``legacy_name`` was called, once per call site of the function calling this."""
    entry = _ENTRIES.get(legacy_name) or legacy_entry(legacy_name, replacement, row)
    frame = sys._getframe(2)
    if entry.sites.get(frame.f_lasti) is not frame.f_code:
        entry.hit(frame)


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
