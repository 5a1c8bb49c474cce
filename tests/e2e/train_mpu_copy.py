"""Engines that reach DeepSpeed's mpu / bwc call sites, on whichever ``deepspeed`` is first on
PYTHONPATH (the installed one, or a copy migrated by ``codemods.rules.mpu_internal``); see common.py.

Modes (4 ranks): ``test_mpu`` — DeepSpeed's test MPU with tp=2 (only get_model_parallel_* and
get_data_parallel_*), ZeRO stage 1 with gradient clipping; ``megatron`` — a Megatron-style mpu
(tp=2, tensor/pipeline/data getters), no ZeRO, gradient clipping; ``pipe`` — PipelineModule pp=2 x
dp=2 (the grid is the mpu), ZeRO stage 1. Usage: ``torchrun --nproc_per_node 4 train_mpu_copy.py OUT``.
"""

import sys

import torch

import common

# isort: split
from simple_mpu import DSTestMPU

STEPS = 3
QUERIES = [0]  # MpuMesh queries answered (a migrated package asks mesh_of; the installed one never)


def count_queries() -> None:
    from mesh_core.roles.mpu_mesh import MpuMesh

    original = MpuMesh._call

    def counted(self, dims, what):
        QUERIES[0] += 1
        return original(self, dims, what)

    MpuMesh._call = counted


class MegatronMPU(DSTestMPU):
    """The same layout with Megatron's newer getter names (tensor / pipeline / data)."""

    def get_tensor_model_parallel_rank(self):
        return self.get_model_parallel_rank()

    def get_tensor_model_parallel_world_size(self):
        return self.get_model_parallel_world_size()

    def get_tensor_model_parallel_group(self):
        return self.get_model_parallel_group()

    def get_pipeline_model_parallel_world_size(self):
        return 1

    def get_pipeline_model_parallel_rank(self):
        return 0


def batches(dp_rank: int):
    gen = torch.Generator().manual_seed(100 + dp_rank)
    while True:
        x = torch.randn(4, 8, generator=gen)
        yield x, x.sum(dim=1, keepdim=True)


def layers():
    torch.manual_seed(0)
    return [torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)]


def config(zero_stage: int, micro: int, accumulation: int, dp: int) -> dict:
    return {
        "train_batch_size": micro * accumulation * dp,
        "train_micro_batch_size_per_gpu": micro,
        "gradient_accumulation_steps": accumulation,
        "optimizer": {"type": "Adam", "params": {"lr": 1e-2, "torch_adam": True}},
        "gradient_clipping": 0.5,
        "steps_per_print": 10**6,
        "zero_optimization": {"stage": zero_stage},
    }


def run(mode: str, rank: int) -> dict:
    import deepspeed

    if mode == "pipe":
        from deepspeed.pipe import PipelineModule

        model = PipelineModule(layers=layers(), num_stages=2, loss_fn=torch.nn.MSELoss(), partition_method="uniform")
        engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config(1, 4, 2, 2))
        data = batches(engine.grid.get_data_parallel_id())
        losses = [engine.train_batch(data_iter=data).item() for _ in range(STEPS)]
    else:
        mpu = DSTestMPU(2) if mode == "test_mpu" else MegatronMPU(2)
        model = torch.nn.Sequential(*layers())
        zero = 1 if mode == "test_mpu" else 0
        engine, *_ = deepspeed.initialize(
            model=model, model_parameters=model.parameters(), mpu=mpu, config=config(zero, 4, 1, 2)
        )
        data = batches(mpu.get_data_parallel_rank())
        losses = []
        for _ in range(STEPS):
            x, y = next(data)
            loss = torch.nn.functional.mse_loss(engine(x), y)
            engine.backward(loss)
            engine.step()
            losses.append(loss.item())
    queries, QUERIES[0] = QUERIES[0], 0
    return {
        "losses": losses,
        "params": common.params_of(engine.module),
        "dp": engine.dp_world_size,
        "mp": engine.mp_world_size,
        "optimizer": type(engine.optimizer).__name__,
        "mpu_queries": queries,
    }


def main() -> None:
    out_dir = sys.argv[1]
    rank = common.init_world()
    count_queries()
    import deepspeed

    results = {"deepspeed": deepspeed.__file__, **{mode: run(mode, rank) for mode in ("test_mpu", "megatron", "pipe")}}
    common.dump(out_dir, rank, results)


if __name__ == "__main__":
    main()
    common.shutdown()
