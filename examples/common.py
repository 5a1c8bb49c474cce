"""Shared set-up for the examples: CPU/gloo defaults and rank-0 printing."""

from __future__ import annotations

import gc
import logging
import os
import sys

os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch.distributed as dist  # noqa: E402


def init_gloo() -> int:
    """deepspeed.comm over gloo; returns this rank.

    On CPU this skips DeepSpeed's shared-memory op, whose JIT build a first DeepSpeed run pays (about
    2 minutes on 2 cores; the README's "What a first run costs"): the examples start in seconds."""
    import deepspeed

    if os.environ.get("DS_ACCELERATOR") == "cpu":
        sys.modules["deepspeed.comm.torch"].build_shm_op = lambda: None
    deepspeed.init_distributed(dist_backend="gloo")
    logging.getLogger("DeepSpeed").setLevel(logging.WARNING)
    return dist.get_rank()


def shutdown() -> None:
    """Free what the run left unreachable, wait for every rank, then tear the groups down: a group
    freed later, at interpreter exit, or a rank exiting while gloo peers still hold connections to it
    can abort ("terminate called without an active exception")."""
    gc.collect()  # an engine / mesh in a reference cycle: its groups go now, on every rank alike
    dist.barrier()
    dist.destroy_process_group()


def ranks(group) -> list[int]:
    return sorted(dist.get_process_group_ranks(group))


def say(*parts) -> None:
    """Print on every rank, prefixed with the rank (examples are small)."""
    # one write per line: ranks share stdout, and separate writes of the parts interleave
    sys.stdout.write(" ".join([f"[rank {dist.get_rank()}]", *map(str, parts)]) + "\n")
    sys.stdout.flush()


def say0(*parts) -> None:
    if dist.get_rank() == 0:
        sys.stdout.write(" ".join(map(str, parts)) + "\n")
        sys.stdout.flush()


def check_replicas(module, group=None) -> None:
    """Raise unless every rank of ``group`` holds bit-identical parameters of ``module``."""
    import torch

    flat = torch.cat([p.detach().reshape(-1) for p in module.parameters()])
    gathered = [torch.empty_like(flat) for _ in range(dist.get_world_size(group))]
    dist.all_gather(gathered, flat, group=group)
    if not all(torch.equal(g, flat) for g in gathered):
        raise RuntimeError(f"parameters differ across ranks {ranks(group) if group else 'all'}")
    say(f"parameters identical across ranks {ranks(group) if group is not None else 'all'}")
