"""A MoE model (4 experts, ep=2) on 4 ranks: a few steps per mode; see common.py.

Modes: ``legacy``, ``legacy_mpu`` (a user mpu), ``shim``, ``shim_mpu``, ``shim_config`` (the config
``"mesh"`` section instead of an mpu), ``legacy_zero2`` / ``shim_zero2`` (ZeRO stage 2). Usage: ``torchrun --nproc_per_node 4 train_moe.py OUT [MODES]``.
"""

import sys
import warnings

import torch

import common

# isort: split
from simple_mpu import DataParallelMPU

STEPS = 3
# mode: (shim installed, with a user mpu, config "mesh" section, ZeRO stage)
MODES = {
    "legacy": (False, False, None, 0),
    "legacy_mpu": (False, True, None, 0),
    "shim": (True, False, None, 0),
    "shim_mpu": (True, True, None, 0),
    "shim_config": (True, False, {"dp": 4, "ep": 2}, 0),
    "legacy_zero2": (False, False, None, 2),
    "shim_zero2": (True, False, {"ep": 2}, 2),
}


class MoEModel(torch.nn.Module):
    def __init__(self) -> None:
        from deepspeed.moe.layer import MoE

        super().__init__()
        self.inp = torch.nn.Linear(8, 16)
        self.moe = MoE(16, torch.nn.Linear(16, 16), num_experts=4, ep_size=2, k=1, min_capacity=0)
        self.out = torch.nn.Linear(16, 1)

    def forward(self, x):
        hidden, _, _ = self.moe(torch.relu(self.inp(x)))
        return self.out(hidden)


def run(mode: str, rank: int) -> dict:
    import deepspeed
    from deepspeed.moe.utils import split_params_into_different_moe_groups_for_optimizer

    shim, with_mpu, mesh_section, zero_stage = MODES[mode]
    common.set_mode(shim)
    torch.manual_seed(0)
    model = MoEModel()
    groups = split_params_into_different_moe_groups_for_optimizer({"params": list(model.parameters()), "name": "p"})
    optimizer = torch.optim.Adam(groups, lr=1e-2)
    config = {
        "train_micro_batch_size_per_gpu": 8,
        "gradient_accumulation_steps": 1,
        "steps_per_print": 10**6,
        "zero_optimization": {"stage": zero_stage},
    }
    if mesh_section is not None:
        config["mesh"] = mesh_section
    before = common.group_count()
    mpu = DataParallelMPU() if with_mpu else None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=config, mpu=mpu)
    gen = torch.Generator().manual_seed(200 + rank)
    torch.manual_seed(300 + rank)  # the gate's random token selection
    losses = common.train_steps(engine, gen, STEPS, 8)
    result = {
        "losses": losses,
        "params": common.params_of(engine.module),
        "new_groups": common.group_count() - before,
        "optimizer": type(engine.optimizer).__name__,
        # warnings attributed to this script (deepspeed-internal call sites are not the user's)
        "todov1": [str(w.message) for w in caught if str(w.message).startswith("TODOV1:") and w.filename == __file__],
        "groups": {
            "dp": common.ranks(engine.data_parallel_group),
            "seq_dp": common.ranks(engine.seq_data_parallel_group),
            "ep": common.ranks(engine.expert_parallel_group["ep_size_2"]),
            "edp": common.ranks(engine.expert_data_parallel_group["ep_size_2"]),
        },
    }
    if shim:
        mesh = engine.mesh_device
        experts = mesh.expert_groups(2)
        result["mesh"] = {
            "type": type(mesh).__name__,
            "describe": mesh.spec.describe(),
            "dp": mesh.get_group_ranks("dp"),
            "ep": experts.ep_ranks,
            "edp": experts.edp_ranks,
            "same_objects": {
                "engine_dp": engine.data_parallel_group is mesh.get_group("dp"),
                "engine_seq_dp": engine.seq_data_parallel_group is mesh.get_group(("dp", "sp")),
                "engine_ep": engine.expert_parallel_group["ep_size_2"] is experts.ep_group,
                "engine_edp": engine.expert_data_parallel_group["ep_size_2"] is experts.edp_group,
                "moe_layer_ep": engine.module.moe.deepspeed_moe.ep_group is experts.ep_group,
                "legacy_alias": mesh.get_group(mesh_dim="data_parallel") is mesh.get_group("dp"),
            },
        }
    return result


def main() -> None:
    out_dir, modes = sys.argv[1], sys.argv[2:] or list(MODES)
    rank = common.init_world()
    results = {mode: run(mode, rank) for mode in modes}
    common.dump(out_dir, rank, results)


if __name__ == "__main__":
    main()
    common.shutdown()
