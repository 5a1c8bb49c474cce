"""PipelineModule pp=2 x dp=2: a few train_batch steps per mode; see common.py.

Modes: ``legacy`` (no shim), ``shim`` (unchanged script, shim installed), ``shim_config`` (shim
plus the config ``"mesh"`` section), and ``legacy_zero1`` / ``shim_zero1`` with ZeRO stage 1. Usage: ``torchrun --nproc_per_node 4 train_pipe.py OUT``.
"""

import sys

import torch

import common

# isort: split

STEPS = 3
# mode: (shim installed, config "mesh" section, ZeRO stage)
MODES = {
    "legacy": (False, None, 0),
    "shim": (True, None, 0),
    "shim_config": (True, {"pp": 2, "dp": 2}, 0),
    "legacy_zero1": (False, None, 1),
    "shim_zero1": (True, {"pp": 2, "dp": 2}, 1),
}


def batches(rank: int):
    gen = torch.Generator().manual_seed(100 + rank % 2)  # the dp index picks the data
    while True:
        x = torch.randn(4, 8, generator=gen)
        yield x, x.sum(dim=1, keepdim=True)


def run(mode: str, rank: int) -> dict:
    import deepspeed
    from deepspeed.pipe import PipelineModule

    shim, mesh_section, zero_stage = MODES[mode]
    common.set_mode(shim)
    torch.manual_seed(0)
    layers = [torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)]
    before = common.group_count()
    model = PipelineModule(layers=layers, num_stages=2, loss_fn=torch.nn.MSELoss(), partition_method="uniform")
    config = {
        "train_batch_size": 16,
        "train_micro_batch_size_per_gpu": 4,
        "gradient_accumulation_steps": 2,
        "optimizer": {"type": "Adam", "params": {"lr": 1e-2, "torch_adam": True}},
        "steps_per_print": 10**6,
        "zero_optimization": {"stage": zero_stage},
    }
    if mesh_section is not None:
        config["mesh"] = mesh_section
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    data = batches(rank)
    losses = [engine.train_batch(data_iter=data).item() for _ in range(STEPS)]
    result = {
        "losses": losses,
        "params": common.params_of(engine.module),
        "new_groups": common.group_count() - before,
        "optimizer": type(engine.optimizer).__name__,
    }
    grid = engine.grid
    result["groups"] = {
        "dp": common.ranks(grid.get_data_parallel_group()),
        "pp": common.ranks(grid.get_pipe_parallel_group()),
        "engine_dp": common.ranks(engine.data_parallel_group),
        "engine_seq_dp": common.ranks(engine.seq_data_parallel_group),
    }
    if shim:
        mesh = engine.mesh_device
        result["mesh"] = {
            "type": type(mesh).__name__,
            "describe": mesh.spec.describe(),
            "dp": mesh.get_group_ranks("dp"),
            "pp": mesh.get_group_ranks("pp"),
            # the engine's and grid's groups are the mesh's communicators, not copies
            "same_objects": {
                "engine_dp": engine.data_parallel_group is mesh.get_group("dp"),
                "engine_seq_dp": engine.seq_data_parallel_group is mesh.get_group("dp"),
                "grid_dp": grid.get_data_parallel_group() is mesh.get_group("dp"),
                "grid_pp": grid.get_pipe_parallel_group() is mesh.get_group("pp"),
                "grid_mesh": grid.mesh is mesh,
                "legacy_alias": mesh.get_group(mesh_dim="data_parallel") is mesh.get_group("dp"),
            },
            "legacy_size": mesh.size(mesh_dim="data_parallel"),
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
