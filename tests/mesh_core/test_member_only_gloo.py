"""Real 4-process gloo run of member-only creation: collectives over every group, two meshes
sharing rank sets, a sub-world mesh its non-members never touch (built first, so members and
non-members hold different numbers of groups when the shared ones are created), a world-collective
counter-named group afterwards, and the sub-world consistency check among members only."""

from __future__ import annotations

import json
import os

import pytest
import torch
import torch.distributed as dist

from spawn import run_ranks

WORLD = 4
TIMEOUT_S = 180
DIMS = ["pp", "dp", "tp", ("dp", "tp"), ("pp", "dp"), "ep", "edp"]


def _reduce(group, rank: int) -> float:
    value = torch.tensor([float(rank + 1)])
    dist.all_reduce(value, group=group)
    return value.item()


def _worker(rank: int, init_file: str, out_dir: str) -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    import sys

    sys.path.insert(0, os.path.dirname(os.path.dirname(__file__)))
    from fakepg import record_new_groups
    from mesh_core import DeepSpeedDeviceMesh, MeshSpecError

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    out: dict = {"checks": [], "errors": {}}
    with record_new_groups() as calls:
        sub = None
        if rank in (1, 3):  # only the members build it; ranks 0 and 2 never construct it
            sub = DeepSpeedDeviceMesh.build(ranks=[3, 1], tp=2, flatten=[("dp", "tp")])
        a = DeepSpeedDeviceMesh.build(pp=2, ep=2, flatten=[("pp", "dp")], p2p_groups=True)
        b = DeepSpeedDeviceMesh.build(dp=2, tp=2)  # its tp groups are a's dp groups, its dp a's pp
    out["calls"] = calls
    out["shared_tp"] = b.get_group("tp") is a.get_group("dp") is a.get_group("ep")
    out["shared_dp"] = b.get_group("dp") is a.get_group("pp")
    for mesh in [m for m in (sub, a, b) if m is not None]:
        for dims in DIMS:
            try:
                group = mesh.get_group(dims)
            except MeshSpecError:
                continue  # e.g. ep of a mesh without ep
            out["checks"].append(
                [repr(mesh), str(dims), _reduce(group, rank), sum(r + 1 for r in mesh.get_group_ranks(dims))]
            )
    for peer in {a.layout.stage_peer(rank, 1), a.layout.stage_peer(rank, -1)}:
        out["checks"].append(["a", f"p2p {peer}", _reduce(a.p2p_group(peer), rank), rank + 1 + peer + 1])
    # a world-collective, counter-named group after member-only creation diverged the group counts
    plain = dist.new_group([0, 1, 2, 3])
    out["checks"].append(["world", "plain new_group", _reduce(plain, rank), 10.0])
    # the consistency check of a sub-world mesh runs among its members only
    if rank in (0, 1):
        try:
            DeepSpeedDeviceMesh.build(ranks=[0, 1], tp=2 if rank == 0 else 1)
            out["errors"]["disagree"] = "no error"
        except MeshSpecError as err:
            out["errors"]["disagree"] = str(err)
        agreed = DeepSpeedDeviceMesh.build(ranks=[0, 1], tp=2)
        out["checks"].append(["agreed", "tp", _reduce(agreed.get_group("tp"), rank), 3.0])
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as fh:
        json.dump(out, fh)
    dist.barrier()  # no rank tears gloo down while a peer still talks to it
    dist.destroy_process_group()


@pytest.mark.multiprocess
def test_member_only_groups_work_end_to_end(tmp_path):
    run_ranks(
        _worker,
        (str(tmp_path / "store"), str(tmp_path)),
        world=WORLD,
        timeout_s=TIMEOUT_S,
        hang="member-only creation hung",
    )
    for rank in range(WORLD):
        out = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert out["shared_tp"] and out["shared_dp"]
        assert all(rank in c for c in out["calls"])  # a rank creates only groups it belongs to
        assert len(out["calls"]) == len({tuple(c) for c in out["calls"]})  # each once
        for mesh, dims, got, expected in out["checks"]:
            assert got == expected, (rank, mesh, dims)
        # every DIMS entry of each mesh it is in (size-1 dims: its singleton), one p2p peer (pp=2),
        # the plain world group, and the agreed sub-world mesh on ranks 0, 1
        expected = len(DIMS) * (3 if rank in (1, 3) else 2) + 1 + 1 + (1 if rank in (0, 1) else 0)
        assert len(out["checks"]) == expected
        if rank in (0, 1):
            assert "ranks disagree on the mesh" in out["errors"]["disagree"]
            assert "on rank 0" in out["errors"]["disagree"] and "on rank 1" in out["errors"]["disagree"]
        else:
            assert out["errors"] == {}
