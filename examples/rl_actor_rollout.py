"""An RL post-training loop with three models, three layouts, one 4-rank world:

- actor:     tp=2 on ranks 0-1, a sub-world engine (ZeRO-1) only ranks 0-1 build;
- rollout:   dp=2 on ranks 2-3, a sub-world engine only ranks 2-3 build (full weights per rank);
- reference: dp=4 on every rank, frozen.

    torchrun --nproc-per-node 4 examples/rl_actor_rollout.py [--steps N]

Every iteration the actor's tp-sharded weights are moved into the rollout's layout with one call of
``mesh_core.transfer.transfer_weights`` (gathering the two tp shards into full tensors on
ranks 2 and 3; the hand-written tp layers' layouts are given, an AutoTP or ZeRO-3 actor's would be
read from the engine), then
checked bit for bit against the actor's weights gathered another way (all-gather over the actor's
tp group, sent by plain point-to-point). The rollout samples actions, the reference scores them,
and the experience goes back to the actor, which trains on it (policy gradient + KL to the reference).
"""

import argparse

import torch
import torch.distributed as dist
import torch.nn.functional as F

import compat

compat.install()  # or leave this out and run with DS_MESH=1

import deepspeed  # noqa: E402

from common import init_gloo, say, say0, shutdown  # noqa: E402

# isort: split
from rl_actor_reference import ACTIONS, HIDDEN, KL_COEF, OBS, TensorParallelPolicy  # noqa: E402

from mesh_core import DeepSpeedDeviceMesh  # noqa: E402
from mesh_core.transfer import ParamLayout, transfer_weights  # noqa: E402

ACTOR_RANKS, ROLLOUT_RANKS = [0, 1], [2, 3]
BASE = {"train_micro_batch_size_per_gpu": 8, "steps_per_print": 10**6}
ACTOR_CONFIG = {
    **BASE,
    "mesh": {"tp": 2, "ranks": ACTOR_RANKS},
    "zero_optimization": {"stage": 1},
    "optimizer": {"type": "Adam", "params": {"lr": 1e-2, "torch_adam": True}},
}
ROLLOUT_CONFIG = {**BASE, "mesh": {"ranks": ROLLOUT_RANKS}}
REFERENCE_CONFIG = {**BASE, "mesh": {"dp": 4}}
BATCH = 8

# the policy's parameters in each layout: the actor splits the hidden units over tp
FULL = {"up.weight": (HIDDEN, OBS), "up.bias": (HIDDEN,), "down.weight": (ACTIONS, HIDDEN), "bias": (ACTIONS,)}
ACTOR_LAYOUT = {
    "up.weight": ParamLayout(FULL["up.weight"], shard_dim=0),
    "up.bias": ParamLayout(FULL["up.bias"], shard_dim=0),
    "down.weight": ParamLayout(FULL["down.weight"], shard_dim=1),
    "bias": ParamLayout(FULL["bias"]),
}


class Policy(torch.nn.Module):
    """The same policy, unsharded (rollout and reference)."""

    def __init__(self) -> None:
        super().__init__()
        self.up = torch.nn.Linear(OBS, HIDDEN)
        self.down = torch.nn.Linear(HIDDEN, ACTIONS, bias=False)
        self.bias = torch.nn.Parameter(torch.zeros(ACTIONS))

    def forward(self, obs):
        return self.down(torch.relu(self.up(obs))) + self.bias


def params(engine) -> dict:
    return dict(engine.module.named_parameters())


