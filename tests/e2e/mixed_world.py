"""An unchanged DeepSpeed job (AutoTP tp=2, or a pipeline pp=2) on one rank of a world, started as a
node's launcher would start it (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT`` in the
environment). The test starts some ranks with ``DS_MESH=1`` and others without, as when one node of
a multi-node launch is not on the shim. Nothing here knows about the shim.

Usage: ``python mixed_world.py autotp|pipe TIMEOUT_S MARK_FILE [DELAY_S]``; ``MARK_FILE`` gets the
wall-clock time at which this rank's process group was up (the test's deadline counts from there);
``DELAY_S``: this rank starts its job that much later (a slow node).
"""

import os
import sys
import time
from datetime import timedelta

import torch

os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.setdefault("OMP_NUM_THREADS", "1")


def autotp() -> None:
    import deepspeed

    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 8))
    specs = [
        {"patterns": [r".*0\.(weight|bias)$"], "partition_type": "column"},
        {"patterns": [r".*2\.weight$"], "partition_type": "row"},
    ]
    config = {
        "train_micro_batch_size_per_gpu": 2,
        "steps_per_print": 10**6,
        "optimizer": {"type": "Adam", "params": {"lr": 1e-2, "torch_adam": True}},
        "tensor_parallel": {"autotp_size": 2, "partition_config": {"use_default_specs": False, "layer_specs": specs}},
    }
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    x = torch.randn(2, 8)
    engine.backward(torch.nn.functional.mse_loss(engine(x), x))
    engine.step()


def pipe() -> None:
    import deepspeed
    from deepspeed.pipe import PipelineModule

    layers = [torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)]
    model = PipelineModule(layers=layers, num_stages=2, loss_fn=torch.nn.MSELoss(), partition_method="uniform")
    config = {
        "train_batch_size": 8,
        "train_micro_batch_size_per_gpu": 4,
        "steps_per_print": 10**6,
        "optimizer": {"type": "Adam", "params": {"lr": 1e-2, "torch_adam": True}},
    }
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)

    def data():
        while True:
            x = torch.randn(4, 8)
            yield x, x.sum(dim=1, keepdim=True)

    engine.train_batch(data_iter=data())


def main() -> None:
    job, timeout_s, mark = sys.argv[1], float(sys.argv[2]), sys.argv[3]
    import deepspeed

    sys.modules["deepspeed.comm.torch"].build_shm_op = lambda: None  # no JIT build of the shm op on CPU
    deepspeed.init_distributed(dist_backend="gloo", timeout=timedelta(seconds=timeout_s))
    with open(mark, "w") as fh:
        fh.write(str(time.time()))
    time.sleep(float(sys.argv[4]) if len(sys.argv) > 4 else 0.0)
    {"autotp": autotp, "pipe": pipe}[job]()
    import torch.distributed as dist

    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
