"""What a user can see carries no internal tracker wording ("issue 21"): the shipped sources (their
messages, docstrings for help(), and comments, which tracebacks print), the examples and the docs."""

from __future__ import annotations

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parent.parent
SHIPPED = ("mesh_core", "compat", "codemods", "ds_mesh_advice", "examples")
TRACKER = re.compile(r"\bissue ?#?\d+", re.IGNORECASE)  # "issues 6,464 calls" (a verb) is not one


def _files():
    yield from ROOT.glob("_ds_mesh_*.py")
    for folder in SHIPPED:
        yield from (ROOT / folder).rglob("*.py")
    for doc in ("README.md", "MIGRATION.md", "examples/README.md", *map(str, (ROOT / "docs").glob("*.md"))):
        yield ROOT / doc


def test_no_issue_numbers_where_users_look():
    found = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in _files()
        if path.is_file()
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if TRACKER.search(line)
    ]
    assert not found, "internal tracker wording a user would see:\n" + "\n".join(found)


def test_the_pattern_finds_tracker_wording():
    assert TRACKER.search("check_before_world(config)  # issue 21: bad values")
    assert TRACKER.search("(Issue #7)") and not TRACKER.search("issues 6,464 calls")
