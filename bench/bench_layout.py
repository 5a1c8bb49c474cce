"""Layout math at scale: the mesh's MeshLayout beside DeepSpeed 0.19.8's topology math.

Prints, per world size, the time and peak memory of computing every rank list the job needs (pp,
dp, tp, ds_model = pp x tp, EP, EDP groups and the p2p pairs) and the communicator counts (formulas,
:mod:`mesh_core.cli.legacy_counts`); then the issue-2 checks: enumerating every group of every dim of a
131,072-rank world (< 1 s) and per-rank query cost independent of world size.

    python bench/bench_layout.py [--full]
"""

from __future__ import annotations

import argparse
import contextlib
import random
import signal
import time
from types import SimpleNamespace
from typing import Any, Iterator

import common  # noqa: F401  (sets the environment and sys.path first)

# isort: split
from common import MiB, peak_memory, quiet, ratio, table, timed

# isort: split

from mesh_core import MeshLayout, MeshSpec
from mesh_core.cli.legacy_counts import legacy_counts, mesh_count

LAYOUTS = {
    1024: [dict(pp=4, tp=8, ep=8), dict(pp=4, ep=8)],
    8192: [dict(pp=8, tp=8, ep=8), dict(pp=8, ep=8)],
    65536: [dict(pp=16, tp=8, ep=8), dict(pp=16, ep=8)],
}
LEGACY_BUDGET_S = {False: 20, True: 120}  # legacy p2p lists are O(W^2): stop them past this
ENUMERATION_WORLD = 131072
NEW_DIMS = {"pp": "pp", "dp": "dp", "tp": "tp", "pp x tp": ("pp", "tp"), "ep": "ep", "edp": "edp"}
QUERIES = 10000


class Stopped(Exception):
    pass


@contextlib.contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    def stop(signum, frame):
        raise Stopped()

    previous = signal.signal(signal.SIGALRM, stop)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def new_layout_math(spec: MeshSpec) -> dict[str, list]:
    layout = MeshLayout(spec)
    lists = {name: layout.groups(dims) for name, dims in NEW_DIMS.items()}
    lists["p2p"] = layout.p2p_pairs()
    return lists


def legacy_layout_math(pp: int, tp: int, dp: int, ep: int, with_p2p: bool = True) -> dict[str, list]:
    from deepspeed.runtime.pipe.topology import PipelineParallelGrid, PipeModelDataParallelTopology
    from deepspeed.utils import groups

    world = pp * tp * dp
    topo = PipeModelDataParallelTopology(num_pp=pp, num_mp=tp, num_dp=dp)
    lists = {"pp x tp": [sorted(topo.get_axis_list("data", d)) for d in range(dp)]}  # ds_model, as the grid does
    lists.update(
        {name: topo.get_axis_comm_lists(axis) for name, axis in (("pp", "pipe"), ("dp", "data"), ("tp", "model"))}
    )
    lists["ep"], lists["edp"] = groups._get_expert_parallel_ranks(world, tp, ep, pp)
    if with_p2p:
        grid = SimpleNamespace(_topo=topo, world_size=world, pipe_parallel_size=pp)
        lists["p2p"] = PipelineParallelGrid._build_p2p_groups(grid)
    return lists


def same_rank_sets(new: dict[str, list], legacy: dict[str, list]) -> bool:
    """Both sides computed the same groups (as sets of rank sets) and the same p2p pairs."""

    def sets(groups: list) -> set:
        return {tuple(sorted(g)) for g in groups}

    return all(sets(new[k]) == sets(legacy[k]) for k in NEW_DIMS) and (
        "p2p" not in legacy or new["p2p"] == legacy["p2p"]
    )


def bench_layouts(worlds: list[int], full: bool) -> list[dict[str, Any]]:
    results = []
    for world, sizes in [(w, s) for w in worlds for s in LAYOUTS[w]]:
        sizes = {"tp": 1, **sizes}
        spec = MeshSpec.build(world, **sizes)
        dp = spec.dim_size("dp")
        new_s, _ = timed(lambda: new_layout_math(spec), repeat=2)
        new_mem, _ = peak_memory(lambda: new_layout_math(spec))
        legacy_note = ""
        try:
            with time_limit(LEGACY_BUDGET_S[full]):
                legacy_s, _ = timed(lambda: legacy_layout_math(sizes["pp"], sizes["tp"], dp, sizes["ep"]))
            legacy_mem, _ = peak_memory(lambda: legacy_layout_math(sizes["pp"], sizes["tp"], dp, sizes["ep"]))
        except Stopped:
            legacy_s = float(LEGACY_BUDGET_S[full])
            legacy_note = f"> {legacy_s:.0f} s: p2p lists stopped; memory without them"
            legacy_mem, _ = peak_memory(lambda: legacy_layout_math(sizes["pp"], sizes["tp"], dp, sizes["ep"], False))
        if world <= 8192:  # the bench compares like with like
            legacy_lists = legacy_layout_math(sizes["pp"], sizes["tp"], dp, sizes["ep"])
            legacy_note = legacy_note or (
                "same rank sets" if same_rank_sets(new_layout_math(spec), legacy_lists) else "RANK SETS DIFFER"
            )
        ours, legacy = mesh_count(spec), legacy_counts(spec)
        results.append(
            dict(
                world=world,
                layout=f"W={world} " + ",".join(f"{n}={v}" for n, v in spec.shape.items()) + f",ep={spec.ep}",
                new_calls=ours.new_group_calls,
                legacy_calls=sum(c.new_group_calls for c in legacy),
                new_per_rank=ours.per_rank,
                legacy_per_rank=sum(c.per_rank for c in legacy),
                new_s=new_s,
                legacy_s=legacy_s,
                new_mib=new_mem / MiB,
                legacy_mib=legacy_mem / MiB,
                legacy_note=legacy_note,
            )
        )
    return results


