"""Weight sync between two jobs: a ZeRO-3 trainer job (4 gloo ranks) -> a tp=2 rollout job (2 gloo
ranks), each its own world, on this machine. Alternated in each repetition:

- ``link``: ``mesh_core.transfer.WeightLink`` with same-host reads asked for (``transport="reads"``;
  the default ``"auto"`` does the same where the kernel already allows reads): the jobs share this host, so each rollout rank reads its tp shard's boxes straight out of the ZeRO-3
  partitions that hold them (cross-memory attach: one copy, no packing; no gather);
- ``link gloo``: the same with ``transport="gloo"``, what jobs on two hosts get: every trainer rank
  sends its boxes on the side channel's gloo group;
- ``gather+bcast``: what RL frameworks do: every parameter gathered over the trainer job (the
  all-gather of ZeRO-3's GatheredParameters), then broadcast whole from trainer rank 0 to every
  rollout rank (a group of trainer rank 0 and the rollout ranks), which copy their shard out of it;
- ``raw``: one preallocated contiguous gloo message per (trainer rank, rollout rank) pair carrying
  exactly the bytes the link's plan moves (moves bytes, places nothing), from buffers that hold
  bytes: what a user writing point-to-point by hand would run;
- ``raw read``: the same bytes per pair as one cross-memory read of a contiguous buffer on the
  trainer rank into one on the rollout rank (the transport ``link`` uses, with nothing to place);
- ``raw boxes``: ``link gloo``'s own messages (one per bucket of its plan: the same sizes, peers and
  tags), posted at once into preallocated buffers, placing nothing.

``link`` and ``link gloo`` include everything a cached sync does: this rank's fingerprint of its
tensors (the same tensors every sync: nothing is read again), the round's store operations (claim,
the agreement's arrival, the closing arrival: two barriers of both jobs), the data (reads of runs
straight into the shards; or messages, with the Megatron column blocks packed on the trainer ranks).
``link data`` is the data phase alone (the slowest rank's ``SyncStats.data_seconds`` of the same
sync), without the store operations. ``raw`` and ``raw read`` include only moving the bytes.
Seconds are the slowest rank's, from a barrier of all 6 ranks; GB/s = model bytes / seconds.
Ratios are per repetition (min / median / max).

    python bench/bench_cross_job.py --sizes 16,64,256 --repeat 9                # Megatron split
    python bench/bench_cross_job.py --sizes 16,64,256 --repeat 9 --split rows   # both weights by rows

``--engines K``: instead, the trainer job feeds K rollout jobs (engines, 2 tp ranks each, launched
as jobs of their own): ``one send`` is one ``send()`` of a link made with ``jobs=K`` reaching every
engine; ``send per engine`` is K links (one address and port per engine), one ``send()`` each, in
turn (the workaround before ``jobs=``); both with ``--transport`` (``reads`` or ``gloo``).

    python bench/bench_cross_job.py --engines 2 --sizes 16,64 --repeat 5 --transport gloo
"""

from __future__ import annotations

import argparse
import ast
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

TRAINERS, ROLLOUTS = 4, 2
HIDDEN = 512  # the default --hidden
SECRET = "bench"  # the links' shared secret (both jobs are this run's processes)
METHODS = ("link", "link gloo", "gather+bcast", "raw", "raw read", "raw boxes")


def _shapes(mb: int, hidden: int) -> dict:
    """A stack of MLP blocks (up: 4h x h split by rows, down: h x 4h split by columns, a norm) of about ``mb`` MB."""
    per_block = (2 * 4 * hidden * hidden + hidden) * 4
    blocks = max(1, round(mb * 1e6 / per_block))
    shapes = {}
    for b in range(blocks):
        shapes[f"{b}.up"] = (4 * hidden, hidden)
        shapes[f"{b}.down"] = (hidden, 4 * hidden)
        shapes[f"{b}.norm"] = (hidden,)
    return shapes


def _layouts(shapes, split):
    """Megatron: up by rows, down by columns (the rollout's down shard is a block of columns); rows: both by rows."""
    from mesh_core.transfer import ParamLayout

    down_dim = 1 if split == "megatron" else 0
    return {
        n: ParamLayout(s, shard_dim=0 if n.endswith(".up") else down_dim if n.endswith(".down") else None)
        for n, s in shapes.items()
    }


