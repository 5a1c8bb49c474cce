"""Time ``python -m codemods.migrate --jobs 2`` over a copy of the installed deepspeed package.

There is no legacy implementation to compare with, so the ratio printed is against the floor: a
plain libcst parse + print of the same files with the same number of processes. The migrated tree
must still compile (``compileall``); ``--idempotent`` also checks that a second run changes nothing.

``--upstream`` then runs DeepSpeed's own tests (the CI fast subset, fp32 variants; ``--moe-tp`` adds
``unit/v1/moe/test_moe_tp.py``) with the mesh runtime (shim) twice, side by side, through the
upstream runner (tests/upstream/runner.py): against the installed deepspeed and against the
migrated copy (kept in ``--upstream-out``), and prints per test whether the outcomes are equal.
``--migrated DIR`` compares an already migrated copy (``DIR/deepspeed``) without timing a migration.

    python bench/bench_codemods.py [--jobs 2] [--idempotent] [--upstream [--moe-tp] [--upstream-out DIR]]
    python bench/bench_codemods.py --migrated out/upstream-migrated/copy --upstream
"""

from __future__ import annotations

import argparse
import ast
import compileall
import importlib.util
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
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


def floor_seconds(files: list[str], jobs: int) -> tuple[float, float]:
    """(wall, CPU) seconds of a libcst parse + print of ``files`` in ``jobs`` processes."""
    start, cpu = time.perf_counter(), children_cpu()
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        list(pool.map(roundtrip, files, chunksize=8))
    return time.perf_counter() - start, children_cpu() - cpu


