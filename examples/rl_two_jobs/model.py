"""The policy both jobs hold: whole in the trainer (ZeRO-3 partitions it), split tp=2 in the rollout."""

import torch

from mesh_core.transfer import ParamLayout

OBS, HIDDEN, ACTIONS = 10, 18, 4
FULL = {
    "up.weight": (HIDDEN, OBS),
    "up.bias": (HIDDEN,),
    "norm.weight": (HIDDEN,),
    "norm.bias": (HIDDEN,),
    "down.weight": (ACTIONS, HIDDEN),
    "down.bias": (ACTIONS,),
}
# the rollout's tensor-parallel layout (Megatron split: up by rows, down by columns; the rest whole)
ROLLOUT_LAYOUTS = {
    "up.weight": ParamLayout(FULL["up.weight"], shard_dim=0),
    "up.bias": ParamLayout(FULL["up.bias"], shard_dim=0),
    "norm.weight": ParamLayout(FULL["norm.weight"]),
    "norm.bias": ParamLayout(FULL["norm.bias"]),
    "down.weight": ParamLayout(FULL["down.weight"], shard_dim=1),
    "down.bias": ParamLayout(FULL["down.bias"]),
}


class Policy(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = torch.nn.Linear(OBS, HIDDEN)
        self.norm = torch.nn.LayerNorm(HIDDEN)
        self.down = torch.nn.Linear(HIDDEN, ACTIONS)

    def forward(self, obs):
        return self.down(torch.relu(self.norm(self.up(obs))))
