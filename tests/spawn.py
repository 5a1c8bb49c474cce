"""Run a worker on every rank of a local gloo world (spawned processes), failing the test on a hang."""
from __future__ import annotations

import time
from typing import Any, Callable

import pytest
import torch.multiprocessing as mp


def run_ranks(worker: Callable[..., Any], args: tuple, *, world: int, timeout_s: float, hang: str) -> None:
    """Spawn ``worker(rank, *args)`` on ``world`` ranks; kill them and fail with ``hang`` after ``timeout_s``."""
    ctx = mp.start_processes(worker, args=args, nprocs=world, join=False, start_method="spawn")
    deadline = time.monotonic() + timeout_s
    while not ctx.join(timeout=1):
        if time.monotonic() > deadline:
            for proc in ctx.processes:
                proc.kill()
            pytest.fail(f"ranks still running after {timeout_s} s: {hang}")
