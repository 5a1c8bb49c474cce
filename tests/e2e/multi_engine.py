"""Several engines in one 4-rank world (run by tests/test_multi_engine.py through torchrun).

Part "grid": two engines with different tp layouts interleave their steps; a Megatron-style model
reads the *global* legacy getters inside its forward and must get its own engine's tp group; outside
any step the getters raise WrongGridError naming both engines; compat.use_engine chooses one.
Part "halves" (sub-world engines): ranks 0-1 and 2-3 each build only their own engine over their
half ("mesh": {"ranks": [...]}), with ZeRO-1 on one half and ZeRO-2/3 on the other, then a third,
whole-world engine; every engine trains and its replicas stay identical.

usage: multi_engine.py OUT_DIR PART[,PART]
"""
from __future__ import annotations

import sys

import torch
import torch.distributed as dist

from common import dump, init_world, params_of, ranks, shutdown

import compat  # noqa: E402

compat.install()
import deepspeed  # noqa: E402
from deepspeed.utils import groups  # noqa: E402

BASE = {"train_micro_batch_size_per_gpu": 4, "steps_per_print": 10**6,
        "optimizer": {"type": "SGD", "params": {"lr": 0.05}}}


class GlobalGridModel(torch.nn.Module):
    """Legacy model code: asks deepspeed.utils.groups for "the" tp group inside forward."""

    def __init__(self, width: int = 8) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(width, width)
        self.seen: list[list[int]] = []

    def forward(self, x):
        group = groups.get_tensor_model_parallel_group()
        self.seen.append(ranks(group))
        y = self.lin(x)
        total = y.detach().clone()
        dist.all_reduce(total, group=group)  # the tp peers really talk over it
        return (y + 0 * total).pow(2).mean()


def part_grid(rank: int, out: dict) -> None:
    torch.manual_seed(0)
    a_model, b_model = GlobalGridModel(), GlobalGridModel()
    cfg_a = {**BASE, "mesh": {"tp": 2}}  # tp groups [0,1] [2,3]
    cfg_b = {**BASE, "mesh": {"tp": 2, "order": ["tp", "dp"]}}  # tp groups [0,2] [1,3]
    a, *_ = deepspeed.initialize(model=a_model, model_parameters=a_model.parameters(), config=cfg_a)
    # one engine: the getters serve it outside its steps, as legacy did
    out["single_engine_tp"] = ranks(groups.get_tensor_model_parallel_group())
    b, *_ = deepspeed.initialize(model=b_model, model_parameters=b_model.parameters(), config=cfg_b)
    x = torch.randn(4, 8)
    for _ in range(2):  # interleaved steps
        la = a(x)
        lb = b(x)
        a.backward(la)
        b.backward(lb)
        a.step()
        b.step()
    out["a_seen"], out["b_seen"] = a_model.seen, b_model.seen
    out["a_tp"], out["b_tp"] = a.mesh_device.get_group_ranks("tp"), b.mesh_device.get_group_ranks("tp")
    errors = {}
    for name, call in {
        "get_tensor_model_parallel_group": groups.get_tensor_model_parallel_group,
        "_get_data_parallel_group": groups._get_data_parallel_group,
        "mpu": lambda: groups.mpu.get_data_parallel_group(),
    }.items():
        try:
            call()
            errors[name] = None
        except compat.WrongGridError as err:
            errors[name] = str(err)
    out["errors"] = errors
    with compat.use_engine(b):
        out["use_b_tp"] = ranks(groups.get_tensor_model_parallel_group())
    with compat.use_engine(a):
        out["use_a_tp"] = ranks(groups.get_tensor_model_parallel_group())
    b.destroy()
    out["after_destroy_tp"] = ranks(groups.get_tensor_model_parallel_group())  # only a is left
    a.destroy()


PARTS = {"grid": part_grid}

if __name__ == "__main__":
    out_dir, parts = sys.argv[1], sys.argv[2].split(",")
    rank = init_world()
    results: dict = {}
    for part in parts:
        results[part] = {}
        PARTS[part](rank, results[part])
        dist.barrier()
    dump(out_dir, rank, results)
    shutdown()
