"""Weight transfer actor (tp=2, ranks 0-1) -> rollout (dp=2, ranks 2-3) on 4 gloo processes.

Methods, alternated within each repetition, each moving the same model into the rollout:

- ``transfer``: ``mesh_core.transfer.transfer`` (pre-flight agreement + flat buckets);
- ``raw``: the bound: each actor rank sends one preallocated contiguous buffer holding exactly the
  bytes ``transfer`` sends to each rollout rank (isend/irecv, no packing, no checks);
- ``raw+placement``: ``raw``, then the copies no method can avoid: each received piece whose place
  in the rollout's tensor is not contiguous (a row-parallel ``down`` shard is a block of columns) is
  copied there from the received buffer (contiguous places could be received into directly);
- ``gather+bcast``: what RL frameworks do: per parameter, all-gather the tp shards onto the actor
  ranks, then rank 0 broadcasts the full tensor to the rollout ranks (group [0, 2, 3]).

Model: blocks of ``up`` (4H x H, split on dim 0) / ``down`` (H x 4H, split on dim 1; on dim 0 with
``--split rows``) / bias (H),
fp32, H chosen for each ``--sizes`` entry (MB). Time per call: from a barrier to the last rank's
end (max over ranks). GB/s = bytes delivered to the rollout ranks (model bytes x 2) / time.
Memory: the most bytes of bucket buffers alive at once on a rank (``TransferStats.peak_buffer_bytes``)
beside one bucket; the naive method holds the largest full parameter on every actor rank.

    python bench/bench_transfer.py [--sizes 16,64] [--repeat 5] [--bucket-mb 16] [--blocks 4] [--split rows]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import common  # noqa: F401  (sets the environment and sys.path first)

# isort: split
from common import MiB, table

# isort: split

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from mesh_core.transfer._buckets import DEFAULT_WINDOW

WORLD, ACTOR, ROLLOUT = 4, [0, 1], [2, 3]
BLOCKS = 4
METHODS = ("transfer", "raw", "raw+placement", "gather+bcast")


def model_shapes(mb: float, blocks: int = BLOCKS) -> dict[str, tuple]:
    # 8 H^2 + H floats per block
    hidden = max(8, int((mb * MiB / 4 / blocks / 8) ** 0.5) // 8 * 8)
    shapes = {}
    for b in range(blocks):
        shapes[f"{b}.up"] = (4 * hidden, hidden)
        shapes[f"{b}.down"] = (hidden, 4 * hidden)
        shapes[f"{b}.bias"] = (hidden,)
    return shapes


def layouts(shapes, split: str = "megatron"):
    """Actor layouts: ``megatron`` splits ``up`` on dim 0 and ``down`` on dim 1 (its pieces land in a
    block of columns: strided); ``rows`` splits both on dim 0 (every piece lands contiguous)."""
    from mesh_core.transfer import ParamLayout

    down_dim = 1 if split == "megatron" else 0
    src = {
        n: ParamLayout(s, shard_dim=0 if n.endswith("up") else down_dim if n.endswith("down") else None)
        for n, s in shapes.items()
    }
    return src, {n: ParamLayout(s) for n, s in shapes.items()}


def worker(rank: int, init: str, args: argparse.Namespace, out: str) -> None:
    from mesh_core import MeshSpec
    from mesh_core.transfer import plan_transfer, transfer
    from mesh_core.transfer._buckets import box_numel, local_index
    from mesh_core.transfer._in_job import _holders

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=WORLD)
    actor, rollout = MeshSpec.build(WORLD, tp=2, ranks=ACTOR), MeshSpec.build(WORLD, dp=2, ranks=ROLLOUT)
    actor_group, bcast_group = dist.new_group(ACTOR), dist.new_group([0] + ROLLOUT)
    report = {}
    for mb in args.sizes:
        shapes = model_shapes(mb, args.blocks)
        src_l, dst_l = layouts(shapes, args.split)
        src = (
            {
                n: torch.randn([hi - lo for lo, hi in box])
                for n in shapes
                for r, box in _holders(actor, src_l[n], n, "s")
                if r == rank
            }
            if rank in ACTOR
            else None
        )
        dst = {n: torch.zeros(s) for n, s in shapes.items()} if rank in ROLLOUT else None
        plan = plan_transfer(actor, rollout, src_l, dst_l)
        pair_bytes = {}
        for p in plan:
            pair_bytes[(p.src, p.dst)] = (
                pair_bytes.get((p.src, p.dst), 0) + 4 * torch.Size([hi - lo for lo, hi in p.box]).numel()
            )
        raw = {pair: torch.randn(n // 4) for pair, n in pair_bytes.items() if rank in pair}
        placements = []  # on a rollout rank: (pair, offset, numel, place) of each piece landing strided
        offsets: dict = {}
        for p in plan:
            if p.dst == rank and p.src != rank:
                offset = offsets.get((p.src, p.dst), 0)
                offsets[(p.src, p.dst)] = offset + box_numel(p.box)
                place = dst[p.name][local_index(p.box, p.dst_box)]
                if not place.is_contiguous():
                    placements.append(((p.src, p.dst), offset, box_numel(p.box), place))
        model_bytes = sum(4 * torch.Size(s).numel() for s in shapes.values())

        def run_transfer():
            return transfer(
                actor, rollout, src, dst, src_l, dst_l, bucket_bytes=int(args.bucket_mb * MiB), window=args.window
            )

        def run_raw():
            works = [
                (dist.isend if pair[0] == rank else dist.irecv)(buf, pair[1] if pair[0] == rank else pair[0])
                for pair, buf in sorted(raw.items())
            ]
            for w in works:
                w.wait()

        def run_raw_placed():
            run_raw()
            for pair, offset, numel, place in placements:
                place.copy_(raw[pair][offset : offset + numel].view(place.shape))

        def run_naive():
            for name, shape in sorted(shapes.items()):
                full = torch.empty(shape) if rank in ACTOR or rank in ROLLOUT else None
                if rank in ACTOR:
                    dim = src_l[name].shard_dim
                    if dim is None:
                        full.copy_(src[name])
                    else:
                        parts = [torch.empty_like(src[name]) for _ in ACTOR]
                        dist.all_gather(parts, src[name].contiguous(), group=actor_group)
                        full.copy_(torch.cat(parts, dim=dim))
                if rank in [0] + ROLLOUT:
                    dist.broadcast(full, src=0, group=bcast_group)
                if rank in ROLLOUT:
                    dst[name].copy_(full)

        times = {m: [] for m in METHODS}
        peak = 0
        stats = run_transfer()  # warm-up: the first call agrees and plans
        run_raw_placed()
        run_naive()
        for rep in range(args.repeat):
            order = METHODS if rep % 2 == 0 else METHODS[::-1]
            for method in order:
                fn = {
                    "transfer": run_transfer,
                    "raw": run_raw,
                    "raw+placement": run_raw_placed,
                    "gather+bcast": run_naive,
                }[method]
                dist.barrier()
                start = time.perf_counter()
                result = fn()
                elapsed = torch.tensor([time.perf_counter() - start])
                dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
                times[method].append(elapsed.item())
                if method == "transfer":
                    peak = max(peak, result.peak_buffer_bytes)
        peaks = [torch.tensor([peak]) for _ in range(WORLD)]
        dist.all_gather(peaks, torch.tensor([peak]))
        report[str(mb)] = {
            "times": times,
            "model_bytes": model_bytes,
            "peak": max(int(p) for p in peaks),
            "messages": stats.messages,
            "largest_param": max(4 * torch.Size(s).numel() for s in shapes.values()),
        }
    if rank == 0:
        with open(out, "w") as fh:
            json.dump(report, fh)
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="16,64", help="model sizes in MB, comma-separated")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--bucket-mb", type=float, default=16)
    parser.add_argument(
        "--window", type=int, default=DEFAULT_WINDOW, help="buffers in flight (default: the transfer's)"
    )
    parser.add_argument("--blocks", type=int, default=BLOCKS, help="model blocks (3 parameters each)")
    parser.add_argument(
        "--split",
        choices=("megatron", "rows"),
        default="megatron",
        help="actor layout: down_proj split on dim 1 (megatron) or dim 0 (rows)",
    )
    args = parser.parse_args()
    args.sizes = [float(s) for s in args.sizes.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "report.json")
        # a TCP store, as torchrun gives (a file store makes every store operation a file rewrite)
        mp.spawn(worker, args=(f"tcp://127.0.0.1:{_free_port()}", args, out), nprocs=WORLD, join=True)
        report = json.load(open(out))
    rows = []
    for mb, res in report.items():
        delivered = res["model_bytes"] * len(ROLLOUT) / 1e9
        t = res["times"]
        for method in METHODS:
            gbs = sorted(delivered / x for x in t[method])
            rows.append(
                [
                    f"{res['model_bytes'] / 1e6:.1f} MB",
                    method,
                    f"{gbs[0]:.2f}",
                    f"{statistics.median(gbs):.2f}",
                    f"{gbs[-1]:.2f}",
                    f"{statistics.median(t[method]) * 1e3:.1f}",
                ]
            )
        ratio_raw = sorted(r / x for x, r in zip(t["transfer"], t["raw"]))
        ratio_placed = sorted(r / x for x, r in zip(t["transfer"], t["raw+placement"]))
        ratio_naive = sorted(n / x for x, n in zip(t["transfer"], t["gather+bcast"]))
        rows.append([f"{res['model_bytes'] / 1e6:.1f} MB", "transfer / raw (bandwidth)", *_mmm(ratio_raw), ""])
        rows.append([f"{res['model_bytes'] / 1e6:.1f} MB", "transfer / raw+placement", *_mmm(ratio_placed), ""])
        rows.append([f"{res['model_bytes'] / 1e6:.1f} MB", "transfer / gather+bcast", *_mmm(ratio_naive), ""])
        rows.append(
            [
                f"{res['model_bytes'] / 1e6:.1f} MB",
                f"peak bucket memory/rank {res['peak'] / MiB:.1f} MiB (bucket {args.bucket_mb:g} MiB); "
                f"naive holds {res['largest_param'] / MiB:.1f} MiB; messages/rank {res['messages']}",
                "",
                "",
                "",
                "",
            ]
        )
    print(
        f"actor tp=2 (ranks 0-1, {args.split} split) -> rollout dp=2 (ranks 2-3), gloo, {3 * args.blocks} parameters, "
        f"{args.repeat} alternated repetitions"
    )
    print(table(["model", "method", "min GB/s", "median", "max", "median ms"], rows))


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _mmm(values):
    return [f"{values[0]:.2f}", f"{statistics.median(values):.2f}", f"{values[-1]:.2f}"]


if __name__ == "__main__":
    sys.exit(main())
