"""An unchanged DeepSpeed script (ZeRO-1 over every rank) that says, on each rank, whether it runs on
the mesh: start it the way you start your job, on every node, to check that every node is on the shim.

    DS_MESH=1 torchrun --nnodes 2 --node-rank 0 --nproc-per-node 4 --master-addr HOST0 --master-port 29500 \
        examples/multinode_check.py                         # on node 0; --node-rank 1 on node 1
    DS_MESH=1 deepspeed --hostfile hostfile examples/multinode_check.py

Each rank prints one line: ``rank 3 of 8 on host-b: DS_MESH=1, shim on, mesh MeshSpec(dp=8; ...)``.
A rank without the shim prints ``shim off`` (if the job gets that far: see docs/multinode.md).
"""

import os
import socket
import sys

import torch

from common import init_gloo, shutdown

# isort: split

import deepspeed  # noqa: E402  (after common: it sets the CPU defaults)

CONFIG = {
    "train_micro_batch_size_per_gpu": 2,
    "zero_optimization": {"stage": 1},
    "optimizer": {"type": "Adam", "params": {"lr": 1e-2, "torch_adam": True}},
    "steps_per_print": 10**6,
}


def main() -> None:
    rank = init_gloo()
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=CONFIG)
    for _ in range(2):
        x = torch.randn(2, 8)
        engine.backward(torch.nn.functional.mse_loss(engine(x), x.sum(dim=1, keepdim=True)))
        engine.step()
    mesh = getattr(engine, "mesh_device", None)
    spec = getattr(mesh, "spec", None)  # the shim's engine mesh; plain DeepSpeed has none here
    state = f"shim on, mesh {spec.describe()}" if spec is not None else "shim off"
    # one write per line: the ranks of a node share its stdout (unbuffered under the launchers' python -u)
    sys.stdout.write(
        f"rank {rank} of {torch.distributed.get_world_size()} on {socket.gethostname()}: "
        f"DS_MESH={os.environ.get('DS_MESH', '')}, {state}\n"
    )
    sys.stdout.flush()


if __name__ == "__main__":
    main()
    shutdown()
