"""The mpus of the e2e scripts: a data-parallel Megatron-style one (the tests' shared
:class:`MegatronMPU`) and DeepSpeed's own test mpu, verbatim."""

import torch.distributed as dist
from megatron_mpu import ALL_GETTERS, MegatronMPU  # tests/ is on the path (common.py, conftest.py)

_DATA_PARALLEL_NAMES = {"data_parallel": "dp", "model_parallel": "tp", "tensor_model_parallel": "tp"}


def DataParallelMPU() -> MegatronMPU:
    """tp=1, every rank data parallel, as a user script would write it: the world's ranks as one data
    group, then a group of one per rank for the (tensor) model-parallel getters, made in that order
    by every rank."""
    world = dist.get_world_size()
    tp_getters = ("group", "world_size", "rank")
    return MegatronMPU.of_rank_lists(
        {"dp": [range(world)], "tp": [[r] for r in range(world)]},
        names=_DATA_PARALLEL_NAMES,
        getters={"data_parallel": ALL_GETTERS, "model_parallel": tp_getters, "tensor_model_parallel": tp_getters},
    )


class DSTestMPU:
    """DeepSpeed's own test MPU (tests/unit/v1/moe/test_moe_tp.py, 0.19.8), verbatim: only
    get_model_parallel_* and get_data_parallel_*."""

    def __init__(self, tp_world_size):
        import deepspeed

        self.rank = deepspeed.comm.get_rank()
        self.world_size = deepspeed.comm.get_world_size()
        self.tp_world_size = tp_world_size

        for i in range(0, self.world_size, tp_world_size):
            ranks = range(i, i + tp_world_size)
            group = deepspeed.comm.new_group(ranks)
            if self.rank in ranks:
                self.tp_group = group

        for i in range(0, tp_world_size):
            ranks = range(i, self.world_size, tp_world_size)
            group = deepspeed.comm.new_group(ranks)
            if self.rank in ranks:
                self.dp_group = group

    def get_model_parallel_rank(self):
        return self.rank % self.tp_world_size

    def get_model_parallel_world_size(self):
        return self.tp_world_size

    def get_data_parallel_rank(self):
        return self.rank // self.tp_world_size

    def get_data_parallel_world_size(self):
        return self.world_size // self.tp_world_size

    def get_data_parallel_group(self):
        return self.dp_group

    def get_model_parallel_group(self):
        return self.tp_group
