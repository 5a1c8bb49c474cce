"""Run a tests/e2e script on 4 gloo processes with torchrun; load what each rank dumped."""

from __future__ import annotations

import os
import subprocess
import sys

import torch

E2E_DIR = os.path.dirname(os.path.abspath(__file__))
WORLD = 4


def torchrun(
    script: str, out_dir: str, *args: str, timeout: int = 240, env: dict | None = None, world: int = WORLD
) -> list[dict]:
    """Results of ``script`` per rank (index = rank); fails with the tail of the log on error."""
    run_env = dict(os.environ, DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1", **(env or {}))
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={world}",
        os.path.join(E2E_DIR, script),
        out_dir,
        *args,
    ]
    proc = subprocess.run(cmd, cwd=E2E_DIR, env=run_env, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise AssertionError(f"{script} failed (rc={proc.returncode}):\n{(proc.stdout + proc.stderr)[-6000:]}")
    return [torch.load(os.path.join(out_dir, f"rank{r}.pt")) for r in range(world)]


def assert_bit_identical(reference: dict, other: dict, what: str) -> None:
    assert other["losses"] == reference["losses"], f"{what}: losses {other['losses']} != {reference['losses']}"
    assert other["params"].keys() == reference["params"].keys()
    for name, value in reference["params"].items():
        assert torch.equal(other["params"][name], value), f"{what}: parameter {name} differs"
