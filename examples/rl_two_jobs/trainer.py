"""Trainer job: a DeepSpeed ZeRO-3 engine on 4 gloo ranks, sending its weights to the rollout job
after each training step through a weight link (``mesh_core.transfer.WeightLink``).

    torchrun --nproc-per-node 4 examples/rl_two_jobs/trainer.py --link 127.0.0.1:29650 [--steps 3]

For the rollout's check, rank 0 also puts the weights gathered the usual way (GatheredParameters)
in the link's store after each sync. A sync that fails (the rollout job is absent or ended) is
reported and training goes on; the next sync reaches a relaunched rollout job.
"""

import argparse
import io
import os
import sys
from datetime import timedelta

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # examples/common.py

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import compat  # noqa: E402

compat.install()

import deepspeed  # noqa: E402

from common import init_gloo, shutdown  # noqa: E402

# isort: split
from model import OBS, Policy  # noqa: E402

from mesh_core import MeshSpecError  # noqa: E402
from mesh_core.transfer import WeightLink  # noqa: E402

CONFIG = {
    "train_micro_batch_size_per_gpu": 4,
    "steps_per_print": 10**6,
    "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
    "optimizer": {"type": "Adam", "params": {"lr": 1e-2, "torch_adam": True}},
}


def say(*parts) -> None:
    sys.stdout.write(" ".join([f"[trainer rank {dist.get_rank()}]", *map(str, parts)]) + "\n")
    sys.stdout.flush()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--link", required=True, help="host:port this job's rank 0 serves the weight link at")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds any wait of a sync may last")
    args = parser.parse_args()
    rank = init_gloo()
    torch.manual_seed(0)
    engine, *_ = deepspeed.initialize(model=Policy(), model_parameters=None, config=CONFIG)
    link = WeightLink(args.link, "sender", timeout=timedelta(seconds=args.timeout))
    for step in range(args.steps):
        generator = torch.Generator().manual_seed(100 * step + rank)
        obs = torch.randn(4, OBS, generator=generator)
        loss = engine(obs).pow(2).mean()
        engine.backward(loss)
        engine.step()
        say(f"step {step}: loss {loss.item():.6f}")
        try:
            stats = link.send(engine)
        except MeshSpecError as err:
            say(f"sync after step {step} FAILED: {err}")
            continue
        publish_gathered(engine, link, stats.round)
        say(
            f"sync {stats.round}: {stats.seconds:.4f} s, {stats.bytes} bytes, sent {stats.sent_bytes} bytes from this rank"
        )
    shutdown()


def publish_gathered(engine, link: WeightLink, round_no: int) -> None:
    """Rank 0: the full weights, gathered over the ZeRO-3 partitions, for the rollout to compare."""
    params = dict(engine.module.named_parameters())
    with deepspeed.zero.GatheredParameters(list(params.values())):
        if dist.get_rank() == 0:
            buffer = io.BytesIO()
            torch.save({n: p.detach().clone() for n, p in params.items()}, buffer)
            link.store.set(f"example/weights/{round_no}", buffer.getvalue())


if __name__ == "__main__":
    main()
