"""The user-facing docs: a README for users (short, the set-up commands that work), no progress
diary, and every figure's command naming a script that exists."""

from __future__ import annotations

import re
from pathlib import Path

import pytest


def _root() -> Path:
    here = Path(__file__).resolve().parent
    while not (here / "pyproject.toml").exists():
        here = here.parent
    return here


ROOT = _root()
README = (ROOT / "README.md").read_text(encoding="utf-8")
SETUP = (
    'python3 -m venv .venv && .venv/bin/pip install torch==2.13.0 && .venv/bin/pip install -e ".[test,plot]" '
    "&& .venv/bin/python -m mesh_core show"
)
TEST = "DS_ACCELERATOR=cpu .venv/bin/python -m pytest"
DOCS = sorted(
    [ROOT / "README.md", ROOT / "MIGRATION.md", ROOT / "examples" / "README.md", *(ROOT / "docs").glob("*.md")]
)
# a tracker id a reader cannot look up ("issue 10m", "issues 10m and 10e", "bug B8"); "issues 6,464
# calls" (a verb and a number) is prose
TRACKER_ID = re.compile(r"\b[Ii]ssues? #?\d+[a-z]?\b(?![,.]\d)|\b(?:bug )?B\d{1,2}\b")
# a log line pasted from a run: "[2026-12-02 13:56:35,455] [WARNING] [real_accelerator.py:213:...]"
PASTED_LOG = re.compile(r"^\s*\[\d{4}-\d\d-\d\d [\d:,.]+\]|\[(?:DEBUG|INFO|WARNING|ERROR)\] \[\w+\.py:\d+", re.M)


def test_readme_is_short_and_has_the_two_setup_commands():
    assert len(README.splitlines()) <= 300
    assert SETUP in README and TEST in README
    for way in ("New code on the mesh", "Unchanged DeepSpeed code under the shim", "Migrating code"):
        assert way in README, way


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_no_progress_diary(doc):
    text = doc.read_text(encoding="utf-8")
    dated = re.findall(r"\b20\d\d-\d\d-\d\d\b|\b(?:first|second|third|fourth|fifth) session\b", text, flags=re.I)
    assert not dated, f"{doc.name} reads like a diary: {dated[:3]} (history belongs in git / CHANGELOG.md)"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_links_and_scripts_exist(doc):
    text = doc.read_text(encoding="utf-8")
    links = [t for t in re.findall(r"\]\(([^)#\s]+)[^)]*\)", text) if "://" not in t]
    missing = [t for t in links if not (doc.parent / t).exists()]
    scripts = set(re.findall(r"\b((?:bench|tools|examples)/[\w/]+\.py)\b", text))
    missing += sorted(s for s in scripts if not (ROOT / s).exists())
    assert not missing, f"{doc.name} names files that do not exist: {missing}"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_no_tracker_ids_or_pasted_logs(doc):
    text = doc.read_text(encoding="utf-8")
    ids = [m.group(0) for m in TRACKER_ID.finditer(text)]
    assert not ids, f"{doc.name} cites tracker ids a reader cannot look up: {ids[:5]}"
    logs = [m.group(0) for m in PASTED_LOG.finditer(text)]
    assert not logs, f"{doc.name} has a log line pasted into it: {logs[:2]}"


def test_the_checks_catch_what_they_are_for():
    assert TRACKER_ID.search("the sections of issues 10m and 10e") and TRACKER_ID.search("diverge, B8)")
    assert (
        TRACKER_ID.search("(issue 22)")
        and not TRACKER_ID.search("issues 6,464 calls")
        and not TRACKER_ID.search("BF16")
    )
    log = "[2026-12-02 13:56:35,455] [WARNING] [real_accelerator.py:213:get_accelerator] Setting accelerator to CPU."
    assert PASTED_LOG.search(log) and not PASTED_LOG.search("| `ds_config` | `[WARNING]` level |")
