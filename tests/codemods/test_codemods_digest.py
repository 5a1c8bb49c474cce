"""The codemods' output on a fixed subset of the installed deepspeed 0.19.8 is pinned byte for byte
(a layout change of mesh_core / the repo must not change what the codemods write). After a codemod
change that is *meant* to change the output: ``python tools/codemods_digest.py --write``."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.deepspeed


def _root() -> Path:
    here = Path(__file__).resolve().parent.parent
    while not (here / "pyproject.toml").exists():
        here = here.parent
    return here


def _tool():
    spec = importlib.util.spec_from_file_location("codemods_digest", _root() / "tools" / "codemods_digest.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_codemods_output_on_the_deepspeed_subset_is_unchanged():
    tool = _tool()
    stored = json.loads(tool.STORED.read_text(encoding="utf-8"))
    assert sorted(stored) == sorted(tool.SUBSET)
    found = tool.digests(tool.SUBSET)
    changed = sorted(f for f in stored if found[f] != stored[f])
    assert not changed, (
        f"the codemods' output changed for deepspeed/{changed}; if meant: python tools/codemods_digest.py --write"
    )
