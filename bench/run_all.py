"""Every benchmark, new core beside DeepSpeed 0.19.8 measured in the same run, as new/legacy ratios.

    python bench/run_all.py             # fast (~1-2 minutes on 2 cores): layout math at 1,024 and
                                        # 8,192, fake backend at 1,024, issue-2 checks
    python bench/run_all.py --full      # adds layout math at 65,536 and the fake backend at 8,192
    python bench/run_all.py --json out.json

Then runs the other bench scripts of this folder (compat getters, initialize, codemods) when present,
each in its own process.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import common  # noqa: F401  (sets the environment and sys.path first)

# isort: split

HERE = os.path.dirname(os.path.abspath(__file__))
OTHER_SCRIPTS = ["bench_compat_getters.py", "bench_initialize.py", "bench_codemods.py", "bench_hsdp.py"]
OTHER_TIMEOUT_S = 600


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--full", action="store_true", help="add 65,536-rank layout math and the 8,192-rank fake backend"
    )
    parser.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    parser.add_argument("--skip-others", action="store_true", help="only this suite's own benchmarks")
    args = parser.parse_args(argv)

    import bench_fake_backend
    import bench_layout

    start = time.perf_counter()
    figures = {"full": args.full}
    figures["layout"] = bench_layout.run(args.full)
    print()
    figures["fake_backend"] = bench_fake_backend.run(args.full)
    rc = 0
    if not args.skip_others:
        for script in OTHER_SCRIPTS:
            path = os.path.join(HERE, script)
            if not os.path.exists(path):
                continue
            print(f"\n== {script} ==", flush=True)
            try:
                done = subprocess.run([sys.executable, path], timeout=OTHER_TIMEOUT_S, cwd=os.path.dirname(HERE))
                rc = rc or done.returncode
            except subprocess.TimeoutExpired:
                print(f"{script}: stopped after {OTHER_TIMEOUT_S} s")
                rc = rc or 1
    print(f"\nbench finished in {time.perf_counter() - start:.0f} s")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(figures, fh, indent=1, default=str)
    return rc


if __name__ == "__main__":
    sys.exit(main())
