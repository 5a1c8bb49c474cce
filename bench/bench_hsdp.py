"""HSDP ZeRO-3 against dp-only ZeRO-3 and hpZ on the same model, 4 gloo ranks, one run.

    python bench/bench_hsdp.py [--reps 5] [--width 256] [--layers 4]

The three engines (all under the shim, same model, seed and data):

- ``dp``: ZeRO-3 over ``{"dp": 4}``;
- ``hpz``: ZeRO-3 over ``{"dp": 4}`` with ``zero_hpz_partition_size=2`` (ZeRO++ hpZ);
- ``hsdp``: ZeRO-3 over ``{"dp_replicate": 2, "dp_shard": 2}`` (compat/hsdp.py).

Per rank (rank 0): parameter / gradient / optimizer-state bytes (hpZ's secondary parameter copy
counted with the parameters, read after backward), and the collective bytes of one training step
(forward + backward + step, the mean of two steps after a warm-up step), counted by wrapping the
``torch.distributed`` collectives and split by the group they ran on: "within" the rank's block of
2 consecutive ranks ([0,1] / [2,3]: the dp_shard group of HSDP, the hpZ group), "across" ([0,2] /
[1,3]: HSDP's dp_replicate group) and "world" (all 4). A collective's bytes are its full buffer
(all-reduce: the tensor; reduce-scatter: the input; all-gather: the output). Step time: the
slowest rank's, the three engines alternated, min / median / max over ``--reps`` steps.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import statistics
import sys
import time
from typing import Any, Iterator

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.setdefault("OMP_NUM_THREADS", "1")

MODES = {
    "dp": ({"dp": 4}, {}),
    "hpz": ({"dp": 4}, {"zero_hpz_partition_size": 2}),
    "hsdp": ({"dp_replicate": 2, "dp_shard": 2}, {}),
}
COLLECTIVES = {  # name -> index of the tensor whose size is the collective's buffer
    "all_reduce": 0,
    "reduce_scatter_tensor": 1,
    "all_gather_into_tensor": 0,
    "broadcast": 0,
    "_all_gather_base": 0,
    "_reduce_scatter_base": 1,
    "all_gather": 0,
    "reduce_scatter": 1,
    "all_to_all_single": 0,
}
KINDS = ("within", "across", "world")


class CommCounter:
    """Bytes per group kind of the ``torch.distributed`` collectives run while :meth:`counting`."""

    def __init__(self) -> None:
        self.bytes = dict.fromkeys(KINDS + ("other",), 0)
        self.calls: dict[tuple[str, str], list[int]] = {}  # (collective, kind) -> [calls, bytes]

    def kind(self, group: Any) -> str:
        import torch.distributed as dist

        ranks = sorted(dist.get_process_group_ranks(group if group is not None else dist.group.WORLD))
        world = dist.get_world_size()
        if len(ranks) == world:
            return "world"
        if ranks == list(range(ranks[0], ranks[0] + len(ranks))) and ranks[0] % len(ranks) == 0:
            return "within"
        return "across" if len(ranks) == 2 else "other"

    @staticmethod
    def size(value: Any) -> int:
        if isinstance(value, (list, tuple)):
            return sum(t.numel() * t.element_size() for t in value)
        return value.numel() * value.element_size()

    def _wrap(self, name: str, fn: Any) -> Any:
        import inspect

        index = COLLECTIVES[name]
        params = list(inspect.signature(fn).parameters)

        def counted(*args: Any, **kwargs: Any) -> Any:
            tensor = args[index] if len(args) > index else kwargs[params[index]]
            group = (
                args[params.index("group")]
                if "group" in params and len(args) > params.index("group")
                else kwargs.get("group")
            )
            kind, size = self.kind(group), self.size(tensor)
            self.bytes[kind] += size
            tally = self.calls.setdefault((name, kind), [0, 0])
            tally[0], tally[1] = tally[0] + 1, tally[1] + size
            return fn(*args, **kwargs)

        return counted

    @contextlib.contextmanager
    def counting(self) -> Iterator["CommCounter"]:
        import torch.distributed as dist
        from torch.distributed import distributed_c10d

        backend = sys.modules["deepspeed.comm.comm"].cdb  # keeps its all-gather / reduce-scatter functions
        saved: list[tuple[Any, str, Any]] = []
        originals = {name: getattr(dist, name) for name in COLLECTIVES if hasattr(dist, name)}
        wrapped = {name: self._wrap(name, fn) for name, fn in originals.items()}
        for owner in (dist, distributed_c10d):
            for name, fn in wrapped.items():
                saved.append((owner, name, getattr(owner, name)))
                setattr(owner, name, fn)
        for attr in ("all_gather_function", "reduce_scatter_function"):
            fn = getattr(backend, attr, None)
            name = getattr(fn, "__name__", None)
            if name in wrapped and fn is originals[name]:
                saved.append((backend, attr, fn))
                setattr(backend, attr, wrapped[name])
        try:
            yield self
        finally:
            for owner, name, fn in reversed(saved):
                setattr(owner, name, fn)


def build(mode: str, width: int, layers: int):
    import deepspeed
    import torch

    mesh, zero = MODES[mode]
    config = {
        "train_micro_batch_size_per_gpu": 8,
        "steps_per_print": 10**6,
        "optimizer": {"type": "Adam", "params": {"lr": 1e-3, "torch_adam": True}},
        # every layer gathered for its forward and again for its backward, as in a model too big to keep
        "zero_optimization": {
            "stage": 3,
            "stage3_param_persistence_threshold": 0,
            "stage3_model_persistence_threshold": 0,
            "stage3_max_reuse_distance": 0,
            "stage3_prefetch_bucket_size": 0,
            "stage3_max_live_parameters": 0,
            **zero,
        },
        "mesh": mesh,
    }
    torch.manual_seed(0)
    net = torch.nn.Sequential(*[m for _ in range(layers) for m in (torch.nn.Linear(width, width), torch.nn.Tanh())])
    engine, *_ = deepspeed.initialize(model=net, model_parameters=net.parameters(), config=config)
    return engine


def one_step(engine, gen, width: int) -> float:
    import torch

    loss = engine(torch.randn(8, width, generator=gen)).pow(2).mean()
    engine.backward(loss)
    engine.step()
    return loss.item()


def state_bytes(engine) -> dict[str, int]:
    opt = engine.optimizer
    params = list(engine.module.parameters())
    param = sum(p.ds_tensor.numel() * p.ds_tensor.element_size() for p in params)
    secondary = sum(
        p.ds_secondary_tensor.numel() * p.ds_secondary_tensor.element_size()
        for p in params
        if getattr(p, "ds_secondary_tensor", None) is not None
    )
    grad = opt.grad_partitions_flat_buffer.numel() * opt.grad_partitions_flat_buffer.element_size()
    fp32 = list(opt.fp32_partitioned_groups_flat)
    states = sum(
        v.numel() * v.element_size()
        for t in fp32
        for v in opt.optimizer.state[t].values()
        if hasattr(v, "numel") and v.dim() > 0
    )
    master = sum(t.numel() * t.element_size() for t in fp32)
    return {"param": param + secondary, "grad": grad, "optimizer": master + states}


def worker(rank: int, world: int, port: int, args: argparse.Namespace) -> None:
    import io
    import logging

    os.environ.update(
        RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
    )
    import deepspeed
    import torch
    import torch.distributed as dist

    import compat.install as installer

    sys.modules["deepspeed.comm.torch"].build_shm_op = lambda: None  # skip the shm op's JIT build
    deepspeed.init_distributed(dist_backend="gloo")
    installer.install()
    logging.getLogger("DeepSpeed").setLevel(logging.WARNING)
    with contextlib.redirect_stdout(io.StringIO()):
        engines = {mode: build(mode, args.width, args.layers) for mode in MODES}
    gens = {mode: torch.Generator().manual_seed(1000 + rank) for mode in MODES}
    numel = sum(p.ds_numel for p in engines["dp"].module.parameters())
    comm: dict[str, dict[str, float]] = {}
    state: dict[str, dict[str, int]] = {}
    times: dict[str, list[float]] = {mode: [] for mode in MODES}
    losses: dict[str, list[float]] = {mode: [] for mode in MODES}
    for mode, engine in engines.items():  # warm-up, then two counted steps
        losses[mode].append(one_step(engine, gens[mode], args.width))
        counter = CommCounter()
        with counter.counting():
            for _ in range(2):
                loss = engine(torch.randn(8, args.width, generator=gens[mode])).pow(2).mean()
                engine.backward(loss)
                if mode not in state:
                    state[mode] = state_bytes(engine)  # after backward: hpZ's secondary copy is live
                engine.step()
                losses[mode].append(loss.item())
        comm[mode] = {k: v / 2 for k, v in counter.bytes.items()}
        if args.verbose and rank == 0:
            print(mode, {f"{n}@{k}": (c // 2, b // 2) for (n, k), (c, b) in sorted(counter.calls.items())})
    for _ in range(args.reps):  # the engines alternated, step by step
        for mode, engine in engines.items():
            dist.barrier()
            start = time.perf_counter()
            losses[mode].append(one_step(engine, gens[mode], args.width))
            elapsed = torch.tensor([time.perf_counter() - start])
            dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
            times[mode].append(elapsed.item())
    if rank == 0:
        report(numel, state, comm, times, losses, args)
    for engine in engines.values():
        engine.destroy()
    dist.barrier()
    dist.destroy_process_group()


def report(numel: int, state: dict, comm: dict, times: dict, losses: dict, args: argparse.Namespace) -> None:
    kib = 1024
    print(
        f"ZeRO-3, {args.layers} x Linear({args.width}, {args.width}) = {numel} fp32 parameters "
        f"({numel * 4 / kib:.0f} KiB), 4 gloo ranks; per rank (rank 0), KiB"
    )
    head = (
        f"{'':6}{'params':>9}{'grads':>9}{'optim':>9} | {'comm/step: within':>18}{'across':>9}{'world':>9}{'total':>9}"
    )
    print(head + f" | {'step ms min/median/max':>24}{'x dp':>7}")
    base = statistics.median(times["dp"])
    for mode in MODES:
        s, c, t = state[mode], comm[mode], times[mode]
        total = sum(c.values())
        print(
            f"{mode:6}{s['param'] / kib:>9.0f}{s['grad'] / kib:>9.0f}{s['optimizer'] / kib:>9.0f} | "
            f"{c['within'] / kib:>18.0f}{c['across'] / kib:>9.0f}{c['world'] / kib:>9.0f}{total / kib:>9.0f} | "
            f"{min(t) * 1e3:>8.1f}/{statistics.median(t) * 1e3:.1f}/{max(t) * 1e3:.1f}"
            f"{statistics.median(t) / base:>7.2f}"
        )
    model = numel * 4 / kib
    print(
        f"model = {model:.0f} KiB; losses equal across modes: "
        f"{all(abs(a - b) < 1e-5 for m in MODES for a, b in zip(losses[m], losses['dp']))}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--verbose", action="store_true", help="calls and bytes per collective and group kind")
    args = parser.parse_args()
    import torch.multiprocessing as mp

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    mp.spawn(worker, args=(4, port, args), nprocs=4, join=True)


if __name__ == "__main__":
    main()
