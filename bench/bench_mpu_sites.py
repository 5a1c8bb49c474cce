"""mpu / bwc call sites of the installed deepspeed package before and after
``python -m codemods.migrate --jobs N`` on a copy (issue 10 item 3 for these two families).

Prints, per family, the sites counted by ``bench_codemods.family_sites`` before and after (and the
rewritten share), every site left with whether its line carries a ``# TODOV1:``, the migration time,
and whether the migrated copy imports (``deepspeed``, the engine, ZeRO, MoE, the pipe engine).

    python bench/bench_mpu_sites.py [--jobs 2] [--keep DIR]
"""

from __future__ import annotations

import argparse
import ast
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from bench_codemods import _MPU, family_sites, installed_deepspeed  # noqa: E402

FAMILIES = ("mpu", "bwc")
IMPORTS = (
    "deepspeed, deepspeed.runtime.engine, deepspeed.runtime.zero.stage3, deepspeed.moe.layer, "
    "deepspeed.runtime.pipe.engine, deepspeed.runtime.activation_checkpointing.checkpointing"
)


def sites(tree: Path) -> list[tuple[str, str, int, str, bool]]:
    """(family, file, line, code, TODOV1 on the statement's lines) of every mpu / bwc site left."""
    found = []
    for path in sorted(tree.rglob("*.py")):
        if path.name in ("groups.py", "topology.py", "bwc.py") and path.parent.name in ("utils", "pipe"):
            continue  # the modules that define the legacy APIs, as in family_sites
        text = path.read_text(encoding="utf-8")
        lines = text.splitlines()
        for node in ast.walk(ast.parse(text)):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            if name.startswith("bwc_"):
                family = "bwc"
            elif (
                name.startswith("get_")
                and isinstance(func, ast.Attribute)
                and isinstance(func.value, (ast.Name, ast.Attribute))
                and _MPU.search(ast.unparse(func.value))
            ):
                family = "mpu"
            else:
                continue
            span = lines[node.lineno - 1 : (node.end_lineno or node.lineno) + 3]
            found.append(
                (family, str(path.relative_to(tree)), node.lineno, ast.unparse(node), any("TODOV1" in s for s in span))
            )
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--keep", type=Path, help="migrate into this directory and keep it")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench_mpu_sites_")) if args.keep is None else args.keep
    try:
        tree = tmp / "deepspeed"
        shutil.rmtree(tree, ignore_errors=True)
        shutil.copytree(installed_deepspeed(), tree, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
        before = family_sites(tree)
        env = dict(
            os.environ,
            PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
            CODEMODS_CACHE_DIR=str(tmp / "cache"),
        )
        start = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-m", "codemods.migrate", "--jobs", str(args.jobs), "--no-progress", str(tree)],
            capture_output=True,
            text=True,
            env=env,
            cwd=REPO,
        )
        seconds = time.perf_counter() - start
        after = family_sites(tree)
        print(f"migrate --jobs {args.jobs}: {seconds:.1f} s, rc={done.returncode}")
        print(done.stderr.strip()[-2000:])
        for family in FAMILIES:
            rewritten = before[family] - after.get(family, 0)
            print(
                f"{family}: {before[family]} sites -> {after.get(family, 0)} left "
                f"({100 * rewritten / max(before[family], 1):.1f}% rewritten)"
            )
        left = sites(tree)
        for family, path, line, code, todo in left:
            print(f"  left {family} {path}:{line}: {code} -- {'TODOV1' if todo else 'NO TODOV1'}")
        print(f"left without TODOV1: {sum(not t for *_, t in left)}")
        imported = subprocess.run(
            [sys.executable, "-c", f"import {IMPORTS}; print(deepspeed.__file__)"],
            capture_output=True,
            text=True,
            cwd=tmp,
            env=dict(os.environ, PYTHONPATH=f"{tmp}{os.pathsep}{REPO}"),
        )
        out = imported.stdout.strip() if imported.returncode == 0 else imported.stderr[-600:]
        print(f"import of the migrated copy: {'ok' if imported.returncode == 0 else 'FAILED'} {out}")
        ok = done.returncode == 0 and imported.returncode == 0 and str(tmp) in out
        return 0 if ok else 1
    finally:
        if args.keep is None:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