def check_transfer(actor, rollout, mesh) -> bool:
    """Rollout ranks: are their weights bit-identical to the actor's, gathered independently?"""
    rank = dist.get_rank()
    same = True
    for name, layout in ACTOR_LAYOUT.items():
        if rank in ACTOR_RANKS:
            shard = params(actor)[name].detach()
            if layout.shard_dim is not None:
                pieces = [torch.empty_like(shard) for _ in range(2)]
                dist.all_gather(pieces, shard.contiguous(), group=mesh.get_group("tp"))
                shard = torch.cat(pieces, dim=layout.shard_dim)
            if rank == ACTOR_RANKS[0]:
                for peer in ROLLOUT_RANKS:
                    dist.send(shard.contiguous(), dst=peer)
        else:
            full = torch.empty(FULL[name])
            dist.recv(full, src=ACTOR_RANKS[0])
            same &= torch.equal(full, params(rollout)[name].detach())
    return same


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=4)
    steps = parser.parse_args().steps
    rank = init_gloo()
    actor = rollout = actor_mesh = None
    if rank in ACTOR_RANKS:  # ranks 2-3 never enter the actor's mesh or initialize
        actor_mesh = DeepSpeedDeviceMesh.build(tp=2, ranks=ACTOR_RANKS)
        torch.manual_seed(100 + actor_mesh.get_local_rank("tp"))
        policy = TensorParallelPolicy(actor_mesh.get_group("tp"), actor_mesh.size("tp"))
        actor, *_ = deepspeed.initialize(
            model=policy, model_parameters=policy.parameters(), config=ACTOR_CONFIG, mesh=actor_mesh
        )
    else:  # ranks 0-1 never enter the rollout's
        rollout, *_ = deepspeed.initialize(model=Policy(), config=ROLLOUT_CONFIG)
        rollout.eval()
    torch.manual_seed(0)
    reference, *_ = deepspeed.initialize(model=Policy(), config=REFERENCE_CONFIG)  # every rank
    reference.eval()
    say(
        f"actor {None if actor is None else actor.mesh_device.spec.describe()}; "
        f"rollout {None if rollout is None else rollout.mesh_device.spec.describe()}; "
        f"reference {reference.mesh_device.spec.describe()}"
    )

    actor_spec, rollout_spec = spec_of(ACTOR_CONFIG), spec_of(ROLLOUT_CONFIG)
    gen = torch.Generator().manual_seed(rank)
    for step in range(steps):
        before = None if rollout is None else [p.detach().clone() for p in rollout.module.parameters()]
        # every rank of both meshes, one call; a bad tensor or layout on any rank is the same error on all
        stats = transfer_weights(actor_spec, rollout_spec, actor, rollout, src_layouts=ACTOR_LAYOUT)
        same = check_transfer(actor, rollout, actor_mesh)
        if rank in ROLLOUT_RANKS:
            changed = any(not torch.equal(a, b.detach()) for a, b in zip(before, rollout.module.parameters()))
            say(
                f"step {step}: received {stats.received} elements in {stats.messages} messages; weights "
                f"{'changed' if changed else 'unchanged'}; rollout weights {'identical' if same else 'DIFFERENT'} "
                "to the actor's (bit for bit)"
            )
            if not same:
                raise RuntimeError("the transferred weights differ from the actor's")
            # roll out: sample actions with the fresh weights, score them with the reference
            obs = torch.randn(BATCH, OBS, generator=gen)
            with torch.no_grad():
                actions = torch.multinomial(F.softmax(rollout(obs), dim=-1), 1, generator=gen).squeeze(1)
                ref_logp = F.log_softmax(reference(obs), dim=-1)
            experience = torch.cat([obs, actions[:, None].float(), ref_logp], dim=1)
            for peer in ACTOR_RANKS:  # tp peers train on the same batch
                dist.send(experience, dst=peer)
        else:
            batches = []
            for peer in ROLLOUT_RANKS:
                buffer = torch.empty(BATCH, OBS + 1 + ACTIONS)
                dist.recv(buffer, src=peer)
                batches.append(buffer)
            experience = torch.cat(batches)
            obs, actions, ref_logp = experience[:, :OBS], experience[:, OBS].long(), experience[:, OBS + 1 :]
            logp = F.log_softmax(actor(obs), dim=-1)
            reward = (actions == obs.argmax(dim=-1) % ACTIONS).float()  # a toy task
            advantage = reward - reward.mean()
            pg_loss = -(advantage * logp.gather(1, actions[:, None]).squeeze(1)).mean()
            kl = (logp.exp() * (logp - ref_logp)).sum(dim=-1).mean()
            actor.backward(pg_loss + KL_COEF * kl)
            actor.step()
            say0(
                f"step {step}: actor trained on {len(obs)} rollouts, reward {reward.mean().item():.3f} "
                f"kl {kl.item():.4f}"
            )


def spec_of(config: dict):
    """The MeshSpec a config's "mesh" section describes, known to every rank (members or not)."""
    from mesh_core.config import spec_from_config

    return spec_from_config(config, dist.get_world_size())


if __name__ == "__main__":
    main()
    shutdown()
