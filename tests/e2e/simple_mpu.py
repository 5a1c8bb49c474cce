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
