"""Real 4-process gloo run: all-reduce over every group of dp×pp×tp meshes and check the sums."""

from __future__ import annotations

import json
import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from mesh_core import DeepSpeedDeviceMesh

WORLD = 4
LAYOUTS = [
    dict(pp=2, dp=1, tp=2),
    dict(pp=1, dp=2, tp=2),
    dict(pp=2, dp=2, tp=1, ep=2),
    dict(dp=2, sp=2, ep=2),
    dict(dp_replicate=2, dp_shard=2),
]
DIMS = ["pp", "dp", "tp", "sp", ("dp", "sp"), ("pp", "tp"), ("pp", "dp", "tp"), "ep", "edp"]


def _worker(rank: int, init_file: str, out_dir: str) -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    results = []
    meshes = [DeepSpeedDeviceMesh.build(**layout) for layout in LAYOUTS]
    meshes.append(DeepSpeedDeviceMesh.build(ranks=[3, 1], tp=2))  # a sub-world mesh
    for mesh in meshes:
        for dims in DIMS:
            group = mesh.ensure_group(dims)  # members create their group; non-members get None, no call
            if not mesh.is_member:
                continue
            value = torch.tensor([float(rank + 1)])
            dist.all_reduce(value, group=group)
            expected = sum(r + 1 for r in mesh.get_group_ranks(dims))
            results.append([repr(mesh.spec), str(dims), value.item(), expected])
        if mesh.spec.dim_size("pp") > 1 and mesh.is_member:
            peer = mesh.stage_to_global((mesh.get_rank("pp") + 1) % mesh.size("pp"))
            send, recv = torch.tensor([float(rank)]), torch.tensor([-1.0])
            if mesh.get_rank("pp") == 0:
                dist.send(send, peer)
                dist.recv(recv, peer)
            else:
                dist.recv(recv, peer)
                dist.send(send, peer)
            results.append([repr(mesh.spec), "p2p", recv.item(), float(peer)])
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as fh:
        json.dump(results, fh)
    dist.barrier()  # no rank tears gloo down while a peer still talks to it (abort at exit)
    for mesh in meshes:
        mesh.destroy()
    dist.destroy_process_group()


@pytest.mark.multiprocess
def test_all_reduce_over_every_group(tmp_path):
    mp.spawn(_worker, args=(str(tmp_path / "store"), str(tmp_path)), nprocs=WORLD, join=True)
    checked = 0
    for rank in range(WORLD):
        results = json.loads((tmp_path / f"rank{rank}.json").read_text())
        for spec, dims, got, expected in results:
            assert got == expected, (rank, spec, dims)
            checked += 1
    # 5 full meshes x 9 dim sets on 4 ranks + sub-world on 2 ranks + p2p exchanges
    assert checked == 5 * 9 * 4 + 9 * 2 + 2 * 4
