"""Meshes built and destroyed from several threads of every rank (4 gloo ranks, two mesh threads per
rank plus one thread making plain counter-named ``dist.new_group`` calls at the same time): no
stuck thread, every group reduces correctly, torch's group naming is intact afterwards."""

from __future__ import annotations

import json
import os
import threading
import traceback
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from spawn import finish_rank, run_ranks

WORLD = 4
ROUNDS = 3
THREAD_JOIN_S = 90
TIMEOUT_S = 180


def _reduce(group) -> float:
    value = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(value, group=group)
    return value.item()


def _worker(rank: int, init_file: str, out_dir: str) -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    from torch.distributed import distributed_c10d as c10d

    from mesh_core import DeepSpeedDeviceMesh

    dist.init_process_group(
        "gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD, timeout=timedelta(seconds=60)
    )
    torch_namer = c10d._process_group_name
    results: dict = {"pairs": [], "columns": [], "plain": []}
    errors: list[str] = []

    def mesh_loop(name: str, ranks: list[int]) -> None:
        # different meshes per thread: pairs {0,1},{2,3} in one, {0,2},{1,3} in the other
        try:
            for _ in range(ROUNDS):
                mesh = DeepSpeedDeviceMesh.build(ranks=ranks, tp=2, flatten=[("dp", "tp")])
                results[name].append(_reduce(mesh.get_group("tp")))
                mesh.destroy()
        except Exception:
            errors.append(f"{name}: {traceback.format_exc()}")

    def plain_loop() -> None:  # torch's own naming, while the mesh threads name their groups
        try:
            for _ in range(ROUNDS):
                group = dist.new_group([0, 1, 2, 3])
                results["plain"].append([group.group_name, _reduce(group)])
        except Exception:
            errors.append(f"plain: {traceback.format_exc()}")

    pair = [rank - rank % 2, rank - rank % 2 + 1]
    column = [rank % 2, rank % 2 + 2]
    threads = [
        threading.Thread(target=mesh_loop, args=("pairs", pair), daemon=True),
        threading.Thread(target=mesh_loop, args=("columns", column), daemon=True),
        threading.Thread(target=plain_loop, daemon=True),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(THREAD_JOIN_S)
    out = {
        **results,
        "errors": errors,
        "stuck": [t.name for t in threads if t.is_alive()],
        "namer_restored": c10d._process_group_name is torch_namer,
    }
    if not out["stuck"]:
        count = c10d._world.group_count
        after = dist.new_group([0, 1, 2, 3])  # a plain new_group after the threads: a fresh counter name
        out["after"] = [after.group_name, str(count), _reduce(after)]
    if out["stuck"]:  # a stuck daemon thread would keep gloo busy: write the file and leave
        with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as fh:
            json.dump(out, fh)
        os._exit(1)
    finish_rank(out_dir, rank, out)


@pytest.mark.multiprocess
def test_two_threads_per_rank_build_and_destroy_meshes(tmp_path):
    try:
        run_ranks(
            _worker,
            (str(tmp_path / "store"), str(tmp_path)),
            world=WORLD,
            timeout_s=TIMEOUT_S,
            hang="mesh threads deadlocked",
        )
    finally:
        outs = [json.loads(p.read_text()) for p in sorted(tmp_path.glob("rank*.json"))]
        for out in outs:
            assert out["stuck"] == [] and out["errors"] == [], out
    assert len(outs) == WORLD
    names = set()
    for rank, out in enumerate(outs):
        pair_sum = sum(r + 1 for r in (rank - rank % 2, rank - rank % 2 + 1))
        column_sum = sum(r + 1 for r in (rank % 2, rank % 2 + 2))
        assert out["pairs"] == [float(pair_sum)] * ROUNDS
        assert out["columns"] == [float(column_sum)] * ROUNDS
        assert [v for _, v in out["plain"]] == [10.0] * ROUNDS
        assert all(name.isdigit() for name, _ in out["plain"])  # torch's counter names, never ours
        assert out["namer_restored"]
        assert out["after"][0] == out["after"][1] and out["after"][2] == 10.0
        names.add((tuple(n for n, _ in out["plain"]), out["after"][0]))
    assert len(names) == 1  # every rank gave torch's groups the same names
