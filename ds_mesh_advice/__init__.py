"""The catalog of the legacy DeepSpeed APIs: one row per API, the one place advice is written.

``catalog.json`` holds, per legacy API (grid methods and attributes, topology classes,
``deepspeed.utils.groups`` functions, ``mpu`` and ``bwc_*`` calls, ``deepspeed.initialize``
parameters and config keys, logging and ``deepspeed.comm`` calls): its replacement (Markdown), the
codemod that handles it, notes, the codemod's action (``rewrite`` / ``flag`` / ``keep``), the mesh
expression that answers it where there is one (``<mesh>`` the model's mesh, ``N`` an ep size) and
the MIGRATION.md section (anchor) it is listed in; and, per kind of ``# TODOV1:`` site the codemods
leave, what that kind means. Everything else reads it: the shim's warnings (:mod:`compat`), the
codemods' templates and ``TODOV1`` comments, MIGRATION.md's tables
(``tools/migration_tables.py`` writes them; a test holds them equal) and ``ds-migrate --explain``.
A data package of its own: ``compat`` and ``codemods`` both read it and neither imports the other.
"""

from __future__ import annotations

import functools
import json
import pkgutil
import textwrap
from dataclasses import dataclass
from typing import Mapping, Optional

__all__ = [
    "ACTIONS",
    "NEXT_VERBS",
    "WIDTH",
    "wrap",
    "Kind",
    "Row",
    "explain",
    "find",
    "kinds",
    "plain",
    "replacement",
    "row",
    "rows",
    "table",
]

_NAME = "catalog.json"
ACTIONS = ("rewrite", "flag", "keep")
WIDTH = 100  # the longest line of advice text
# the words a next step starts with (a TODOV1 comment's or warning's "what to write")
NEXT_VERBS = (
    "use",
    "write",
    "put",
    "pass",
    "hand",
    "build",
    "call",
    "add",
    "bind",
    "import",
    "remove",
    "describe",
    "keep",
    "move",
    "filter",
    "drop",
    "set",
)


@dataclass(frozen=True)
class Row:
    """One legacy API of the catalog."""

    api: str  # the MIGRATION.md cell (Markdown)
    replacement: str  # Markdown
    action: str  # one of ACTIONS: what the codemods do with a site of it
    section: str  # the catalog section id ("groups", "grid", "topology", "mpu", ...)
    anchor: str  # the MIGRATION.md anchor of its section
    short: str = ""  # the next step in a few words, where "use <replacement>" is long
    codemod: str = ""
    notes: str = ""
    mesh: Optional[str] = None  # the mesh expression answering it ("<mesh>", "N" placeholders)
    form: Optional[str] = None  # grid rows: "call", "attribute" or "class"
    code: str = ""  # its ds-migrate --explain code where the name is not a dotted path (else derived)

    @property
    def name(self) -> str:
        """The API as plain text (the key of :func:`table`), e.g. ``deepspeed.utils.groups.initialize``."""
        return self.api.replace("`", "")

    @property
    def advice(self) -> str:
        """The replacement as plain text (a warning, a code comment): no Markdown."""
        return self.replacement.replace("`", "")

    @property
    def next_step(self) -> str:
        """What to write, in one short clause (a ``TODOV1`` comment's text)."""
        return self.short or f"use {self.advice}"

    def template(self, mesh: str = "{mesh}", n: str = "{n}") -> Optional[str]:
        """The mesh expression with ``<mesh>`` / ``N`` as format fields (``None`` without one)."""
        if self.mesh is None:
            return None
        return self.mesh.replace("<mesh>", mesh).replace("(N)", f"({n})")


@dataclass(frozen=True)
class Kind:
    """A kind of ``# TODOV1:`` site the codemods leave, and what to do about it."""

    id: str  # its MIGRATION.md anchor
    kind: str  # the codemods' counter name
    short: str  # the next step in a few words
    text: str  # Markdown

    @property
    def code(self) -> str:
        """Its ``ds-migrate --explain`` code: the id without ``todov1-`` (``groups``, ``grid-use``, ...)."""
        return self.id.removeprefix("todov1-")


@functools.lru_cache(maxsize=None)
def _data() -> dict:
    data = pkgutil.get_data(__name__, _NAME)  # a wheel, an editable install or a zipapp alike
    if data is None:
        raise FileNotFoundError(f"{__name__}/{_NAME} is missing from this installation")
    return json.loads(data.decode("utf-8"))


def sections() -> list[dict]:
    """The catalog's sections as stored (heading, intro, rows), in MIGRATION.md's order."""
    return _data()["sections"]


@functools.lru_cache(maxsize=None)
def rows() -> tuple[Row, ...]:
    """Every row of the catalog, in MIGRATION.md's order."""
    cells = [(section, cell) for section in sections() for cell in section["rows"]]
    codes = _codes([cell for _, cell in cells])
    return tuple(
        Row(section=section["id"], anchor=section["anchor"], **{"code": codes[cell["api"].replace("`", "")], **cell})
        for section, cell in cells
    )


