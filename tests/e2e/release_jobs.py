"""A ZeRO-2 job (dp=2) and a pipeline job (pp=2), plain deepspeed then the shim, in one 2-rank world.

Runs on whichever deepspeed the interpreter has (tools/run_releases.py runs it in one venv per
release). Each rank dumps ``{job: {mode: {"losses", "params", "installed"}}}`` and the deepspeed
version. Usage: ``torchrun --nproc_per_node 2 release_jobs.py OUT``.
"""

import sys

import torch

import common

# isort: split

STEPS = 3


def zero2(rank: int) -> dict:
    import deepspeed

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    config = {
        "train_micro_batch_size_per_gpu": 4,
        "gradient_accumulation_steps": 1,
        "optimizer": {"type": "Adam", "params": {"lr": 1e-2, "torch_adam": True}},
        "zero_optimization": {"stage": 2},
        "steps_per_print": 10**6,
    }
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    losses = common.train_steps(engine, torch.Generator().manual_seed(100 + rank), STEPS, 4)
    return {"losses": losses, "params": common.params_of(engine.module)}


def pipeline(rank: int) -> dict:
    import deepspeed
    from deepspeed.pipe import PipelineModule

    torch.manual_seed(0)
    layers = [torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)]
    model = PipelineModule(layers=layers, num_stages=2, loss_fn=torch.nn.MSELoss(), partition_method="uniform")
    config = {
        "train_batch_size": 8,
        "train_micro_batch_size_per_gpu": 4,
        "optimizer": {"type": "Adam", "params": {"lr": 1e-2, "torch_adam": True}},
        "steps_per_print": 10**6,
    }
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    gen = torch.Generator().manual_seed(100)

    def data():
        while True:
            x = torch.randn(4, 8, generator=gen)
            yield x, x.sum(dim=1, keepdim=True)

    it = data()
    losses = [engine.train_batch(data_iter=it).item() for _ in range(STEPS)]
    return {"losses": losses, "params": common.params_of(engine.module)}


def main(out_dir: str) -> None:
    import deepspeed

    import compat.install as installer

    rank = common.init_world()
    results: dict = {"version": deepspeed.__version__}
    for job in (zero2, pipeline):
        results[job.__name__] = {}
        for mode in ("plain", "shim"):
            common.set_mode(mode == "shim")
            result = job(rank)
            result["installed"] = installer.is_installed()
            results[job.__name__][mode] = result
    common.set_mode(False)
    common.dump(out_dir, rank, results)
    common.shutdown()


if __name__ == "__main__":
    main(sys.argv[1])
