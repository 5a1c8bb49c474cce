"""An unbound NCCL world (DeepSpeed's on torch 2.6.x+cuXXX and 2.7.0, and on a world of 1): before
anyone calls ``set_device`` every rank's current device is cuda:0, so collectives the shim runs there
would put every rank of a node on one GPU. A script that leaves ``set_device`` to DeepSpeed must run
under the shim as it runs plain: the shim's tensors land on the rank's own device (``LOCAL_RANK``, the
device DeepSpeed's engine selects). Modelled on CPU by tests/fakenccl.py (the NCCL world) and
tests/fakedevice.py (the process's current device)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from fakedevice import current_device
from fakenccl import nccl_world, run_ranks

pytestmark = pytest.mark.torch_releases

WORLD = 4


class _MegatronMPU:
    """A script's own mpu (tp=2 x dp=2, Megatron's order), groups made with plain ``new_group``."""

    def __init__(self) -> None:
        rank = dist.get_rank()
        self.groups = {}
        for dim, sets in {"tp": ([0, 1], [2, 3]), "dp": ([0, 2], [1, 3])}.items():
            for ranks in sets:
                group = dist.new_group(ranks)
                if rank in ranks:
                    self.groups[dim] = group

    def get_data_parallel_group(self):
        return self.groups["dp"]

    def get_tensor_model_parallel_group(self):
        return self.groups["tp"]

    def get_model_parallel_world_size(self):
        return 2

    def get_model_parallel_rank(self):
        return dist.get_rank(self.groups["tp"])

    def get_data_parallel_world_size(self):
        return 2

    def get_data_parallel_rank(self):
        return dist.get_rank(self.groups["dp"])


def test_the_device_of_an_unbound_world_is_the_ranks_own_before_set_device(monkeypatch):
    from mesh_core import torch_compat

    monkeypatch.setenv("LOCAL_RANK", "3")
    with nccl_world(3, WORLD, bound=False), current_device() as device:
        assert torch_compat.default_device() == torch.device("cuda", 3)  # not the current cuda:0
        assert device.selected == []  # a question, not a choice: nothing selected
        torch.cuda.set_device(2)  # the script's own choice stands
        assert torch_compat.default_device() == torch.device("cuda", 2)


def test_without_local_rank_or_with_one_gpu_per_process_it_is_the_current_device(monkeypatch):
    from mesh_core import torch_compat

    monkeypatch.delenv("LOCAL_RANK", raising=False)
    with nccl_world(3, WORLD, bound=False), current_device():
        assert torch_compat.default_device() == torch.device("cuda", 0)
    monkeypatch.setenv("LOCAL_RANK", "3")
    with nccl_world(3, WORLD, bound=False), current_device(device_count=1):  # CUDA_VISIBLE_DEVICES=<its own>
        assert torch_compat.default_device() == torch.device("cuda", 0)


def test_deepspeed_initialize_with_an_mpu_under_the_shim_allocates_on_local_rank_only(monkeypatch):
    """LOCAL_RANK=r, no set_device in the script, an unbound world: every tensor deepspeed.initialize
    (mpu=...) allocates under the shim is on cuda:r (the agreement all-reduce of the mpu's layout ran on
    cuda:0 on every rank: NCCL's duplicate-GPU failure); DeepSpeed's engine still selects the device."""
    import deepspeed

    import compat

    config = {
        "train_micro_batch_size_per_gpu": 1,
        "steps_per_print": 10**6,
        "optimizer": {"type": "Adam", "params": {"torch_adam": True}},
    }
    selected = {}

    def scenario(rank):
        monkeypatch.setenv("LOCAL_RANK", str(rank))
        monkeypatch.setenv("RANK", str(rank))
        with current_device() as device:
            mpu = _MegatronMPU()
            compat.install()
            try:
                engine = deepspeed.initialize(model=torch.nn.Linear(4, 4), config=config, mpu=mpu)[0]
                out = (engine.mesh_device.device_type, engine.mesh_device.get_group_ranks("tp"))
                engine.destroy()
            finally:
                compat.uninstall()
            selected[rank] = device.selected
        return out

    monkeypatch.setenv("WORLD_SIZE", str(WORLD))
    logs = run_ranks(scenario, WORLD, bound=False, deepspeed_comm=True)
    assert [log.result for log in logs] == [("cuda", [0, 1]), ("cuda", [0, 1]), ("cuda", [2, 3]), ("cuda", [2, 3])]
    for log in logs:
        assert log.allocations, f"rank {log.rank}: the mpu's layout was not agreed on"
        assert set(log.allocations) == {torch.device("cuda", log.rank)}, (log.rank, log.allocations)
        assert ("deepspeed accelerator", log.rank) in selected[log.rank]  # the engine's own set_device


def test_torch_2_6_names_the_current_device_query_current_device_idx(monkeypatch):
    """torch 2.6 (the release DeepSpeed leaves unbound) has ``torch.accelerator.current_device_idx``
    only; ``current_device_index`` came in 2.7."""
    from mesh_core import torch_compat

    monkeypatch.delenv("LOCAL_RANK", raising=False)
    with nccl_world(1, WORLD, bound=False), monkeypatch.context() as patch:
        patch.delattr(torch.accelerator, "current_device_index")
        patch.setattr(torch.accelerator, "current_device_idx", lambda: 2, raising=False)
        assert torch_compat.default_device() == torch.device("cuda", 2)