@functools.lru_cache(maxsize=None)
def _by_name() -> dict[str, Row]:
    return {r.name: r for r in rows()}


def _codes(found: list[dict]) -> dict[str, str]:
    """Each dotted name's ``ds-migrate --explain`` code: the shortest tail that names it alone (and
    is no kind's code)."""
    names = [cell["api"].replace("`", "") for cell in found]
    taken = {k["id"].removeprefix("todov1-") for k in _data()["kinds"]}
    codes = {}
    for name in names:
        parts = name.split(".")
        for start in range(len(parts) - 1, -1, -1):
            tail = ".".join(parts[start:])
            if tail not in taken and sum(1 for other in names if other == tail or other.endswith("." + tail)) == 1:
                codes[name] = tail
                break
        else:
            codes[name] = name
    return codes


@functools.lru_cache(maxsize=None)
def kinds() -> tuple[Kind, ...]:
    """Every kind of ``TODOV1`` site, in MIGRATION.md's order."""
    return tuple(Kind(**k) for k in _data()["kinds"])


def table() -> Mapping[str, str]:
    """Every legacy API name → its replacement (Markdown)."""
    return {r.name: r.replacement for r in rows()}


def row(legacy_name: str) -> Row:
    """The row of ``legacy_name`` (its plain name); KeyError naming the catalog if none."""
    try:
        return _by_name()[legacy_name]
    except KeyError:
        raise KeyError(
            f"{legacy_name!r} has no row in {__name__}/{_NAME}; add it there "
            "(then python tools/migration_tables.py --write)"
        ) from None


def replacement(legacy_name: str) -> str:
    """The replacement of ``legacy_name`` as MIGRATION.md writes it (Markdown)."""
    return row(legacy_name).replacement


def plain(legacy_name: str) -> str:
    """The replacement of ``legacy_name`` as plain text (a warning, a code comment): no Markdown."""
    return row(legacy_name).advice


def find(code: str) -> list:
    """The rows or kinds ``code`` names: a kind id (``todov1-groups``), a full API name, or its
    last dotted parts (``_get_expert_parallel_group``, ``PipelineParallelGrid.topology``)."""
    code = code.strip().replace("`", "")
    matched: list = [k for k in kinds() if code in (k.id, k.kind, k.code)]
    if code in _by_name():
        return matched + [_by_name()[code]]
    by_code = [r for r in rows() if r.code == code]
    if by_code or matched:
        return matched + by_code
    return [r for r in rows() if r.name.endswith("." + code)]


def explain(code: str) -> str:
    """What ``ds-migrate --explain <code>`` prints: each matching row or kind in full; a short
    line naming what is valid when nothing matches."""
    found = find(code)
    if not found:
        return (
            f"no legacy API or TODOV1 kind is called {code!r}; give a kind ("
            + ", ".join(k.id for k in kinds())
            + ") or an API name such as _get_data_parallel_group"
        )
    parts = []
    for item in found:
        if isinstance(item, Kind):
            parts.append(
                _wrap(f"{item.code} ({item.kind}): {item.short}.", "")
                + "\n"
                + _wrap(_unmark(item.text), "  ")
                + _kind_table(item)
                + "\n  (ds-migrate --explain <function or method> prints its row)"
            )
            continue
        lines = [
            _wrap(f"{item.name} (code {item.code})", ""),
            _wrap(f"next step: {item.next_step}", "  "),
            _wrap(f"replacement: {item.advice}", "  "),
            _wrap(f"codemod: {item.action}" + (f" ({_unmark(item.codemod)})" if item.codemod else ""), "  "),
        ]
        if item.mesh:
            lines.append(_wrap(f"mesh expression: {item.mesh}", "  "))
        if item.notes:
            lines.append(_wrap(f"notes: {_unmark(item.notes)}", "  "))
        lines.append(f"  MIGRATION.md#{item.anchor}")
        parts.append("\n".join(lines))
    return "\n\n".join(parts)


# the kinds whose text points at a table "below" -> that table's section (printed under the kind)
_KIND_TABLES = {
    "todov1-groups": "groups",
    "todov1-grid-use": "grid",
    "todov1-comm": "comm",
    "todov1-mpu-internal": "mpu-internal",
}


def _kind_table(kind: Kind) -> str:
    """The table a kind's text points at, one line per row: its code and what to write."""
    section = _KIND_TABLES.get(kind.id)
    if section is None:
        return ""
    lines = [f"\n  the table (MIGRATION.md#{next(s['anchor'] for s in sections() if s['id'] == section)}):"]
    lines += [_wrap(f"{r.code}: {_unmark(r.next_step)}", "    ") for r in rows() if r.section == section]
    return "\n".join(lines)


def wrap(text: str, indent: str = "") -> str:
    """``text`` in lines of at most :data:`WIDTH` characters (continuation lines indented two more)."""
    return textwrap.fill(
        text,
        WIDTH,
        initial_indent=indent,
        subsequent_indent=indent + "  ",
        break_long_words=False,
        break_on_hyphens=False,
    )


_wrap = wrap


def _unmark(text: str) -> str:
    return " ".join(text.replace("`", "").replace("**", "").split())
