"""Real 4-process gloo run: a group asked for by some of its members only is one error naming the
missing member, on every rank that asked, within the registry's arrival bound (gloo connects its
full mesh at creation, so the bounded arrival runs before that unbounded wait)."""

from __future__ import annotations

import os
from datetime import timedelta

import pytest
import torch.distributed as dist

from spawn import finish_rank, read_ranks, run_ranks

WORLD = 4


def _worker(rank: int, init_file: str, out_dir: str) -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    from mesh_core.absence import AbsentRanksError
    from mesh_core.registry import registry_for_world

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    registry = registry_for_world()
    registry.arrival_timeout = timedelta(seconds=2)
    out: dict = {}
    if rank in (0, 1):  # rank 2 never asks for the group of [0, 1, 2]
        try:
            registry.get([0, 1, 2], asker="the test")
            out["error"] = None
        except AbsentRanksError as err:
            out["error"], out["missing"] = str(err), err.missing
    pair = registry.get([0, 1]) if rank < 2 else registry.get([2, 3])  # the world still works afterwards
    out["pair"] = dist.get_process_group_ranks(pair)
    finish_rank(out_dir, rank, out)


@pytest.mark.multiprocess
@pytest.mark.slow  # ~45 s on 2 busy cores (4 spawned ranks)
def test_a_group_asked_for_by_some_members_only_names_them_on_every_asker(tmp_path):
    run_ranks(
        _worker,
        (str(tmp_path / "store"), str(tmp_path)),
        world=WORLD,
        timeout_s=120,
        hang="a group asked for by some members only hung",
    )
    outs = read_ranks(tmp_path, WORLD)
    for rank in (0, 1):
        assert outs[rank]["missing"] == [2], outs[rank]
        assert "ranks [2] never asked for it" in outs[rank]["error"]
    assert [o["pair"] for o in outs] == [[0, 1], [0, 1], [2, 3], [2, 3]]
