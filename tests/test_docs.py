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
DOCS = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md")])


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
