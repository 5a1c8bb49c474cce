"""Time ``python -m codemods.migrate --jobs 2`` over a copy of the installed deepspeed package.

There is no legacy implementation to compare with, so the ratio printed is against the floor: a
plain libcst parse + print of the same files with the same number of processes. The migrated tree
must still compile (``compileall``); ``--idempotent`` also checks that a second run changes nothing.

    python bench/bench_codemods.py [--jobs 2] [--idempotent]
"""
from __future__ import annotations

import argparse
import compileall
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import libcst as cst

REPO = Path(__file__).resolve().parent.parent


def installed_deepspeed() -> Path:
    spec = importlib.util.find_spec("deepspeed")  # locate without importing it
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("deepspeed is not installed; pip install deepspeed==0.19.8")
    return Path(list(spec.submodule_search_locations)[0])


def roundtrip(path: str) -> bool:
    with open(path, encoding="utf-8", newline="") as fh:
        source = fh.read()
    try:
        return cst.parse_module(source).code == source
    except cst.ParserSyntaxError:
        return False


def floor_seconds(files: list[str], jobs: int) -> float:
    start = time.perf_counter()
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        list(pool.map(roundtrip, files, chunksize=8))
    return time.perf_counter() - start


def migrate(tree: Path, jobs: int, *extra: str) -> tuple[float, int, dict]:
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    cmd = [sys.executable, "-m", "codemods.migrate", "--jobs", str(jobs), "--json", "--no-progress", *extra, str(tree)]
    start = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO)
    seconds = time.perf_counter() - start
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if not lines:
        raise SystemExit(f"migrate failed (rc={done.returncode}):\n{done.stderr[-4000:]}")
    return seconds, done.returncode, json.loads(lines[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--idempotent", action="store_true", help="run a second time with --check")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="bench_codemods_") as tmp:
        tree = Path(tmp) / "deepspeed"
        shutil.copytree(installed_deepspeed(), tree, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
        files = sorted(str(p) for p in tree.rglob("*.py"))
        floor = floor_seconds(files, args.jobs)
        seconds, rc, summary = migrate(tree, args.jobs)
        compiled = compileall.compile_dir(str(tree), quiet=2, workers=args.jobs)
        print(f"deepspeed tree: {len(files)} .py files, migrate --jobs {args.jobs}: {seconds:.1f} s (rc={rc})")
        print(f"floor (libcst parse+print, {args.jobs} processes): {floor:.1f} s; ratio migrate/floor: {seconds / floor:.2f}x")
        print(f"files scanned: {summary['files_scanned']}, changed: {summary['files_changed']}, parse errors: {summary['parse_errors']}")
        print("sites rewritten: " + ", ".join(f"{k}={v}" for k, v in summary["sites_rewritten"].items()))
        print("sites left with TODOV1: " + ", ".join(f"{k}={v}" for k, v in summary["sites_todo"].items()))
        print(f"compileall of the migrated tree: {'ok' if compiled else 'FAILED'}")
        ok = bool(compiled) and rc == 0
        if args.idempotent:
            again, rc2, second = migrate(tree, args.jobs, "--check")
            print(f"second run (--check): {again:.1f} s, would change {second['files_changed']} files (rc={rc2})")
            ok = ok and rc2 == 0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
