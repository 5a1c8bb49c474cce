"""Rollout job: a plain torch model split tp=2 over its own 2-rank gloo world (no DeepSpeed),
receiving the trainer's weights through the weight link before each generation.

    torchrun --nproc-per-node 2 examples/rl_two_jobs/rollout.py --link 127.0.0.1:29650 [--syncs 3]

Each rank receives only its own shard, straight from the trainer ranks that hold its parts, and
compares it bit for bit with the trainer's weights gathered the usual way.
"""

import argparse
import io
import os
import sys
import time
from datetime import timedelta

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # examples/common.py

import common  # noqa: E402,F401  (CPU defaults)

# isort: split
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from model import ROLLOUT_LAYOUTS  # noqa: E402

from mesh_core import MeshSpec  # noqa: E402
from mesh_core.transfer import WeightLink, own_box  # noqa: E402


def say(*parts) -> None:
    sys.stdout.write(" ".join([f"[rollout rank {dist.get_rank()}]", *map(str, parts)]) + "\n")
    sys.stdout.flush()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--link", required=True, help="host:port the trainer job's rank 0 serves")
    parser.add_argument("--syncs", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds any wait of a sync may last")
    parser.add_argument(
        "--generate-seconds",
        type=float,
        default=0.0,
        help="time spent generating after each sync (simulated by waiting)",
    )
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    spec = MeshSpec.build(dist.get_world_size(), tp=2)
    boxes = {n: own_box(spec, layout, rank, n, "destination") for n, layout in ROLLOUT_LAYOUTS.items()}
    shards = {n: torch.zeros([hi - lo for lo, hi in box]) for n, box in boxes.items()}  # this rank's tp shards
    link = WeightLink(args.link, "receiver", timeout=timedelta(seconds=args.timeout))
    for _ in range(args.syncs):
        stats = link.receive(shards, layouts=ROLLOUT_LAYOUTS, spec=spec)
        full = torch.load(io.BytesIO(link.store.get(f"example/weights/{stats.round}")))
        equal = all(torch.equal(shards[n], full[n][tuple(slice(lo, hi) for lo, hi in boxes[n])]) for n in shards)
        say(
            f"sync {stats.round}: {stats.seconds:.4f} s, {stats.bytes} bytes, received {stats.received_bytes} bytes "
            f"on this rank ({stats.read_bytes} read from the trainer ranks' memory), "
            f"{'WEIGHTS EQUAL' if equal else 'WEIGHTS DIFFER'}"
        )
        time.sleep(args.generate_seconds)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
