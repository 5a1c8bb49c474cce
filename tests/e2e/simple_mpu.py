"""A minimal Megatron-style mpu (tp=1, every rank data parallel), as a user script would write it."""

import torch.distributed as dist


class DataParallelMPU:
    def __init__(self) -> None:
        world = dist.get_world_size()
        self._dp = dist.new_group(ranks=list(range(world)))
        self._mp = None
        for r in range(world):  # collective: every rank creates every singleton
            group = dist.new_group(ranks=[r])
            if r == dist.get_rank():
                self._mp = group

    def get_data_parallel_group(self):
        return self._dp

    def get_data_parallel_world_size(self):
        return dist.get_world_size(self._dp)

    def get_data_parallel_rank(self):
        return dist.get_rank(self._dp)

    def get_data_parallel_group_ranks(self):
        return list(range(dist.get_world_size()))

    def get_model_parallel_group(self):
        return self._mp

    def get_model_parallel_world_size(self):
        return 1

    def get_model_parallel_rank(self):
        return 0

    get_tensor_model_parallel_group = get_model_parallel_group
    get_tensor_model_parallel_world_size = get_model_parallel_world_size
    get_tensor_model_parallel_rank = get_model_parallel_rank


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
