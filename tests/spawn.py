"""Run a worker on every rank of a local gloo world (spawned processes), failing the test on a hang."""

from __future__ import annotations

import json
import os
import time
from typing import Any, Callable

import pytest
import torch.distributed as dist
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


def wait_for_files(paths: list, *, timeout_s: float = 60.0) -> None:
    """Return once every path exists (what another rank writes when it is done), or raise after
    ``timeout_s``: a rank that serves others (a store's server) waits for them this way before it exits."""
    deadline = time.monotonic() + timeout_s
    missing = [str(p) for p in paths if not os.path.exists(p)]
    while missing:
        if time.monotonic() > deadline:
            raise TimeoutError(f"still missing after {timeout_s} s: {', '.join(missing)}")
        time.sleep(0.05)  # polling the file system for another process's result
        missing = [p for p in missing if not os.path.exists(p)]


def finish_rank(out_dir: str, rank: int, out: dict) -> None:
    """Write ``out`` to ``<out_dir>/rank<rank>.json``, then wait for every rank and tear gloo down
    (a rank exiting while a peer still talks to it can abort)."""
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as fh:
        json.dump(out, fh)
    dist.barrier()
    dist.destroy_process_group()


def read_ranks(out_dir: Any, world: int) -> list[dict]:
    """What each rank wrote with :func:`finish_rank` (index = rank)."""
    outs = []
    for r in range(world):
        with open(os.path.join(out_dir, f"rank{r}.json")) as fh:
            outs.append(json.load(fh))
    return outs


_READS_HOLDER = """
import json, sys, time
from mesh_core.transfer._memory import Token, allow_readers
allow_readers()
token = Token()
print(json.dumps(token.endpoint.fields() if token.endpoint else None), flush=True)
sys.stdin.read()
"""


def reads_across_processes() -> bool:
    """Whether this kernel lets a process read another one's memory here (what the weight link's
    same-host reads need): a child process holds a token, allowing readers as a sending link with
    transport="reads" does,
    and this process probes it."""
    import subprocess
    import sys

    from mesh_core.transfer._memory import Endpoint, probe

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    child = subprocess.Popen(
        [sys.executable, "-c", _READS_HOLDER],
        cwd=root,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=dict(os.environ, PYTHONPATH=root),
    )
    try:
        fields = json.loads(child.stdout.readline() or "null")
        return fields is not None and probe(Endpoint.from_fields(fields))
    finally:
        child.communicate(timeout=30)
