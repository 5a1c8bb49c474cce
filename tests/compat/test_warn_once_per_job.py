"""A TODOV1 warning is shown once per call site per job (rank 0), not once per rank; a filter that
asks every occurrence (``error``) still acts on every rank. Subprocesses: the ranks matter."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.torch_releases

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SCRIPT = """
import os, sys
import torch.distributed as dist
if os.environ.get("GLOO") == "1":
    dist.init_process_group("gloo")
import compat.topology as t
a = t.ProcessTopology(axes=["pipe", "data"], dims=[2, 2])      # site 1
b = t.ProcessTopology(axes=["pipe", "data"], dims=[2, 2])      # site 2
for _ in range(3):
    c = t.PipeDataParallelTopology(num_pp=2, num_dp=2)         # site 3, three calls
if dist.is_initialized():
    dist.barrier()
    dist.destroy_process_group()
"""


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "PYTHONWARNINGS")}
    env.update(PYTHONPATH=ROOT, DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1", **extra)
    return env


@pytest.mark.multiprocess
def test_three_call_sites_on_four_ranks_warn_three_times(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "4", str(script)],
        env=_env(GLOO="1"),
        cwd=str(tmp_path),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    warned = [line for line in proc.stderr.splitlines() if "LegacyAPIDeprecationWarning: TODOV1" in line]
    assert len(warned) == 3, proc.stderr[-3000:]
    sites = [str(n) for n, text in enumerate(SCRIPT.splitlines(), 1) if "# site" in text]
    assert sorted(line.split(":")[1] for line in warned) == sorted(sites)  # file:line of each site, once


@pytest.mark.parametrize("rank", ["0", "3"])
def test_an_error_filter_raises_on_every_rank(tmp_path, rank):
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    proc = subprocess.run(
        [sys.executable, "-W", "error::DeprecationWarning", str(script)],
        env=_env(RANK=rank, LOCAL_RANK=rank),
        cwd=str(tmp_path),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 1 and "LegacyAPIDeprecationWarning: TODOV1" in proc.stderr, proc.stderr[-2000:]


def test_other_ranks_stay_quiet(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    proc = subprocess.run(
        [sys.executable, str(script)],
        env=_env(RANK="5", LOCAL_RANK="1"),
        cwd=str(tmp_path),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0 and "TODOV1" not in proc.stderr, proc.stderr[-2000:]
