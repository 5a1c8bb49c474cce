"""A MoE model (4 experts, ep=2) trained data parallel over 4 ranks on the mesh.

    torchrun --nproc-per-node 4 examples/moe_ep2.py

The config's "mesh" section says ep=2 (it must match the MoE layers' ep_size); the expert and
expert-data groups the layers use are ``engine.mesh_device.expert_groups(2)``.
"""

import argparse

import torch

import compat

compat.install()  # or leave this out and run with DS_MESH=1

import deepspeed  # noqa: E402
from deepspeed.moe.layer import MoE  # noqa: E402
from deepspeed.moe.utils import split_params_into_different_moe_groups_for_optimizer  # noqa: E402

from common import init_gloo, ranks, say, say0, shutdown  # noqa: E402

# isort: split

CONFIG = {"mesh": {"ep": 2}, "train_micro_batch_size_per_gpu": 8, "steps_per_print": 10**6}


class MoEModel(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = torch.nn.Linear(8, 16)
        self.moe = MoE(16, torch.nn.Linear(16, 16), num_experts=4, ep_size=2, k=1, min_capacity=0)
        self.out = torch.nn.Linear(16, 1)

    def forward(self, x):
        hidden, _aux_loss, _ = self.moe(torch.relu(self.inp(x)))
        return self.out(hidden)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=5)
    steps = parser.parse_args().steps
    rank = init_gloo()
    torch.manual_seed(0)
    model = MoEModel()
    param_groups = split_params_into_different_moe_groups_for_optimizer(
        {"params": list(model.parameters()), "name": "p"}
    )
    optimizer = torch.optim.Adam(param_groups, lr=1e-2)
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=CONFIG)
    experts = engine.mesh_device.expert_groups(2)
    say0(f"mesh: {engine.mesh_device}")
    say(
        f"ep group {experts.ep_ranks}, expert-data group {experts.edp_ranks},"
        f" engine ep group {ranks(engine.expert_parallel_group['ep_size_2'])}"
    )
    gen = torch.Generator().manual_seed(rank)
    for step in range(steps):
        x = torch.randn(8, 8, generator=gen)
        loss = torch.nn.functional.mse_loss(engine(x), x.sum(dim=1, keepdim=True))
        engine.backward(loss)
        engine.step()
        say0(f"step {step}: loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
    shutdown()
