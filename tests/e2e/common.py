"""Shared set-up for the 4-process gloo runs under ``tests/e2e`` (run by torchrun).

Each script trains the same model in several *modes* inside one world, one after the other:
legacy deepspeed (shim uninstalled) and deepspeed with ``compat.install()``, with the layout given
through ``mpu=`` / the model / the config ``"mesh"`` section. Every mode starts from the same seed
and the same data, so shimmed and legacy runs must give bit-identical losses and parameters; each
rank dumps what it saw to ``<out>/rank<r>.pt`` for the pytest side to compare.
"""

from __future__ import annotations

import gc
import os
import sys

import torch
import torch.distributed as dist

os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.setdefault("OMP_NUM_THREADS", "1")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
sys.path.insert(1, os.path.join(ROOT, "tests"))  # the tests' shared helpers (megatron_mpu)


def init_world() -> int:
    """deepspeed.comm over gloo (skipping the shm op JIT build); returns this rank."""
    import deepspeed

    sys.modules["deepspeed.comm.torch"].build_shm_op = lambda: None
    deepspeed.init_distributed(dist_backend="gloo")
    return dist.get_rank()


def shutdown() -> None:
    """Free what the run left unreachable, wait for every rank, then tear the groups down: a group
    freed later, at interpreter exit, or a rank exiting while gloo peers still hold connections to it
    can abort ("terminate called without an active exception")."""
    gc.collect()  # an engine / mesh in a reference cycle: its groups go now, on every rank alike
    dist.barrier()
    dist.destroy_process_group()


def set_mode(shim: bool) -> None:
    import compat.install as installer

    if shim:
        installer.install()
    else:
        installer.uninstall()


def ranks(group) -> list[int]:
    return sorted(dist.get_process_group_ranks(group))


def params_of(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in module.named_parameters()}


def dump(out_dir: str, rank: int, results: dict) -> None:
    os.makedirs(out_dir, exist_ok=True)
    torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))


def group_count() -> int:
    return dist.distributed_c10d._world.group_count


def run_parts(parts: dict) -> None:
    """``script.py OUT_DIR PART[,PART]``: run each named part on every rank (a world barrier after
    each, so a rank left in a collective hangs there, i.e. fails by the test's timeout), dump, shut down."""
    out_dir, names = sys.argv[1], sys.argv[2].split(",")
    rank = init_world()
    results: dict = {}
    for name in names:
        results[name] = {}
        parts[name](rank, results[name])
        dist.barrier()
    dump(out_dir, rank, results)
    shutdown()


def train_steps(engine, gen: torch.Generator, steps: int, rows: int) -> list[float]:
    """``steps`` forward / backward / step calls on random (rows, 8) inputs regressing their row sums."""
    losses = []
    for _ in range(steps):
        x = torch.randn(rows, 8, generator=gen)
        loss = torch.nn.functional.mse_loss(engine(x), x.sum(dim=1, keepdim=True))
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    return losses
