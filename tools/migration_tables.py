"""Write MIGRATION.md's catalog parts from ``ds_mesh_advice/catalog.json``.

MIGRATION.md marks each generated part with ``<!-- catalog:begin <what> -->`` …
``<!-- catalog:end -->``, ``<what>`` being ``kinds`` (the TODOV1 kinds) or a comma-separated list
of catalog section ids (their tables). Edit the catalog, then::

    python tools/migration_tables.py --write     # rewrite MIGRATION.md's generated parts
    python tools/migration_tables.py --check     # exit 1 when MIGRATION.md differs (what CI runs)
"""

from __future__ import annotations

import argparse
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import ds_mesh_advice  # noqa: E402

MIGRATION = ROOT / "MIGRATION.md"
HEADER = ["legacy API", "replacement", "codemod", "notes"]
FIELDS = {"legacy API": "api", "replacement": "replacement", "codemod": "codemod", "notes": "notes"}
_BLOCK = re.compile(r"(<!-- catalog:begin (\S+) -->\n)(.*?)(<!-- catalog:end -->)", re.S)


def render_kinds() -> str:
    return "\n".join(f'<a id="{k.id}"></a>\n{k.text}\n' for k in ds_mesh_advice.kinds())


def render_section(section: dict) -> str:
    header = section.get("header", HEADER)
    fields = ["api", "replacement"] + [FIELDS.get(h, "notes") for h in header[2:]]
    lines = [f'<a id="{section["anchor"]}"></a>', f"### {section['heading']}", ""]
    if section.get("intro"):
        lines += [section["intro"], ""]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in section["rows"]:
        lines.append("| " + " | ".join(row.get(f, "") for f in fields) + " |")
    return "\n".join(lines) + "\n"


def render(what: str) -> str:
    if what == "kinds":
        return render_kinds()
    by_id = {s["id"]: s for s in ds_mesh_advice.sections()}
    return "\n".join(render_section(by_id[sid]) for sid in what.split(","))


def generated(text: str) -> str:
    """``text`` (MIGRATION.md) with every generated part rendered from the catalog."""
    return _BLOCK.sub(lambda m: m.group(1) + render(m.group(2)) + m.group(4), text)


def covered(text: str) -> set[str]:
    """The section ids MIGRATION.md's generated parts hold."""
    return {sid for m in _BLOCK.finditer(text) if m.group(2) != "kinds" for sid in m.group(2).split(",")}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true")
    mode.add_argument("--check", action="store_true")
    args = parser.parse_args(argv)
    text = MIGRATION.read_text(encoding="utf-8")
    new = generated(text)
    if args.check:
        if new != text:
            sys.stderr.write(
                "MIGRATION.md differs from ds_mesh_advice/catalog.json: run python tools/migration_tables.py --write\n"
            )
            return 1
        return 0
    if new != text:
        MIGRATION.write_text(new, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
