"""Group creation for one ZeRO + EP job, this project beside the systems users would pick instead.

Layout: pp=8 × tp=8 × ep=8 (dp inferred) at W = 1,024 / 8,192 / 65,536, one process acting as
rank 0 on torch's fake backend (real ``new_group`` / ``split_group`` calls, no communication).
Systems, alternating within each repetition:

- ``mesh_core``: ``DeepSpeedDeviceMesh(pp, tp, ep, flatten=[dp])`` (member-only creation);
- ``deepspeed``: DeepSpeed 0.19.8, ``PipelineParallelGrid(PipeModelDataParallelTopology(pp, tp, dp))``
  then ``groups._create_expert_data_and_model_parallel(ep, mpu=grid)``;
- ``torch``: ``init_device_mesh(("pp", "edp", "ep", "tp"))`` plus the ``_flatten`` of
  ``("edp", "ep")`` a ZeRO job needs for its dp group;
- ``torchtitan``: torchtitan 0.3.0 ``ParallelDims(pp, dp_shard=-1, tp, ep).build_mesh()``;
- ``megatron``: Megatron-Core ``parallel_state.initialize_model_parallel(tp, pp, ep)``
  (``create_gloo_process_groups=False``: gloo twins would double its count). Megatron-Core 0.17+
  requires Python >= 3.12; on Python 3.11 the newest installable release, 0.16.1, is measured.

Per system: creation calls rank 0 issues, distinct rank sets among them, communicators rank 0
belongs to, redundancy (calls / distinct sets), median wall time of the repetitions, tracemalloc
peak (Python allocations; c10d's C++ objects are not traced) and the ratios of calls and time to
mesh_core. Each build is stopped after ``--budget`` seconds (SIGALRM) and a system whose time at a
layout, extrapolated from its smaller layouts, exceeds the budget is not started there; both print
the reason in place of the figures. The wall time is measured untraced (tracemalloc slows builds).

    python bench/bench_peers.py [--repeat 3] [--budget 60] [--worlds 1024,8192,65536]
"""

from __future__ import annotations

import argparse
import gc
import math
import signal
import statistics
import time
import tracemalloc
from typing import Any, Callable, Optional

import common  # noqa: F401  (sets the environment and sys.path first)

# isort: split
from common import MiB, quiet, table

# isort: split

from fakepg import fake_world, record_new_groups

PP, TP, EP = 8, 8, 8
RANK = 0


def build_mesh_core(world: int) -> None:
    from mesh_core import DeepSpeedDeviceMesh, MeshSpec

    DeepSpeedDeviceMesh(MeshSpec.build(world, pp=PP, tp=TP, ep=EP), flatten=[("dp",)])


