#!/usr/bin/env python
"""Run DeepSpeed's own unit tests without and with the shim; print per test: without, with, regression.

    python tools/run_upstream.py --subset full     # every file issue 9 lists (hours on 2 cores)
    python tools/run_upstream.py --subset fast     # the CI subset (~10 minutes on 2 cores)
    python tools/run_upstream.py unit/utils/test_groups.py -k ...

Exit status: 0 when no test that passed without the shim fails with it, 1 otherwise (2: nothing ran).
See tests/upstream/runner.py for what each run does.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from upstream import runner  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="*", help="test files relative to the tree (e.g. unit/utils/test_groups.py)")
    parser.add_argument("--subset", choices=("fast", "full"), help="a named set of files (default: fast)")
    parser.add_argument("--tree", type=Path, default=None, help="DeepSpeed's tests/ tree")
    parser.add_argument("--env", type=Path, default=None, help="harness venv (default: a per-user cache)")
    parser.add_argument("--out", type=Path, default=Path("out/upstream"), help="logs, junit XML, results.json")
    parser.add_argument("-j", "--jobs", type=int, default=1, help="pytest-xdist workers per run")
    parser.add_argument("--timeout", type=int, default=1200, help="per-test timeout in seconds")
    parser.add_argument("--no-fp32", action="store_true", help="skip the fp32 variants of fp16/bf16 files")
    parser.add_argument(
        "--fp32-only",
        action="store_true",
        help="run a file's fp32 variant instead of the file where it has one (the fp16/bf16 "
        "originals fail on CPU both ways)",
    )
    parser.add_argument("--no-extras", action="store_true", help="do not install transformers into the venv")
    parser.add_argument("--modes", default="legacy,shim", help="comma list of legacy,shim")
    parser.add_argument("--parallel", action="store_true", help="run the legacy and shim passes side by side")
    parser.add_argument("-k", dest="keyword", help="pytest -k expression")
    parser.add_argument("--prebuild", action="store_true", help="JIT-build the CPU ops first (default with full)")
    parser.add_argument("--from-logs", action="store_true", help="only tabulate the run already in --out")
    parser.add_argument("--markdown", type=Path, help="also write the table as markdown here")
    parser.add_argument(
        "--deepspeed",
        type=Path,
        default=None,
        metavar="DIR",
        help="test this deepspeed package directory (e.g. a migrated copy, <copy>/deepspeed) instead "
        "of the installed one; the run fails if its tests import deepspeed from elsewhere",
    )
    parser.add_argument(
        "--port-offset", type=int, default=0, help="move every stream's master ports (runs side by side)"
    )
    args = parser.parse_args(argv)

    files = list(args.files) or list(runner.FULL_FILES if args.subset == "full" else runner.FAST_FILES)
    tree = args.tree or runner.default_tree()
    needs_extras = runner.needs_transformers(tree, files)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    start = time.monotonic()
    if args.from_logs:
        rows, summary = runner.from_logs(args.out.resolve())
    else:
        rows, summary = runner.main_run(
            files,
            tree=tree,
            env_dir=args.env or runner.env_dir_default(),
            out_dir=args.out.resolve(),
            jobs=args.jobs,
            timeout=args.timeout,
            fp32=not args.no_fp32,
            extras=needs_extras and not args.no_extras,
            modes=modes,
            keyword=args.keyword,
            parallel=args.parallel,
            prebuild=args.prebuild or (args.subset == "full"),
            fp32_only=args.fp32_only,
            log=lambda msg: print(msg, flush=True),
            deepspeed=args.deepspeed,
            port_offset=args.port_offset,
        )
    print(runner.format_table(rows, summary))
    if args.markdown:
        args.markdown.write_text(
            runner.per_file_table(rows) + "\n\n" + runner.format_table(rows, summary, markdown=True) + "\n",
            encoding="utf-8",
        )
    print(f"total {time.monotonic() - start:.0f}s; results: {args.out / 'results.json'}")
    if not rows:
        return 2
    return 1 if summary.regressions else 0


if __name__ == "__main__":
    sys.exit(main())