def enumeration(world: int = ENUMERATION_WORLD) -> dict[str, Any]:
    spec = MeshSpec.build(world, pp=8, sp=4, tp=8, ep=8)
    dims = ["pp", "dp", "sp", "tp", ("dp", "sp"), ("pp", "tp"), "ep", "edp"]

    def enumerate_all() -> int:
        layout = MeshLayout(spec)
        return sum(len(layout.groups(d)) for d in dims)

    seconds, groups = timed(enumerate_all, repeat=3)
    return dict(world=world, layout=spec.describe(), dims=len(dims), groups=groups, seconds=seconds)


def query_cost(worlds: tuple[int, int] = (1024, ENUMERATION_WORLD)) -> list[dict[str, Any]]:
    rows = []
    for world in worlds:
        layout = MeshLayout(MeshSpec.build(world, pp=8, tp=8, ep=8))
        rng = random.Random(0)
        ranks = [rng.randrange(world) for _ in range(QUERIES)]
        queries = {
            "coordinate(r)": lambda r: layout.coordinate(r),
            "coordinate_of(r, 'dp')": lambda r: layout.coordinate_of(r, "dp"),
            "group_ranks('tp', r)": lambda r: layout.group_ranks("tp", r),
            "group_ranks('pp', r)": lambda r: layout.group_ranks("pp", r),
            "group_ranks('ep', r)": lambda r: layout.group_ranks("ep", r),
            "stage_peer(r, 1)": lambda r: layout.stage_peer(r, 1),
        }
        for name, query in queries.items():
            best = float("inf")
            for _ in range(3):  # best of 3: the machine is shared
                start = time.perf_counter()
                for r in ranks:
                    query(r)
                best = min(best, time.perf_counter() - start)
            rows.append(dict(world=world, query=name, us=best / QUERIES * 1e6))
    return rows


def digest_cost(world: int = ENUMERATION_WORLD) -> dict[str, Any]:
    """The local part of the cross-rank check (fields + sha256); the rest is one 32-byte all-gather."""
    from mesh_core.consistency import digest, mesh_fields

    spec = MeshSpec.build(world, pp=8, sp=4, tp=8, ep=8)
    seconds, _ = timed(
        lambda: [digest(mesh_fields(spec, flatten=[("dp", "sp")], p2p_groups=False)) for _ in range(1000)]
    )
    return dict(world=world, us=seconds / 1000 * 1e6)


def print_results(layouts: list[dict], enum: dict, queries: list[dict], digest_us: dict) -> None:
    print("== layout math: every rank list of the job (pp, dp, tp, pp x tp, EP, EDP, p2p) ==")
    rows = []
    for r in layouts:
        rows.append([r["layout"], "new", r["new_calls"], r["new_per_rank"], r["new_s"], r["new_mib"], ""])
        rows.append(
            [
                r["layout"],
                "legacy",
                r["legacy_calls"],
                r["legacy_per_rank"],
                r["legacy_s"],
                r["legacy_mib"],
                r["legacy_note"],
            ]
        )
        rows.append(
            [
                r["layout"],
                "new/legacy",
                ratio(r["new_calls"], r["legacy_calls"]),
                ratio(r["new_per_rank"], r["legacy_per_rank"]),
                ratio(r["new_s"], r["legacy_s"]),
                ratio(r["new_mib"], r["legacy_mib"]),
                "",
            ]
        )
    print(table(["layout", "impl", "new_group calls/rank", "comms/rank", "wall s", "peak MiB", "note"], rows))
    verdict = "PASS" if enum["seconds"] < 1.0 else "FAIL"
    print(f"\n== enumeration: every group of {enum['dims']} dim sets, {enum['layout']} ==")
    print(f"   {enum['groups']} groups in {enum['seconds']:.3f} s ({verdict}: target < 1 s)")
    print("\n== per-rank query cost vs world size (us per query) ==")
    small, big = sorted({q["world"] for q in queries})
    by = {(q["world"], q["query"]): q["us"] for q in queries}
    names = [q["query"] for q in queries if q["world"] == small]
    print(
        table(
            ["query", f"W={small}", f"W={big}", "ratio"],
            [[n, by[small, n], by[big, n], ratio(by[big, n], by[small, n])] for n in names],
        )
    )
    print(
        f"\n== consistency check, local part at W={digest_us['world']}: {digest_us['us']:.1f} us per mesh "
        "(plus one all-gather of 32 bytes per rank; skipped on the fake backend) =="
    )


def run(full: bool) -> dict[str, Any]:
    worlds = [1024, 8192, 65536] if full else [1024, 8192]
    with quiet():
        import deepspeed  # noqa: F401  (import cost outside the timings)
    layouts = bench_layouts(worlds, full)
    enum, queries, digest_us = enumeration(), query_cost(), digest_cost()
    print_results(layouts, enum, queries, digest_us)
    return dict(layout_math=layouts, enumeration=enum, query_cost=queries, consistency_digest=digest_us)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--full", action="store_true", help="also 65,536 ranks (the legacy side is capped)")
    run(parser.parse_args().full)
