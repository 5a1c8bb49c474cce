"""A late or absent rank at a whole-world mesh, 4 gloo ranks with a short process-group timeout:
a rank late by less than the timeout is waited for; one that never builds the mesh gives every
other rank an error naming the mesh, the ranks that arrived and the missing one (no raw gloo
error); a rank that arrives after the others gave up raises too instead of waiting for groups."""

from __future__ import annotations

import os
import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from spawn import finish_rank, read_ranks, run_ranks

WORLD = 4
PG_TIMEOUT_S = 10
LATE_S = 3  # well under the timeout
TIMEOUT_S = 150  # the whole run, a hang guard


def _worker(rank: int, init_file: str, out_dir: str) -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    from mesh_core import DeepSpeedDeviceMesh, MeshSpecError

    dist.init_process_group(
        "gloo",
        init_method=f"file://{init_file}",
        rank=rank,
        world_size=WORLD,
        timeout=timedelta(seconds=PG_TIMEOUT_S),
    )
    store = dist.distributed_c10d._get_default_store()
    out: dict = {}
    # 1. rank 3 late by less than the timeout: everyone builds the mesh
    if rank == 3:
        time.sleep(LATE_S)
    late = DeepSpeedDeviceMesh.build(tp=2)
    value = torch.tensor([1.0])
    dist.all_reduce(value, group=late.get_group("dp"))
    out["late"] = value.item()
    # 2. rank 3 never builds the next mesh (it waits for the others' outcome instead)
    if rank == 3:
        store.wait(["others_failed"], timedelta(seconds=TIMEOUT_S))
    else:
        start = time.monotonic()
        try:
            DeepSpeedDeviceMesh.build(pp=2, tp=2)
            out["absent"] = "no error"
        except MeshSpecError as err:
            out["absent"] = str(err)
        except Exception as err:  # a raw backend error is what this test rules out
            out["absent"] = f"{type(err).__name__}: {err}"
        out["absent_s"] = time.monotonic() - start  # reported, not asserted (loaded machine)
        if store.add("failed", 1) == WORLD - 1:
            store.set("others_failed", "1")
    # 3. rank 3 arrives after the others gave up: it raises at once instead of waiting for groups
    if rank == 3:
        try:
            DeepSpeedDeviceMesh.build(pp=2, tp=2)
            out["after"] = "no error"
        except MeshSpecError as err:
            out["after"] = str(err)
    finish_rank(out_dir, rank, out)


@pytest.mark.multiprocess
def test_late_rank_is_waited_for_and_an_absent_one_is_named(tmp_path):
    run_ranks(
        _worker,
        (str(tmp_path / "store"), str(tmp_path)),
        world=WORLD,
        timeout_s=TIMEOUT_S,
        hang="a late or absent rank hung the others",
    )
    outs = read_ranks(tmp_path, WORLD)
    assert [o["late"] for o in outs] == [2.0] * WORLD  # the mesh was built and its dp group works
    for rank in range(WORLD - 1):
        message = outs[rank]["absent"]
        assert message.startswith("only 3 of the 4 ranks of MeshSpec(pp=2, dp=1, tp=2"), message
        assert "(arrived: ranks 0..2; missing: rank 3)" in message, message
    assert "after the other ranks gave up" in outs[3]["after"] and "MeshSpec(pp=2, dp=1, tp=2" in outs[3]["after"]
    print("absent-rank error after (s):", [round(o["absent_s"], 1) for o in outs[:-1]], "pg timeout", PG_TIMEOUT_S)