def _partitions(shapes, rank):
    """ZeRO-3 parameters as DeepSpeed lays them out: ``ds_tensor`` = this rank's flat partition."""
    params = {}
    for i, (name, shape) in enumerate(shapes.items()):
        numel = torch.Size(shape).numel()
        size = -(-numel // TRAINERS)
        flat = torch.zeros(size * TRAINERS)
        flat[:numel] = torch.arange(numel, dtype=torch.float32) % 251 + i
        param = torch.nn.Parameter(torch.empty(0), requires_grad=False)
        param.ds_tensor = flat[rank * size : (rank + 1) * size].clone()
        param.ds_tensor.ds_numel = size
        param.ds_shape, param.ds_numel, param.ds_process_group = shape, numel, dist.group.WORLD
        params[name] = param
    return params


def _worker(index, ports, sizes, repeat, split, hidden, out):
    from mesh_core import MeshSpec
    from mesh_core.transfer import WeightLink, own_box
    from mesh_core.transfer._memory import Read, Reads

    trainer = index < TRAINERS
    rank, size = (index, TRAINERS) if trainer else (index - TRAINERS, ROLLOUTS)
    job_store = dist.TCPStore("127.0.0.1", ports[0 if trainer else 1], size, rank == 0, timeout=timedelta(seconds=120))
    dist.init_process_group("gloo", store=job_store, rank=rank, world_size=size)
    link = WeightLink(
        f"127.0.0.1:{ports[2]}",
        "sender" if trainer else "receiver",
        secret=SECRET,
        timeout=timedelta(seconds=120),
        transport="reads",
    )
    link_gloo = WeightLink(
        f"127.0.0.1:{ports[3]}",
        "sender" if trainer else "receiver",
        secret=SECRET,
        timeout=timedelta(seconds=120),
        transport="gloo",
    )
    everyone = dist.ProcessGroupGloo(
        dist.PrefixStore("bench/all", link.store), index, TRAINERS + ROLLOUTS, timedelta(seconds=120)
    )
    in_bcast = index == 0 or not trainer
    bcast = (
        dist.ProcessGroupGloo(
            dist.PrefixStore("bench/bcast", link.store),
            0 if trainer else 1 + rank,
            1 + ROLLOUTS,
            timedelta(seconds=120),
        )
        if in_bcast
        else None
    )
    spec = MeshSpec.build(ROLLOUTS, tp=2)
    results = {}
    for mb in sizes:
        shapes = _shapes(mb, hidden)
        layouts = _layouts(shapes, split)
        model_bytes = sum(torch.Size(s).numel() * 4 for s in shapes.values())
        if trainer:
            params = _partitions(shapes, rank)
            gathered = {n: torch.empty(p.ds_tensor.numel() * TRAINERS) for n, p in params.items()}
        else:
            boxes = {n: own_box(spec, layouts[n], rank, n, "destination") for n in shapes}
            shards = {n: torch.zeros([hi - lo for lo, hi in boxes[n]]) for n in shapes}
            whole = {n: torch.empty(s) for n, s in shapes.items()}

        def run_link():
            stats = link.send(params) if trainer else link.receive(shards, layouts=layouts, spec=spec)
            data_seconds.append(stats.data_seconds)
            read_bytes.append(stats.read_bytes)

        def run_link_gloo():
            link_gloo.send(params) if trainer else link_gloo.receive(shards, layouts=layouts, spec=spec)

        def run_gather_bcast():
            opts = dist.BroadcastOptions()
            opts.rootRank = 0
            for name in shapes:
                if trainer:
                    dist.all_gather_into_tensor(gathered[name], params[name].ds_tensor)
                    if rank == 0:
                        full = gathered[name][: params[name].ds_numel].view(shapes[name])
                        bcast.broadcast([full], opts).wait()
                else:
                    bcast.broadcast([whole[name]], opts).wait()
                    shards[name].copy_(whole[name][tuple(slice(lo, hi) for lo, hi in boxes[name])])

        data_seconds: list = []
        read_bytes: list = []
        run_link()  # the first sync agrees and plans: outside the timings
        run_link_gloo()
        pairs = link.pair_bytes() if trainer else None
        everyone.allreduce([torch.zeros(1)]).wait()
        if trainer and rank == 0:
            link.store.set(f"bench/pairs/{mb}", repr(sorted(pairs.items())))
        pairs = dict(ast.literal_eval(link.store.get(f"bench/pairs/{mb}").decode()))
        mine = [
            (s, d, b) for (s, d), b in sorted(pairs.items()) if (trainer and s == rank) or (not trainer and d == rank)
        ]
        # written once: a buffer never written is read from the kernel's shared zero page, which stays in
        # cache (raw sending from it measured ~10% faster than sending memory that holds bytes)
        buffers = [torch.full((b,), 7, dtype=torch.uint8) for _, _, b in mine]

        def run_raw():
            works = []
            for (s, d, _), buffer in zip(mine, buffers):
                works.append(everyone.send([buffer], TRAINERS + d, 7) if trainer else everyone.recv([buffer], s, 7))
            for w in works:
                w.wait()

        # raw read: each trainer rank's pair buffers, where they are in its memory, read by the rollout ranks
        if trainer:
            link.store.set(
                f"bench/at/{mb}/{rank}",
                repr((os.getpid(), [(d, buf.data_ptr()) for (_, d, _), buf in zip(mine, buffers)])),
            )
        everyone.allreduce([torch.zeros(1)]).wait()
        if not trainer:
            reads = []
            for s, _, nbytes in mine:
                pid, at = ast.literal_eval(link.store.get(f"bench/at/{mb}/{s}").decode())
                span = ((0, nbytes),)
                reads.append(Read(pid, f"from {s}", span, span, span, dict(at)[rank], 1))
            bound = Reads(reads).bind({f"from {s}": buf for (s, _, _), buf in zip(mine, buffers)})

        def run_raw_read():
            if not trainer:
                Reads.run(bound)

        my_buckets = [b for b in link_gloo._cache["buckets"] if index in (b.src, b.dst)]
        bucket_buffers = [torch.full((b.nbytes,), 7, dtype=torch.uint8) for b in my_buckets]

        def run_raw_boxes():
            works = [
                everyone.send([buffer], b.dst, b.tag) if trainer else everyone.recv([buffer], b.src, b.tag)
                for b, buffer in zip(my_buckets, bucket_buffers)
            ]
            for w in works:
                w.wait()

        runs = {
            "link": run_link,
            "link gloo": run_link_gloo,
            "gather+bcast": run_gather_bcast,
            "raw": run_raw,
            "raw read": run_raw_read,
            "raw boxes": run_raw_boxes,
        }
        for fn in runs.values():  # warm-up (buffers, connections)
            fn()
        times = {m: [] for m in METHODS + ("link data",)}
        for rep in range(repeat):
            order = METHODS[rep % len(METHODS) :] + METHODS[: rep % len(METHODS)]
            for method in order:
                elapsed = _slowest(everyone, runs[method], (lambda: [data_seconds[-1]]) if method == "link" else None)
                times[method].append(elapsed[0].item())
                if method == "link":
                    times["link data"].append(elapsed[1].item())
        if not trainer:
            assert all(torch.equal(shards[n], _expected(shapes, n, boxes[n])) for n in shapes), "wrong weights"
        count = torch.tensor([float(len(my_buckets) if not trainer else 0)])
        opts = dist.AllreduceOptions()
        opts.reduceOp = dist.ReduceOp.MAX
        everyone.allreduce([count], opts).wait()
        whole_read = torch.tensor(
            [1.0 if trainer else float(read_bytes[-1] == sum(t.numel() * 4 for t in shards.values()))]
        )
        opts = dist.AllreduceOptions()
        opts.reduceOp = dist.ReduceOp.MIN
        everyone.allreduce([whole_read], opts).wait()
        results[mb] = {
            "bytes": model_bytes,
            "times": times,
            "pairs": len(pairs),
            "messages": int(count.item()),
            "all read": whole_read.item() == 1.0,
        }
        everyone.allreduce([torch.zeros(1)]).wait()
        link.close()  # the links' caches hold this size's tensors: let them go before the next size
        link_gloo.close()
        del runs, buffers, bucket_buffers
        if trainer:
            del params, gathered
        else:
            del shards, whole
    if index == 0:
        out.put(results)
    everyone.allreduce([torch.zeros(1)]).wait()
    time.sleep(0.5 if index == 0 else 0)
    dist.destroy_process_group()


def _engines_worker(index, ports, sizes, repeat, split, hidden, engines, transport, out):
    """Trainer ranks 0..TRAINERS-1, then engine k's ranks; one link with jobs=K vs K links."""
    from mesh_core import MeshSpec
    from mesh_core.transfer import WeightLink, own_box

    trainer = index < TRAINERS
    engine, rank = (None, index) if trainer else divmod(index - TRAINERS, ROLLOUTS)
    size = TRAINERS if trainer else ROLLOUTS
    if trainer:
        job_store = dist.TCPStore("127.0.0.1", ports[0], TRAINERS, rank == 0, timeout=timedelta(seconds=120))
        dist.init_process_group("gloo", store=job_store, rank=rank, world_size=TRAINERS)
    role = "sender" if trainer else "receiver"
    common = dict(rank=rank, world_size=size, secret=SECRET, timeout=timedelta(seconds=120), transport=transport)
    launch = {} if trainer else {"launch": f"engine{engine}"}
    one = WeightLink(f"127.0.0.1:{ports[1]}", role, jobs=engines if trainer else 1, **common, **launch)
    each = (
        [WeightLink(f"127.0.0.1:{ports[2 + k]}", role, **common) for k in range(engines)]
        if trainer
        else [WeightLink(f"127.0.0.1:{ports[2 + engine]}", role, **common, **launch)]
    )
    everyone = dist.ProcessGroupGloo(
        dist.PrefixStore("bench/all", one.store), index, TRAINERS + engines * ROLLOUTS, timedelta(seconds=120)
    )
    spec = MeshSpec.build(ROLLOUTS, tp=2)
    results = {}
    for mb in sizes:
        shapes = _shapes(mb, hidden)
        layouts = _layouts(shapes, split)
        if trainer:
            params = _partitions(shapes, rank)
        else:
            boxes = {n: own_box(spec, layouts[n], rank, n, "destination") for n in shapes}
            shards = {n: torch.zeros([hi - lo for lo, hi in boxes[n]]) for n in shapes}

        def run_one():
            one.send(params) if trainer else one.receive(shards, layouts=layouts, spec=spec)

        def run_each():
            for link in each:
                link.send(params) if trainer else link.receive(shards, layouts=layouts, spec=spec)

        runs = {"one send": run_one, "send per engine": run_each}
        for fn in runs.values():  # warm-up: the agreements, the channels
            fn()
        times = {m: [] for m in runs}
        for rep in range(repeat):
            for method in list(runs) if rep % 2 == 0 else list(runs)[::-1]:
                times[method].append(_slowest(everyone, runs[method])[0].item())
        if not trainer:
            assert all(torch.equal(shards[n], _expected(shapes, n, boxes[n])) for n in shapes), "wrong weights"
        results[mb] = {"bytes": sum(torch.Size(s).numel() * 4 for s in shapes.values()), "times": times}
        everyone.allreduce([torch.zeros(1)]).wait()
        for link in [one] + each:
            link.close()
        del runs
    if index == 0:
        out.put(results)
    everyone.allreduce([torch.zeros(1)]).wait()
    time.sleep(0.5 if index == 0 else 0)  # the stores' server (trainer rank 0) outlives the others' last reads
    if trainer:
        dist.destroy_process_group()


def _engines_main(args, sizes) -> None:
    ctx = mp.get_context("spawn")
    out = ctx.SimpleQueue()
    ports = tuple(_port() for _ in range(2 + args.engines))
    world = TRAINERS + args.engines * ROLLOUTS
    results = _run_workers(
        ctx,
        out,
        [
            (
                _engines_worker,
                (i, ports, sizes, args.repeat, args.split, args.hidden, args.engines, args.transport, out),
            )
            for i in range(world)
        ],
    )
    print(
        f"ZeRO-3 trainer job ({TRAINERS} gloo ranks) -> {args.engines} rollout engines (tp=2 jobs of {ROLLOUTS} "
        f"ranks); transport {args.transport}; {args.split} split; hidden {args.hidden}; {args.repeat} repetitions, "
        f"seconds = slowest rank; load average {os.getloadavg()[0]:.1f}"
    )
    print("| model | one send s (median) | send per engine s (median) | send per engine ÷ one send |")
    print("|---|---|---|---|")
    for mb, res in results.items():
        t = res["times"]
        print(
            f"| {res['bytes'] / 1e6:.1f} MB | {statistics.median(t['one send']):.4f} | "
            f"{statistics.median(t['send per engine']):.4f} | "
            f"{_mmm([e / o for e, o in zip(t['send per engine'], t['one send'])])} |"
        )


def _expected(shapes, name, box):
    i = list(shapes).index(name)
    numel = torch.Size(shapes[name]).numel()
    full = (torch.arange(numel, dtype=torch.float32) % 251 + i).view(shapes[name])
    return full[tuple(slice(lo, hi) for lo, hi in box)]


def _slowest(everyone, fn, extra=None) -> torch.Tensor:
    """Run ``fn`` on every rank of ``everyone`` from a common start; its seconds on the slowest rank
    (then the largest of each value ``extra()`` gives after it, where given)."""
    everyone.allreduce([torch.zeros(1)]).wait()
    start = time.perf_counter()
    fn()
    elapsed = torch.tensor([time.perf_counter() - start] + (extra() if extra is not None else []))
    opts = dist.AllreduceOptions()
    opts.reduceOp = dist.ReduceOp.MAX
    everyone.allreduce([elapsed], opts).wait()
    return elapsed


def _run_workers(ctx, out, workers):
    """Start one process per (target, args), wait for the first result on ``out`` and return it; a
    worker that failed ends the bench instead of leaving it waiting."""
    procs = [ctx.Process(target=target, args=worker_args) for target, worker_args in workers]
    for p in procs:
        p.start()
    while out.empty():
        if any(p.exitcode not in (None, 0) for p in procs):
            for p in procs:
                p.kill()
            sys.exit("a bench worker failed (its traceback is above)")
        time.sleep(0.2)
    results = out.get()
    for p in procs:
        p.join()
    return results


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _mmm(values) -> str:
    return f"{min(values):.2f} / {statistics.median(values):.2f} / {max(values):.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="16,64,256", help="model sizes in MB")
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument(
        "--split",
        choices=("megatron", "rows"),
        default="megatron",
        help="the rollout's tp split of the down projection: by columns (megatron) or by rows",
    )
    parser.add_argument(
        "--hidden",
        type=int,
        default=HIDDEN,
        help="the blocks' hidden size h: each weight is 4h x h fp32 (512: 4 MiB, a ~65M-parameter "
        "model's; 2048: 64 MiB, a 7B model's MLP weight in bf16 is 90-140 MB)",
    )
    parser.add_argument(
        "--engines",
        type=int,
        default=0,
        help="K >= 2: compare one send() feeding K rollout engines with one send() per engine",
    )
    parser.add_argument("--transport", choices=("reads", "gloo"), default="reads", help="with --engines")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    if args.engines:
        return _engines_main(args, sizes)
    ctx = mp.get_context("spawn")
    out = ctx.SimpleQueue()
    ports = (_port(), _port(), _port(), _port())
    results = _run_workers(
        ctx,
        out,
        [(_worker, (i, ports, sizes, args.repeat, args.split, args.hidden, out)) for i in range(TRAINERS + ROLLOUTS)],
    )
    print(
        f"ZeRO-3 trainer job ({TRAINERS} gloo ranks) -> tp=2 rollout job ({ROLLOUTS} gloo ranks); "
        f"{args.split} split; hidden {args.hidden} ({4 * args.hidden * args.hidden * 4 / 2**20:g} MiB weights); "
        f"{args.repeat} repetitions, seconds = slowest rank; "
        f"load average {os.getloadavg()[0]:.1f}"
    )
    print(
        "| model | link s (median) | link GB/s | link data s | gather+bcast ÷ link | raw ÷ link | raw read ÷ link "
        "| raw read ÷ link data | link gloo s | raw ÷ link gloo | raw ÷ raw boxes (messages) | gather+bcast s | raw s "
        "| raw read s |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")

    def ratio(a, b):
        return _mmm([x / y for x, y in zip(t[a], t[b])])

    for mb, res in results.items():
        t = res["times"]
        med = {m: statistics.median(t[m]) for m in METHODS + ("link data",)}
        print(
            f"| {res['bytes'] / 1e6:.1f} MB | {med['link']:.4f} | {res['bytes'] / med['link'] / 1e9:.2f} | "
            f"{med['link data']:.4f} | {ratio('gather+bcast', 'link')} | {ratio('raw', 'link')} | "
            f"{ratio('raw read', 'link')} | {ratio('raw read', 'link data')} | {med['link gloo']:.4f} | "
            f"{ratio('raw', 'link gloo')} | {ratio('raw', 'raw boxes')} ({res['messages']}) | "
            f"{med['gather+bcast']:.4f} | {med['raw']:.4f} | {med['raw read']:.4f} |"
        )
    if not all(res["all read"] for res in results.values()):
        print(
            "note: the link read less than a rollout rank's shard here (the kernel refused cross-memory reads, "
            "or a piece went on gloo): 'link' is then partly or wholly gloo"
        )


if __name__ == "__main__":
    main()
