"""RL post-training style: an actor with tensor parallelism (tp=2) and a frozen reference model
that is data parallel only (dp=4), in one world, each with its own mesh.

    torchrun --nproc-per-node 4 examples/rl_actor_reference.py

The actor's layers are Megatron-style column/row-parallel over the actor mesh's tp group, so the
actor mesh is built first and handed to ``deepspeed.initialize(..., mesh=actor_mesh)``. The
reference engine gets its own mesh from its own config. Rank sets the two meshes have in common
share one communicator, and each engine's steps run with its own groups.
"""

import argparse

import torch
import torch.distributed as dist
import torch.nn.functional as F

import compat

compat.install()  # or leave this out and run with DS_MESH=1

import deepspeed  # noqa: E402

from common import check_replicas, init_gloo, ranks, say, say0, shutdown  # noqa: E402

# isort: split
from mesh_core import DeepSpeedDeviceMesh  # noqa: E402
from mesh_core.runtime_hooks import registry_for_world  # noqa: E402

BASE = {"train_micro_batch_size_per_gpu": 8, "steps_per_print": 10**6}
ACTOR_CONFIG = {**BASE, "mesh": {"tp": 2}, "optimizer": {"type": "Adam", "params": {"lr": 1e-2, "torch_adam": True}}}
REFERENCE_CONFIG = {**BASE, "mesh": {"dp": 4}}
OBS, HIDDEN, ACTIONS, KL_COEF = 8, 32, 4, 0.1


class _SumOverTP(torch.autograd.Function):
    """All-reduce partial outputs over the tp group; gradients pass through unchanged."""

    @staticmethod
    def forward(ctx, partial, group):
        total = partial.clone()
        dist.all_reduce(total, group=group)
        return total

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class TensorParallelPolicy(torch.nn.Module):
    """obs -> column-parallel Linear -> ReLU -> row-parallel Linear -> action logits."""

    def __init__(self, tp_group, tp_size: int) -> None:
        super().__init__()
        self.tp_group = tp_group
        self.up = torch.nn.Linear(OBS, HIDDEN // tp_size)  # this rank's slice of the hidden units
        self.down = torch.nn.Linear(HIDDEN // tp_size, ACTIONS, bias=False)
        self.bias = torch.nn.Parameter(torch.zeros(ACTIONS))

    def forward(self, obs):
        return _SumOverTP.apply(self.down(torch.relu(self.up(obs))), self.tp_group) + self.bias


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=5)
    steps = parser.parse_args().steps
    init_gloo()
    actor_mesh = DeepSpeedDeviceMesh.from_config(ACTOR_CONFIG)
    torch.manual_seed(100 + actor_mesh.get_local_rank("tp"))  # each tp rank owns different weights
    policy = TensorParallelPolicy(actor_mesh.get_group("tp"), actor_mesh.size("tp"))
    actor, *_ = deepspeed.initialize(
        model=policy, model_parameters=policy.parameters(), config=ACTOR_CONFIG, mesh=actor_mesh
    )
    before = registry_for_world().created
    torch.manual_seed(0)
    reference_net = torch.nn.Sequential(torch.nn.Linear(OBS, HIDDEN), torch.nn.ReLU(), torch.nn.Linear(HIDDEN, ACTIONS))
    reference, *_ = deepspeed.initialize(model=reference_net, config=REFERENCE_CONFIG)
    reference.eval()
    say0(f"actor mesh: {actor.mesh_device}\nreference mesh: {reference.mesh_device}")
    say0(f"communicators created for the reference model: {registry_for_world().created - before}")
    say(
        f"actor tp {ranks(actor.mesh_device.get_group('tp'))} dp {ranks(actor.data_parallel_group)};"
        f" reference dp {ranks(reference.data_parallel_group)}"
    )

    gen = torch.Generator().manual_seed(actor_mesh.get_local_rank("dp"))  # tp peers see the same batch
    for step in range(steps):
        obs = torch.randn(8, OBS, generator=gen)
        with torch.no_grad():
            ref_logp = F.log_softmax(reference(obs), dim=-1)
        logp = F.log_softmax(actor(obs), dim=-1)
        actions = torch.multinomial(logp.exp().detach(), 1, generator=gen).squeeze(1)
        reward = (actions == obs.argmax(dim=-1) % ACTIONS).float()  # a toy task
        advantage = reward - reward.mean()
        pg_loss = -(advantage * logp.gather(1, actions[:, None]).squeeze(1)).mean()
        kl = (logp.exp() * (logp - ref_logp)).sum(dim=-1).mean()
        loss = pg_loss + KL_COEF * kl
        actor.backward(loss)
        actor.step()
        say0(f"step {step}: reward {reward.mean().item():.3f} kl {kl.item():.4f}")
    check_replicas(actor.module, actor.data_parallel_group)  # each tp shard is in sync across dp


if __name__ == "__main__":
    main()
    shutdown()
