"""The cost of one all-rank check among the six processes of a 4 -> 2 weight sync, three ways,
alternated in each repetition (what a cached ``WeightLink`` sync could do before and after its
data phase; it uses the first):

- ``store arrival``: :func:`mesh_core.rendezvous.arrive` on a ``TCPStore`` (three store operations
  per rank; the last arrival wakes the others);
- ``via rank 0``: on a gloo group, every rank sends a small header to rank 0, which answers each;
- ``all to all``: on a gloo group, every rank sends its header to every other rank.

Seconds are each method's median per rank over the repetitions, the slowest rank shown.

    python bench/bench_sync_checks.py --repeat 40
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import time
from datetime import timedelta

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

RANKS = 6
METHODS = ("store arrival", "via rank 0", "all to all")


def _worker(rank: int, port: int, repeat: int, out) -> None:
    from mesh_core.rendezvous import arrive

    store = dist.TCPStore("127.0.0.1", port, RANKS, rank == 0, timeout=timedelta(seconds=60))
    group = dist.ProcessGroupGloo(dist.PrefixStore("bench", store), rank, RANKS, timedelta(seconds=60))
    header = torch.zeros(3, dtype=torch.int64)
    rounds = [0]

    def store_arrival() -> None:
        rounds[0] += 1
        arrive(
            store, f"check/{rounds[0]}", list(range(RANKS)), timedelta(seconds=60), lambda a, m: "missing", rank=rank
        )

    def via_rank_0() -> None:
        if rank == 0:
            got = [torch.zeros(3, dtype=torch.int64) for _ in range(1, RANKS)]
            for work in [group.recv([t], peer, 1) for peer, t in enumerate(got, 1)]:
                work.wait()
            for work in [group.send([header], peer, 2) for peer in range(1, RANKS)]:
                work.wait()
        else:
            sent, answer = group.send([header], 0, 1), torch.zeros(3, dtype=torch.int64)
            group.recv([answer], 0, 2).wait()
            sent.wait()

    def all_to_all() -> None:
        peers = [p for p in range(RANKS) if p != rank]
        got = {p: torch.zeros(3, dtype=torch.int64) for p in peers}
        works = [group.recv([got[p]], p, 3) for p in peers] + [group.send([header], p, 3) for p in peers]
        for work in works:
            work.wait()

    runs = dict(zip(METHODS, (store_arrival, via_rank_0, all_to_all)))
    for fn in runs.values():  # warm-up (connections)
        fn()
    times = {m: [] for m in METHODS}
    for rep in range(repeat):
        for method in METHODS[rep % len(METHODS) :] + METHODS[: rep % len(METHODS)]:
            group.allreduce([torch.zeros(1)]).wait()
            start = time.perf_counter()
            runs[method]()
            times[method].append(time.perf_counter() - start)
    medians = torch.tensor([statistics.median(times[m]) for m in METHODS], dtype=torch.float64)
    opts = dist.AllreduceOptions()
    opts.reduceOp = dist.ReduceOp.MAX
    group.allreduce([medians], opts).wait()
    if rank == 0:
        out.put(medians.tolist())
    group.allreduce([torch.zeros(1)]).wait()
    time.sleep(0.5 if rank == 0 else 0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=40)
    args = parser.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    out = ctx.SimpleQueue()
    procs = [ctx.Process(target=_worker, args=(r, port, args.repeat, out)) for r in range(RANKS)]
    for p in procs:
        p.start()
    medians = out.get()
    for p in procs:
        p.join()
    print(f"{RANKS} processes, {args.repeat} repetitions, load average {os.getloadavg()[0]:.1f}")
    print("| check | ms (median per rank, slowest rank) |")
    print("|---|---|")
    for method, seconds in zip(METHODS, medians):
        print(f"| {method} | {seconds * 1e3:.2f} |")


if __name__ == "__main__":
    main()
