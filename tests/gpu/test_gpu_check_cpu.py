"""``tools/gpu_check.sh --cpu``: the GPU acceptance run's parts that a world of one can run, on
gloo/CPU (the script, its wheel check, its parts and its summary; no GPU needed)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
pytestmark = [pytest.mark.multiprocess, pytest.mark.deepspeed]
RUN_PARTS = ["member_only", "sharing", "zero3", "zero_bf16", "hf_trainer", "member_only_bound"]
NEEDS_PEERS = ["subworld_engine", "pipelines", "transfer"]


@pytest.fixture(scope="module")
def summary(tmp_path_factory):
    pytest.importorskip("transformers")
    env = dict(os.environ, TMPDIR=str(tmp_path_factory.mktemp("gpu_check")))
    proc = subprocess.run(["bash", os.path.join(ROOT, "tools", "gpu_check.sh"), "--cpu", "--python", sys.executable],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
    return proc.stdout


@pytest.mark.parametrize("part", RUN_PARTS)
def test_every_one_rank_part_passes_on_cpu(summary, part):
    assert any(line.split()[:2] == [part, "ok"] for line in summary.splitlines()), summary


@pytest.mark.parametrize("part", NEEDS_PEERS)
def test_parts_needing_peers_say_so_in_a_world_of_one(summary, part):
    line = next(line for line in summary.splitlines() if line.startswith(part + " "))
    assert "skipped:" in line and ">= 2" in line, line


def test_wheels_lists_what_to_bring():
    out = subprocess.run(["bash", os.path.join(ROOT, "tools", "gpu_check.sh"), "--wheels"], capture_output=True,
                         text=True, timeout=30).stdout
    assert "pip download -d wheels" in out and "--no-index --find-links wheels" in out and "deepspeed==0.19.8" in out
