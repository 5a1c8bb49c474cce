"""Engine initialisation time and communicator count, legacy deepspeed vs the shim, same run.

    python bench/bench_initialize.py [--reps 3] [--world 4]

The workload is examples/pipeline_pp2_dp2.py's model and config (PipelineModule pp=2 x dp=2 on
4 gloo processes). Each repetition builds the PipelineModule and calls ``deepspeed.initialize``
once without the shim and once with ``compat.install()``; "time" is the slowest rank's wall time
for the two calls, "communicators" the ``new_group`` calls c10d counted meanwhile (``install()``
itself, a one-time cost per process, is outside the timed region). The shim's
meshes are destroyed after each repetition, so every repetition creates its communicators afresh.
Prints the medians and the ratios shim / legacy.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.setdefault("OMP_NUM_THREADS", "1")

CONFIG = {
    "train_micro_batch_size_per_gpu": 4,
    "gradient_accumulation_steps": 2,
    "optimizer": {"type": "Adam", "params": {"lr": 1e-2, "torch_adam": True}},
    "steps_per_print": 10**6,
}


def build_engine(shim: bool):
    import deepspeed
    import torch
    from deepspeed.pipe import PipelineModule

    torch.manual_seed(0)
    layers = [torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)]
    model = PipelineModule(layers=layers, num_stages=2, loss_fn=torch.nn.MSELoss(), partition_method="uniform")
    config = dict(CONFIG, mesh={"pp": 2, "dp": 2}) if shim else CONFIG
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    return engine


def measure(shim: bool) -> tuple[float, int, object]:
    import torch
    import torch.distributed as dist

    import compat.install as installer

    (installer.install if shim else installer.uninstall)()  # a one-time cost per process, not timed
    dist.barrier()
    groups_before = dist.distributed_c10d._world.group_count
    start = time.perf_counter()
    engine = build_engine(shim)
    elapsed = torch.tensor([time.perf_counter() - start])
    created = dist.distributed_c10d._world.group_count - groups_before
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    return elapsed.item(), created, engine


def worker(rank: int, world: int, port: int, reps: int) -> None:
    import contextlib
    import io
    import logging

    os.environ.update(
        RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
    )
    import deepspeed

    import compat.groups

    sys.modules["deepspeed.comm.torch"].build_shm_op = lambda: None  # skip the shm op's JIT build
    deepspeed.init_distributed(dist_backend="gloo")
    logging.getLogger("DeepSpeed").setLevel(logging.WARNING)
    results: dict[str, list] = {"legacy": [], "shim": []}
    with contextlib.redirect_stdout(io.StringIO()):  # the legacy grid prints its topology on rank 0
        measure(False)  # warm-up: first-call imports and allocations, not measured
        for _ in range(reps):
            for mode in ("legacy", "shim"):
                elapsed, created, engine = measure(mode == "shim")
                results[mode].append((elapsed, created))
                if mode == "shim":
                    compat.groups.bind_mesh(None)
                    engine.mesh_device.destroy()
    if rank == 0:
        report(results, world)
    import torch.distributed as dist

    dist.barrier()  # a rank leaving while gloo peers hold connections to it can abort
    dist.destroy_process_group()


def report(results: dict[str, list], world: int) -> None:
    legacy_t = statistics.median(t for t, _ in results["legacy"])
    shim_t = statistics.median(t for t, _ in results["shim"])
    legacy_c = statistics.median(c for _, c in results["legacy"])
    shim_c = statistics.median(c for _, c in results["shim"])
    print(f"pipeline example (pp=2 x dp=2, {world} gloo processes), median of {len(results['legacy'])} repetitions")
    print(f"{'':14}{'init time (s)':>15}{'communicators':>15}")
    print(f"{'legacy':14}{legacy_t:>15.3f}{legacy_c:>15.0f}")
    print(f"{'shim':14}{shim_t:>15.3f}{shim_c:>15.0f}")
    print(f"{'shim / legacy':14}{shim_t / legacy_t:>15.2f}{shim_c / legacy_c:>15.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--world", type=int, default=4)
    args = parser.parse_args()
    import torch.multiprocessing as mp

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    mp.spawn(worker, args=(args.world, port, args.reps), nprocs=args.world, join=True)


if __name__ == "__main__":
    main()
