"""Mesh creation on the fake backend: DeepSpeedDeviceMesh beside DeepSpeed 0.19.8's own builders.

One process acts as a sampled rank (0 and N-1) of an N-rank world. New: ``DeepSpeedDeviceMesh``
for (pp, dp, tp, ep). Legacy, for the same layout: ``PipelineParallelGrid(
PipeModelDataParallelTopology(pp, tp, dp))`` then the expert groups
(``groups._create_expert_data_and_model_parallel(ep, mpu=grid)`` when tp > 1, which keeps tp lanes
apart as the mesh does; ``_create_expert_and_data_parallel(ep, pp_size=pp)`` otherwise).
Per rank: ``new_group`` calls (legacy: every rank makes all of them; new: member-only, one per group
the rank belongs to), communicators it belongs to, wall
time of creation (best of 3) and tracemalloc peak (Python allocations only; c10d's C++ group objects
are not traced), each in a fresh world; then new/legacy ratios.

    python bench/bench_fake_backend.py [--full]      # 1,024 ranks; --full adds 8,192
"""

from __future__ import annotations

import argparse
from typing import Any, Callable

import common  # noqa: F401  (sets the environment and sys.path first)

# isort: split
from common import MiB, peak_memory, quiet, ratio, table, timed

# isort: split

from fakepg import fake_world, record_new_groups
from mesh_core import DeepSpeedDeviceMesh, MeshSpec
from mesh_core.cli.legacy_counts import legacy_counts, mesh_count

# a 3-D layout with MoE, and pipeline + MoE without tp (where the legacy grid adds W singletons)
LAYOUTS = {1024: [dict(pp=4, tp=8, ep=8), dict(pp=4, ep=8)], 8192: [dict(pp=8, tp=8, ep=8), dict(pp=8, ep=8)]}
REPEAT = 3  # best of 3 fresh worlds for the wall time


def build_new(spec: MeshSpec) -> Callable[[], Any]:
    return lambda: DeepSpeedDeviceMesh(spec)


def build_legacy(pp: int, tp: int, dp: int, ep: int) -> Callable[[], Any]:
    def build() -> Any:
        from deepspeed.runtime.pipe.topology import PipelineParallelGrid, PipeModelDataParallelTopology
        from deepspeed.utils import groups

        grid = PipelineParallelGrid(topology=PipeModelDataParallelTopology(num_pp=pp, num_mp=tp, num_dp=dp))
        groups.mpu = grid  # what the engine publishes before MoE layers create their groups
        if ep > 1 and tp > 1:
            groups._create_expert_data_and_model_parallel(ep, mpu=grid)
        elif ep > 1:
            groups._create_expert_and_data_parallel(ep, pp_size=pp)
        return grid

    return build


def measure(build: Callable[[], Any], rank: int, world: int, deepspeed_comm: bool) -> dict[str, Any]:
    """Calls, memberships, wall time and peak memory of one creation, each pass in a fresh world."""
    with quiet():
        seconds = float("inf")
        for _ in range(REPEAT):
            with fake_world(rank, world, deepspeed_comm=deepspeed_comm):
                seconds = min(seconds, timed(build)[0])
        with fake_world(rank, world, deepspeed_comm=deepspeed_comm), record_new_groups() as calls:
            build()
        with fake_world(rank, world, deepspeed_comm=deepspeed_comm):
            peak, _ = peak_memory(build)
    return dict(calls=len(calls), per_rank=sum(1 for g in calls if rank in g), seconds=seconds, mib=peak / MiB)


def run(full: bool) -> list[dict[str, Any]]:
    with quiet():
        import deepspeed  # noqa: F401  (import cost outside the timings)
    results = []
    cases = [(world, sizes) for world in ([1024, 8192] if full else [1024]) for sizes in LAYOUTS[world]]
    for world, sizes in cases:
        sizes = {"tp": 1, **sizes}
        spec = MeshSpec.build(world, **sizes)
        dp = spec.dim_size("dp")
        for rank in (0, world - 1):
            new = measure(build_new(spec), rank, world, deepspeed_comm=False)
            legacy = measure(build_legacy(sizes["pp"], sizes["tp"], dp, sizes["ep"]), rank, world, deepspeed_comm=True)
            formulas_hold = new["calls"] == mesh_count(spec, rank=rank).per_rank and legacy["calls"] == sum(
                c.new_group_calls for c in legacy_counts(spec)
            )
            shape = ",".join(f"{n}={v}" for n, v in spec.shape.items()) + f",ep={spec.ep}"
            results.append(
                dict(
                    world=world,
                    rank=rank,
                    layout=f"W={world} {shape}",
                    spec=spec.describe(),
                    new=new,
                    legacy=legacy,
                    formulas_hold=formulas_hold,
                )
            )
    print_results(results)
    return results


def print_results(results: list[dict[str, Any]]) -> None:
    print("== fake backend: mesh creation as one rank (fresh world per pass) ==")
    rows = []
    for r in results:
        new, legacy = r["new"], r["legacy"]
        check = "yes" if r["formulas_hold"] else "NO"
        rows.append(
            [r["layout"], r["rank"], "new", new["calls"], new["per_rank"], new["seconds"] * 1e3, new["mib"], check]
        )
        rows.append(
            [
                r["layout"],
                r["rank"],
                "legacy",
                legacy["calls"],
                legacy["per_rank"],
                legacy["seconds"] * 1e3,
                legacy["mib"],
                check,
            ]
        )
        rows.append(
            [
                r["layout"],
                r["rank"],
                "new/legacy",
                ratio(new["calls"], legacy["calls"]),
                ratio(new["per_rank"], legacy["per_rank"]),
                ratio(new["seconds"], legacy["seconds"]),
                ratio(new["mib"], legacy["mib"]),
                "",
            ]
        )
    print(
        table(
            ["layout", "rank", "impl", "new_group calls/rank", "comms/rank", "wall ms", "peak MiB", "= formula"], rows
        )
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--full", action="store_true", help="also 8,192 ranks")
    run(parser.parse_args().full)
