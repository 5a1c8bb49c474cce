"""A PipelineModule trained with pp=2 x dp=2 on the mesh.

    torchrun --nproc-per-node 4 examples/pipeline_pp2_dp2.py

The layout is stated once, in the config's "mesh" section; the PipelineModule's stages must agree
with it. ``engine.mesh_device`` is the mesh the pipeline grid, the engine and ZeRO all use.
"""

import argparse

import torch

import compat

compat.install()  # or leave this out and run with DS_MESH=1

import deepspeed  # noqa: E402
from deepspeed.pipe import PipelineModule  # noqa: E402

from common import init_gloo, ranks, say, say0, shutdown  # noqa: E402

# isort: split

CONFIG = {
    "mesh": {"pp": 2, "dp": 2},
    "train_micro_batch_size_per_gpu": 4,
    "gradient_accumulation_steps": 2,
    "optimizer": {"type": "Adam", "params": {"lr": 1e-2, "torch_adam": True}},
    "steps_per_print": 10**6,
}


def batches(dp_rank: int):
    gen = torch.Generator().manual_seed(dp_rank)
    while True:
        x = torch.randn(4, 8, generator=gen)
        yield x, x.sum(dim=1, keepdim=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=5)
    steps = parser.parse_args().steps
    init_gloo()
    torch.manual_seed(0)
    layers = [torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)]
    model = PipelineModule(layers=layers, num_stages=2, loss_fn=torch.nn.MSELoss(), partition_method="uniform")
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=CONFIG)
    mesh = engine.mesh_device
    say0(f"mesh: {mesh}")
    say(
        f"stage {engine.stage_id}: pp group {mesh.get_group_ranks('pp')}, dp group {mesh.get_group_ranks('dp')},"
        f" engine dp group {ranks(engine.data_parallel_group)}"
    )
    data = batches(mesh.get_local_rank("dp"))
    for step in range(steps):
        loss = engine.train_batch(data_iter=data)
        say0(f"step {step}: loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
    shutdown()