def build_deepspeed(world: int) -> None:
    from deepspeed.runtime.pipe.topology import PipelineParallelGrid, PipeModelDataParallelTopology
    from deepspeed.utils import groups

    grid = PipelineParallelGrid(topology=PipeModelDataParallelTopology(num_pp=PP, num_mp=TP, num_dp=world // (PP * TP)))
    groups.mpu = grid
    groups._create_expert_data_and_model_parallel(EP, mpu=grid)


def build_torch(world: int) -> None:
    from torch.distributed.device_mesh import init_device_mesh

    dp = world // (PP * TP)
    mesh = init_device_mesh("cpu", (PP, dp // EP, EP, TP), mesh_dim_names=("pp", "edp", "ep", "tp"))
    mesh["edp", "ep"]._flatten("dp")


def build_torchtitan(world: int) -> None:
    from torchtitan.distributed.parallel_dims import ParallelDims

    ParallelDims(dp_replicate=1, dp_shard=-1, cp=1, tp=TP, pp=PP, ep=EP, world_size=world).build_mesh()


def build_megatron(world: int) -> None:
    from megatron.core import parallel_state

    parallel_state.initialize_model_parallel(
        tensor_model_parallel_size=TP,
        pipeline_model_parallel_size=PP,
        expert_model_parallel_size=EP,
        create_gloo_process_groups=False,
    )


def teardown_megatron() -> None:
    from megatron.core import parallel_state

    parallel_state.destroy_model_parallel()


SYSTEMS: dict[str, tuple[Callable[[int], None], Optional[Callable[[], None]], bool]] = {
    # name: (build, teardown inside the world, needs deepspeed.comm)
    "mesh_core": (build_mesh_core, None, False),
    "deepspeed": (build_deepspeed, None, True),
    "torch": (build_torch, None, False),
    "torchtitan": (build_torchtitan, None, False),
    "megatron": (build_megatron, teardown_megatron, False),
}


def availability() -> dict[str, str]:
    """Systems that cannot be imported here, with the exact reason."""
    missing = {}
    probes = {
        "deepspeed": "deepspeed",
        "torchtitan": "torchtitan.distributed.parallel_dims",
        "megatron": "megatron.core.parallel_state",
    }
    import importlib
    import warnings

    for name, module in probes.items():
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                importlib.import_module(module)
        except Exception as err:  # noqa: BLE001 - the reason is the output
            missing[name] = f"cannot import {module}: {type(err).__name__}: {err}"
    return missing


class OverBudget(Exception):
    """One build ran past the time budget (raised from SIGALRM inside the build)."""


def _alarm(signum: int, frame: Any) -> None:
    raise OverBudget()


def run_once(name: str, world: int, *, trace: bool, budget: float = 0.0) -> dict[str, Any]:
    """One build of ``name`` in a fresh fake world; stopped (``OverBudget``) after ``budget`` s."""
    build, teardown, ds_comm = SYSTEMS[name]
    with fake_world(RANK, world, deepspeed_comm=ds_comm), quiet(), record_new_groups() as calls:
        gc.collect()
        if trace:
            tracemalloc.start()
        previous = signal.signal(signal.SIGALRM, _alarm)
        signal.setitimer(signal.ITIMER_REAL, budget)
        start = time.perf_counter()
        try:
            build(world)
            elapsed = time.perf_counter() - start
        except OverBudget:
            raise OverBudget(f"stopped at the {budget:g} s budget ({len(calls)} creation calls issued by then)")
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
            peak = tracemalloc.get_traced_memory()[1] if trace else None
            if trace:
                tracemalloc.stop()
            if teardown is not None:
                teardown()
    sets = {tuple(c) for c in calls}
    return {
        "calls": len(calls),
        "distinct": len(sets),
        "member": sum(1 for s in sets if RANK in s),
        "wall": elapsed,
        "peak": peak,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--budget", type=float, default=60.0, help="seconds one measurement may take")
    parser.add_argument("--worlds", default="1024,8192,65536")
    args = parser.parse_args()
    worlds = [int(w) for w in args.worlds.split(",")]

    import warnings

    warnings.simplefilter("ignore")
    skipped = availability()
    for name, reason in skipped.items():
        print(f"{name}: not measured: {reason}")
    names = [n for n in SYSTEMS if n not in skipped]
    history: dict[str, list[tuple[int, float]]] = {n: [] for n in names}  # (W, median s) measured
    rows = []
    for name in names:  # warm-up: lazy imports and first-call caches stay out of the figures
        run_once(name, worlds[0], trace=False)
    for world in worlds:
        results: dict[str, dict[str, Any]] = {}
        walls: dict[str, list[float]] = {n: [] for n in names}
        for rep in range(args.repeat):  # alternating untraced runs: counts and wall time
            for name in names:
                if rep == 0:
                    projected = _projected(history[name], world)
                    if projected is not None and projected > args.budget:
                        reason = f"not run: projected {projected:.0f} s > budget {args.budget:.0f} s"
                        results[name] = {"skip": reason}
                        print(f"W={world:,} {name}: {reason} (extrapolated from its smaller layouts)", flush=True)
                        continue
                if "skip" in results.get(name, {}) or (rep and sum(walls[name]) > args.budget):
                    continue
                try:
                    res = run_once(name, world, trace=False, budget=args.budget)
                except OverBudget as err:
                    if rep == 0:
                        results[name] = {"skip": str(err)}
                        print(f"W={world:,} {name}: {err}", flush=True)
                    continue
                results.setdefault(name, res)
                walls[name].append(res["wall"])
        for name in names:  # one traced run for the peak memory, where it fits the budget
            res = results[name]
            if "skip" in res:
                continue
            if 3 * statistics.median(walls[name]) > args.budget:  # tracemalloc slows builds ~2-3x
                continue
            try:
                res["peak"] = run_once(name, world, trace=True, budget=args.budget)["peak"]
            except OverBudget:
                pass
        ours = results["mesh_core"]
        ours_wall = statistics.median(walls["mesh_core"])
        for name in names:
            res = results[name]
            label = f"W={world:,} pp{PP} tp{TP} ep{EP}"
            if "skip" in res:
                rows.append([label, name, "-", "-", "-", "-", "-", "-", res["skip"], "-"])
                continue
            wall = statistics.median(walls[name])
            history[name].append((world, wall))
            rows.append(
                [
                    label,
                    name,
                    res["calls"],
                    res["distinct"],
                    res["member"],
                    f"{res['calls'] / max(res['distinct'], 1):.2f}",
                    f"{wall * 1000:.1f}",
                    f"{res['peak'] / MiB:.2f}" if res.get("peak") is not None else "not traced",
                    f"{res['calls'] / max(ours['calls'], 1):.1f}x",
                    f"{wall / ours_wall:.1f}x",
                ]
            )
        print(table(HEADERS, rows[-len(names) :]), flush=True)  # this layout's rows as they come
    print()
    print(table(HEADERS, rows))
    for name, reason in skipped.items():
        print(f"{name}: {reason}")


def _projected(points: list[tuple[int, float]], world: int) -> Optional[float]:
    """Seconds one run at ``world`` would take, extrapolating the growth seen so far (a power law
    through the last two layouts; linear in W with only one)."""
    if not points:
        return None
    if len(points) == 1:
        (w1, t1) = points[0]
        return t1 * world / w1
    (w1, t1), (w2, t2) = points[-2:]
    exponent = max(1.0, math.log(max(t2, 1e-9) / max(t1, 1e-9)) / math.log(w2 / w1))
    return t2 * (world / w2) ** exponent


HEADERS = [
    "layout",
    "system",
    "calls/rank",
    "distinct sets",
    "member of",
    "redundancy",
    "median ms",
    "peak MiB",
    "calls vs mesh_core",
    "time vs mesh_core",
]


if __name__ == "__main__":
    main()
