"""Real 4-process gloo run: collectives over the groups compat's legacy APIs hand out."""

from __future__ import annotations

import json
import os
import warnings

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from megatron_mpu import MegatronMPU

pytestmark = pytest.mark.torch_releases

WORLD = 4


def _sum_over(group, rank):
    value = torch.tensor([float(rank + 1)])
    dist.all_reduce(value, group=group)
    return value.item(), float(sum(r + 1 for r in dist.get_process_group_ranks(group)))


def _worker(rank: int, init_file: str, out_dir: str) -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    warnings.simplefilter("ignore")
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    import compat.groups as groups
    from compat import topology
    from compat.mpu import MeshMPU, mesh_from_mpu

    results = []

    def check(label, group):
        got, expected = _sum_over(group, rank)
        results.append([label, got, expected])

    # pipeline grids of both topology classes
    for label, topo in (
        ("grid(pp=2,dp=2)", topology.PipeDataParallelTopology(num_pp=2, num_dp=2)),
        ("grid(pp=1,mp=2,dp=2)", topology.PipeModelDataParallelTopology(num_pp=1, num_mp=2, num_dp=2)),
    ):
        grid = topology.PipelineParallelGrid(topology=topo)
        for getter in (
            "get_data_parallel_group",
            "get_pipe_parallel_group",
            "get_slice_parallel_group",
            "get_model_parallel_group",
        ):
            check(f"{label}.{getter}", getattr(grid, getter)())
        if grid.pipe_parallel_size > 1:  # activations to the next stage, as the pipe engine sends them
            peer = grid.stage_to_global((grid.stage_id + 1) % grid.pipe_parallel_size)
            send, recv = torch.tensor([float(rank)]), torch.tensor([-1.0])
            ops = [dist.P2POp(dist.isend, send, peer), dist.P2POp(dist.irecv, recv, peer)]
            for work in dist.batch_isend_irecv(ops):
                work.wait()
            results.append([f"{label}.p2p", recv.item(), float(peer)])
        groups.mpu = grid

    # the groups module: AutoTP, MoE (both orders), hpZ, world clone, the engine's underscore getters
    groups.mpu = None
    groups._init_tp_mesh_device(2)
    check("get_tensor_model_parallel_group", groups.get_tensor_model_parallel_group())
    check("get_data_parallel_group", groups.get_data_parallel_group())
    groups._create_expert_and_data_parallel(2)
    groups._create_expert_and_data_parallel(4, use_data_before_expert_parallel_=True)
    for name in ("ep_size_2", "ep_size_4"):
        check(f"ep {name}", groups._get_expert_parallel_group(name))
        check(f"edp {name}", groups._get_expert_data_parallel_group(name))
        # MoE params are broadcast from the EDP source rank
        value = torch.tensor([float(rank)])
        dist.broadcast(
            value, src=groups._get_expert_broadcast_src_rank(name), group=groups._get_expert_data_parallel_group(name)
        )
        results.append([f"bcast {name}", value.item(), float(groups._get_expert_broadcast_src_rank(name))])
    groups._create_zero_param_parallel_group(2)
    check("hpz", groups._get_zero_param_intra_parallel_group())
    check("world clone", groups._clone_world_group())
    check("_get_data_parallel_group", groups._get_data_parallel_group())

    # a user's mpu joins the mesh world; MeshMPU serves the engine from that mesh
    user = MegatronMPU.of_rank_lists({"dp": [[0, 2], [1, 3]], "tp": [[0, 1], [2, 3]]})  # tp consecutive, dp strided
    from torch.distributed import distributed_c10d

    before = distributed_c10d._world.group_count
    mesh = mesh_from_mpu(user)  # all-reduces the inferred layout across ranks
    results.append(["mesh_from_mpu creates no communicator", float(distributed_c10d._world.group_count - before), 0.0])
    mpu = MeshMPU(mesh)
    check("MeshMPU model parallel", mpu.get_model_parallel_group())
    check("MeshMPU sequence data parallel", mpu.get_sequence_data_parallel_group())
    groups.bind_mesh(mesh)
    check("bound _get_sequence_data_parallel_group", groups._get_sequence_data_parallel_group())

    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as fh:
        json.dump(results, fh)
    dist.barrier()  # no rank tears gloo down while a peer still talks to it (abort at exit)
    groups._release_process_group_references()
    dist.destroy_process_group()


@pytest.mark.multiprocess
def test_collectives_over_compat_groups(tmp_path):
    mp.spawn(_worker, args=(str(tmp_path / "store"), str(tmp_path)), nprocs=WORLD, join=True)
    labels = None
    for rank in range(WORLD):
        results = json.loads((tmp_path / f"rank{rank}.json").read_text())
        for label, got, expected in results:
            assert got == expected, (rank, label)
        assert labels is None or labels == [r[0] for r in results]
        labels = [r[0] for r in results]
    # grids 4 + p2p + 4, AutoTP 2, experts 2 x 3, hpZ + clone + dp 3, mpu / mesh 4
    assert len(labels) == 5 + 4 + 2 + 6 + 3 + 4
