"""Per-call cost of the hot legacy getters: compat beside DeepSpeed 0.19.8's own, in one run.

    python bench/bench_compat_getters.py [--world 16] [--rank 5] [--number 200000]

Both sides run in the same process on the fake backend, as the same rank of the same layout
(a pipe=2 x data=4 x model=2 grid, MoE ep=2), timed alternately. Each getter is called in a tight
loop from one call site, after its one deprecation warning. Columns: legacy; compat in steady state
(the hot getters have stopped probing call sites, see compat.deprecation.HOT_PROBES); compat while
it still probes (the first HOT_PROBES calls after a filter change). The target, compat steady /
legacy, is <= 1.5x.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import sys
import timeit
import warnings

os.environ.setdefault("DS_ACCELERATOR", "cpu")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

from fakepg import fake_world  # noqa: E402

TARGET = 1.5


def per_call_ns(fn, arg, number: int, repeat: int) -> float:
    stmt = "fn(arg)" if arg is not None else "fn()"
    times = timeit.repeat(stmt, globals={"fn": fn, "arg": arg}, number=number, repeat=repeat)
    return min(times) / number * 1e9


def getters(groups, grid):
    return [
        ("_get_data_parallel_group() [no mpu]", groups._get_data_parallel_group, None, None),
        ("_get_data_parallel_group() [mpu=grid]", groups._get_data_parallel_group, None, grid),
        ("grid.get_data_parallel_group()", grid.get_data_parallel_group, None, None),
        ("_get_expert_parallel_group(name)", groups._get_expert_parallel_group, "ep_size_2", None),
    ]


def setup(groups, topology, world: int):
    grid = topology.PipelineParallelGrid(
        topology=topology.PipeModelDataParallelTopology(num_pp=2, num_mp=2, num_dp=world // 4)
    )
    groups._create_expert_and_data_parallel(2)
    return grid


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world", type=int, default=16)
    parser.add_argument("--rank", type=int, default=5)
    parser.add_argument("--number", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=15)
    args = parser.parse_args(argv)

    import compat.groups as cgroups
    from compat import deprecation
    from compat import topology as ctopology
    from compat.deprecation import LegacyAPIDeprecationWarning

    # hidden, but still issued: call sites are probed and warned exactly as under the default filter
    warnings.simplefilter("ignore", LegacyAPIDeprecationWarning)
    rows = []
    with fake_world(args.rank, args.world, deepspeed_comm=True), contextlib.redirect_stdout(io.StringIO()):
        from deepspeed.runtime.pipe import topology as ltopology
        from deepspeed.utils import groups as lgroups

        try:
            # both implementations in the same world, timed alternately so load drift hits both
            pairs = list(
                zip(
                    getters(lgroups, setup(lgroups, ltopology, args.world)),
                    getters(cgroups, setup(cgroups, ctopology, args.world)),
                )
            )
            for (name, legacy_fn, arg, legacy_mpu), (_, compat_fn, _, compat_mpu) in pairs:
                lgroups.mpu, cgroups.mpu = legacy_mpu, compat_mpu
                best = [float("inf")] * 3
                for _ in range(args.repeat):
                    for i, fn in enumerate((legacy_fn, compat_fn)):
                        best[i] = min(best[i], per_call_ns(fn, arg, args.number, 1))
                    deprecation._forget_sites()  # re-arm the call-site probes
                    best[2] = min(best[2], per_call_ns(compat_fn, arg, min(args.number, deprecation.HOT_PROBES), 1))
                rows.append((name, *best))
        finally:
            cgroups._release_process_group_references()

    width = max(len(r[0]) for r in rows)
    print(f"{'getter':<{width}}  legacy ns  compat ns  ratio  probing ns  ratio")
    worst = 0.0
    for name, theirs, mine, probing in rows:
        ratio = mine / theirs
        worst = max(worst, ratio)
        print(f"{name:<{width}}  {theirs:9.1f}  {mine:9.1f}  {ratio:4.2f}x  {probing:10.1f}  {probing / theirs:4.2f}x")
    print(f"worst steady-state ratio {worst:.2f}x (target <= {TARGET}x): {'ok' if worst <= TARGET else 'over target'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
