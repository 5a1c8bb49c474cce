"""Every shell command of README.md, MIGRATION.md and examples/README.md runs as written after the
two set-up commands (``.venv/bin/X`` is this interpreter's X, run on this tree). The ones that need
several processes run elsewhere: the examples in tests/e2e/test_e2e_examples.py, the suite is this."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ("README.md", "MIGRATION.md", "examples/README.md")
# what a command starts with -> how it runs here (None: runs elsewhere, for the reason given)
AS = {
    ".venv/bin/python": [sys.executable],
    ".venv/bin/mesh": [sys.executable, "-m", "mesh_core"],
    ".venv/bin/ds-migrate": [sys.executable, "-m", "codemods.migrate"],
}
ELSEWHERE = {
    "python3": "the set-up itself (.ci/run runs it in a fresh virtualenv)",
    ".venv/bin/torchrun": "several gloo processes: tests/e2e/test_e2e_examples.py runs the examples",
    "export": "an environment setting",
    ".venv/bin/deepspeed": "several nodes: tests/test_docs_multinode.py runs docs/multinode.md's launches (-m slow)",
    "srun": "a Slurm cluster (docs/multinode.md)",
}
SHELL = {"echo", "cd", "git", "mkdir", "rm", "cp", "ls", "cat", "source"}  # not Python tools
LEGACY = "from deepspeed.utils import groups\n\ndef f():\n    return groups._get_data_parallel_world_size()\n"


def commands(docs=DOCS) -> list[tuple[str, str]]:
    """``(doc, command)`` of every line of the docs' shell blocks (a continued line counts once)."""
    found = []
    for doc in docs:
        text = (ROOT / doc).read_text(encoding="utf-8")
        for block in re.findall(r"```(?:bash|sh)\n(.*?)```", text, re.S):
            continued = False
            for line in block.splitlines():
                if line.strip() and not continued:
                    found.append((doc, line))
                continued = line.rstrip().endswith("\\")
    return found


ALL_DOCS = (*DOCS, *(str(p.relative_to(ROOT)) for p in sorted((ROOT / "docs").glob("*.md"))))


@pytest.mark.parametrize("doc", ALL_DOCS)
def test_every_command_names_the_venv(doc):
    """After the set-up the virtualenv is not activated: a bare ``python`` / ``torchrun`` / ``mesh``
    is not ds-mesh's."""
    for _, line in commands((doc,)):
        words = [w for w in shlex.split(line.rstrip(" \\"), comments=True) if "=" not in w or w.startswith("-")]
        if not words:  # a comment line
            continue
        ok = (
            words[0] in AS
            or words[0] in ELSEWHERE
            or words[0] in SHELL
            or words[0] == ".venv/bin/pip"
            or "/bin/" in words[0]
        )
        assert ok, f"{doc}: {line!r} does not run after the set-up (write .venv/bin/{words[0]})"


@pytest.mark.parametrize(
    "doc, line",
    [c for c in commands() if shlex.split(c[1], comments=True)[0] != "python3"],
    ids=lambda v: v if len(v) < 20 else v[:60],
)
def test_command_runs_as_written(doc, line, tmp_path):
    words = shlex.split(line, comments=True)
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "DS_ACCELERATOR": "cpu",
        "CODEMODS_CACHE_DIR": str(tmp_path / ".cache"),
    }
    while "=" in words[0] and not words[0].startswith("-"):  # VAR=value prefixes
        name, value = words.pop(0).split("=", 1)
        env[name] = value
    if words[0] in ELSEWHERE:
        pytest.skip(ELSEWHERE[words[0]])
    if words[:3] == [".venv/bin/python", "-m", "pytest"]:
        pytest.skip("the test suite itself")
    if words[:3] == [".venv/bin/python", "-m", "compat.install"] and len(words) == 4:
        words.append(str(tmp_path))  # the hook goes into a scratch site dir, never this venv's
    (tmp_path / "ds_config.json").write_text(json.dumps({"train_batch_size": 8, "mesh": {"tp": 2, "dp": "auto"}}))
    (tmp_path / "src" / "train").mkdir(parents=True)
    (tmp_path / "src" / "train" / "loop.py").write_text(LEGACY)
    done = subprocess.run(AS[words[0]] + words[1:], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    allowed = (0, 1) if "--check" in words else (0,)  # --check: exit 1 when a file would change
    assert done.returncode in allowed, f"{doc}: {line}\n{done.stdout[-1500:]}\n{done.stderr[-1500:]}"