def children_cpu() -> float:
    """User + system CPU seconds of the finished child processes (and theirs) so far."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def load() -> str:
    return "load average " + " ".join(f"{x:.1f}" for x in os.getloadavg())


LAST_CPU = {"seconds": 0.0}  # CPU time of the last migrate() run (the CLI and its workers)


def migrate(tree: Path, jobs: int, *extra: str) -> tuple[float, int, dict]:
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    cmd = [sys.executable, "-m", "codemods.migrate", "--jobs", str(jobs), "--json", "--no-progress", *extra, str(tree)]
    start, cpu = time.perf_counter(), children_cpu()
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO)
    seconds = time.perf_counter() - start
    LAST_CPU["seconds"] = children_cpu() - cpu
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if not lines:
        raise SystemExit(f"migrate failed (rc={done.returncode}):\n{done.stderr[-4000:]}")
    return seconds, done.returncode, json.loads(lines[-1])


# an mpu receiver: ``mpu``, ``self.mpu``, ``groups.mpu`` (not ``x[q_compute_idx]``, not ``mesh_of(mpu)``)
_MPU = re.compile(r"(?<![A-Za-z0-9])mpu(?![A-Za-z0-9])", re.IGNORECASE)


def family_sites(tree: Path) -> Counter:
    """Legacy process-group call sites by family (ast scan; a site is a call):
    groups (``deepspeed.utils.groups`` functions), mpu (``<mpu>.get_*()`` on a name or attribute
    ``mpu``), bwc (``bwc_*()``),
    grid (grid methods on an object whose name mentions ``grid``), comm (``deepspeed.comm`` thin
    wrappers through a ``dist`` / ``comm`` alias)."""
    from codemods.rules import _grid_api as grid_api
    from codemods.rules.groups_getters import ALL_FUNCTIONS

    counts: Counter = Counter()
    for path in tree.rglob("*.py"):
        try:
            module = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError):
            continue
        if any(part in ("groups.py", "topology.py", "bwc.py") for part in (path.name,)) and path.parent.name in (
            "utils",
            "pipe",
        ):
            continue  # the modules that define the legacy APIs (utils/bwc.py defines the bwc_* helpers)
        for node in ast.walk(module):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
            owner = ast.unparse(func.value) if isinstance(func, ast.Attribute) else ""
            if name is None:
                continue
            if name in ALL_FUNCTIONS and ("groups" in owner or not owner):
                counts["groups"] += 1
            elif name.startswith("bwc_"):
                counts["bwc"] += 1
            elif (
                name.startswith("get_")
                and isinstance(getattr(func, "value", None), (ast.Name, ast.Attribute))
                and _MPU.search(owner)
            ):
                counts["mpu"] += 1
            elif name in grid_api.METHODS and "grid" in owner.lower():
                counts["grid"] += 1
    return counts


UPSTREAM_PORT_OFFSETS = {"installed": 4000, "migrated": 6000}  # away from a default runner's ports


def upstream_runner():
    sys.path.insert(0, str(REPO / "tests"))
    from upstream import runner

    return runner


def compare_upstream(copy: Path, out: Path, *, moe_tp: bool, timeout: int, log=print) -> bool:
    """DeepSpeed's tests with the shim against the installed deepspeed and against ``copy`` (a
    migrated ``deepspeed`` package directory), side by side; prints per test whether the outcomes
    are equal. True when every test ran both ways with equal outcomes."""
    from concurrent.futures import ThreadPoolExecutor

    runner = upstream_runner()
    files = list(runner.FAST_FILES) + (["unit/v1/moe/test_moe_tp.py"] if moe_tp else [])
    tree = runner.default_tree()
    env_dir = runner.env_dir_default()
    runner.ensure_env(env_dir, extras=runner.needs_transformers(tree, files), log=log)

    def one(name: str, deepspeed):
        return runner.main_run(
            files,
            tree=tree,
            env_dir=env_dir,
            out_dir=out / name,
            jobs=1,
            timeout=timeout,
            fp32=False,
            extras=runner.needs_transformers(tree, files),
            modes=["shim"],
            fp32_only=True,
            prebuild=True,
            deepspeed=deepspeed,
            port_offset=UPSTREAM_PORT_OFFSETS[name],
            log=lambda msg: log(f"[{name}] {msg}"),
        )

    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=2) as pool:
        installed_run = pool.submit(one, "installed", None)
        migrated_run = pool.submit(one, "migrated", copy)
        installed_rows, installed_summary = installed_run.result()
        migrated_rows, migrated_summary = migrated_run.result()
    seconds = time.perf_counter() - start
    installed = {r.test: r.shim for r in installed_rows}
    migrated = {r.test: r.shim for r in migrated_rows}
    tests = sorted(set(installed) | set(migrated))
    width = max([len(t) for t in tests] + [4])
    print(f"upstream tests with the mesh runtime: installed deepspeed vs migrated copy ({copy})")
    print(f"{'test':<{width}}  {'installed':<9}  {'migrated':<9}  equal")
    differ = []
    for test in tests:
        a, b = installed.get(test, runner.MISSING), migrated.get(test, runner.MISSING)
        print(f"{test:<{width}}  {a:<9}  {b:<9}  {'yes' if a == b else 'NO'}")
        if a != b:
            differ.append(test)
    passed = sum(installed.get(t) == migrated.get(t) == runner.PASSED for t in tests)
    print(
        f"upstream: {len(tests)} tests, {len(tests) - len(differ)} equal outcomes ({passed} pass both), "
        f"{len(differ)} differ; installed {installed_summary.shim_seconds:.0f} s, migrated "
        f"{migrated_summary.shim_seconds:.0f} s, side by side {seconds:.0f} s"
    )
    for test in differ:
        print(
            f"  differs: {test}: installed {installed.get(test, runner.MISSING)}, migrated {migrated.get(test, runner.MISSING)}"
        )
    return bool(tests) and not differ


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--idempotent", action="store_true", help="run a second time with --check")
    parser.add_argument(
        "--upstream",
        action="store_true",
        help="compare DeepSpeed's tests (shim) on the installed package and on the migrated copy",
    )
    parser.add_argument("--moe-tp", action="store_true", help="with --upstream: add unit/v1/moe/test_moe_tp.py (fp32)")
    parser.add_argument(
        "--upstream-out",
        type=Path,
        default=REPO / "out" / "upstream-migrated",
        help="with --upstream: where the migrated copy, logs and junit XML go",
    )
    parser.add_argument("--timeout", type=int, default=1200, help="with --upstream: per-test timeout in seconds")
    parser.add_argument(
        "--migrated",
        type=Path,
        metavar="DIR",
        help="only --upstream, on the migrated copy DIR/deepspeed (no migration timed)",
    )
    args = parser.parse_args()
    if args.migrated is not None:
        if not args.upstream:
            parser.error("--migrated only applies with --upstream")
        return (
            0
            if compare_upstream(
                args.migrated.resolve() / "deepspeed",
                args.upstream_out.resolve(),
                moe_tp=args.moe_tp,
                timeout=args.timeout,
            )
            else 1
        )

    with tempfile.TemporaryDirectory(prefix="bench_codemods_") as tmp:
        tree = Path(tmp) / "deepspeed"
        shutil.copytree(installed_deepspeed(), tree, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
        files = sorted(str(p) for p in tree.rglob("*.py"))
        before = family_sites(tree)
        floor, floor_cpu = floor_seconds(files, args.jobs)
        os.environ["CODEMODS_CACHE_DIR"] = str(Path(tmp) / "cache")  # a cold cache: the migration does all the work
        load_before = load()
        seconds, rc, summary = migrate(tree, args.jobs)
        migrate_cpu = LAST_CPU["seconds"]
        load_after = load()
        after = family_sites(tree)
        compiled = compileall.compile_dir(str(tree), quiet=2, workers=args.jobs)
        print(f"deepspeed tree: {len(files)} .py files, migrate --jobs {args.jobs}: {seconds:.1f} s (rc={rc})")
        print(
            f"floor (libcst parse+print, {args.jobs} processes): {floor:.1f} s; ratio migrate/floor: {seconds / floor:.2f}x"
        )
        print(
            f"CPU time (user+sys, all processes): migrate {migrate_cpu:.1f} s, floor {floor_cpu:.1f} s "
            f"(ratio {migrate_cpu / max(floor_cpu, 1e-9):.2f}x); {load_before} before, {load_after} after the migration"
        )
        print(
            f"files scanned: {summary['files_scanned']}, changed: {summary['files_changed']}, parse errors: {summary['parse_errors']}"
        )
        print("sites rewritten: " + ", ".join(f"{k}={v}" for k, v in summary["sites_rewritten"].items()))
        print("sites left with TODOV1: " + ", ".join(f"{k}={v}" for k, v in summary["sites_todo"].items()))
        print(f"compileall of the migrated tree: {'ok' if compiled else 'FAILED'}")
        print("legacy call sites by family (before -> left after migration; rewritten %):")
        for family in sorted(before):
            done = before[family] - after.get(family, 0)
            print(
                f"  {family}: {before[family]} -> {after.get(family, 0)} ({100 * done / before[family]:.0f}% rewritten)"
            )
        total_before, total_after = sum(before.values()), sum(after.values())
        print(
            f"  all: {total_before} -> {total_after} ({100 * (total_before - total_after) / max(total_before, 1):.0f}% rewritten)"
        )
        imported = subprocess.run(
            [
                sys.executable,
                "-c",
                "import deepspeed, deepspeed.runtime.engine, deepspeed.moe.layer, deepspeed.runtime.pipe.engine; print(deepspeed.__file__)",
            ],
            capture_output=True,
            text=True,
            cwd=tmp,
            env=dict(os.environ, PYTHONPATH=f"{tmp}{os.pathsep}{REPO}"),
        )
        print(
            f"import of the migrated copy: {'ok ' + imported.stdout.strip() if imported.returncode == 0 else 'FAILED ' + imported.stderr[-300:]}"
        )
        ok = bool(compiled) and rc == 0
        if args.idempotent:
            again, rc2, second = migrate(tree, args.jobs, "--check")
            again_cpu = LAST_CPU["seconds"]
            print(
                f"second run (--check): {again:.1f} s, CPU {again_cpu:.1f} s, would change {second['files_changed']} files "
                f"(rc={rc2}); migration/check: {seconds / again:.1f}x wall, {migrate_cpu / max(again_cpu, 1e-9):.1f}x CPU"
            )
            cold, rc3, third = migrate(tree, args.jobs, "--check", "--no-cache")
            cold_cpu = LAST_CPU["seconds"]
            print(
                f"--check --no-cache (parses every file): {cold:.1f} s, CPU {cold_cpu:.1f} s, would change "
                f"{third['files_changed']} files (rc={rc3}); migration/check: {seconds / cold:.1f}x wall, "
                f"{migrate_cpu / max(cold_cpu, 1e-9):.1f}x CPU ({load()})"
            )
            ok = ok and rc3 == 0
            ok = ok and rc2 == 0
        if args.upstream:
            copy = args.upstream_out.resolve() / "copy"
            if copy.exists():
                shutil.rmtree(copy)
            shutil.copytree(tree, copy / "deepspeed", ignore=shutil.ignore_patterns("__pycache__"))
            ok = (
                compare_upstream(
                    copy / "deepspeed", args.upstream_out.resolve(), moe_tp=args.moe_tp, timeout=args.timeout
                )
                and ok
            )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
