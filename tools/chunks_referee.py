"""The piecewise migration of big files against the whole-file path, on every file of some trees.

``python tools/chunks_referee.py PATH... [--group-bytes 1 12000]`` migrates each ``.py`` file under
``PATH`` twice: the whole-file path, and the piecewise one (codemods/_engine/chunks.py) forced whatever the
file's size, with groups of each ``--group-bytes`` (1: every definition on its own). It prints, as
JSON, how many files the piecewise path took, how many of those gave the whole-file path's bytes,
sites and TODOV1 counts, and the files that did not (exit status 1 if any). The files are not written.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Optional, Sequence

ROOT = Path(__file__).resolve().parents[1]


def compare(path: Path, group_bytes: Sequence[int]) -> dict:
    """{"taken": groups sizes the piecewise path took, "different": those that differed} for one file."""
    from codemods._engine import chunks, pipeline
    from codemods._engine.files import module_and_package, read_source

    try:
        source, _ = read_source(path)
    except (OSError, UnicodeDecodeError, SyntaxError):
        return {"taken": [], "different": [], "error": "unreadable"}
    source = source.removeprefix("\ufeff")
    module, package = module_and_package(path)
    saved = chunks.MIN_BYTES, chunks.GROUP_BYTES
    whole: Optional[pipeline.Migration] = None
    taken, different = [], []
    try:
        chunks.MIN_BYTES = float("inf")
        try:
            whole = pipeline.migrate_code(source, filename=str(path), module=module, package=package)
        except Exception as err:  # the whole-file path fails: the piecewise one must not answer
            whole = None
            failure = f"{type(err).__name__}"
        for size in group_bytes:
            chunks.GROUP_BYTES = size
            try:
                fast = pipeline._migrate_in_pieces(source, str(path), module, package, pipeline.CODEMODS)
            except Exception as err:
                fast, different = None, [*different, f"{size}: raised {type(err).__name__}"]
            if fast is None:
                continue
            taken.append(size)
            if whole is None:
                different.append(f"{size}: whole-file path raised {failure}")
            elif (fast.code, fast.sites, fast.todos) != (whole.code, whole.sites, whole.todos):
                different.append(str(size))
    finally:
        chunks.MIN_BYTES, chunks.GROUP_BYTES = saved
    return {"taken": taken, "different": different}


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="+")
    parser.add_argument("--group-bytes", type=int, nargs="+", default=[1, 12_000])
    args = parser.parse_args(argv)
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from codemods._engine.files import discover

    files = discover(args.paths)
    taken = same = 0
    bad: dict[str, list[str]] = {}
    for path in files:
        found = compare(path, args.group_bytes)
        taken += bool(found["taken"])
        same += bool(found["taken"]) and not found["different"]
        if found["different"]:
            bad[str(path)] = found["different"]
    print(json.dumps({"files": len(files), "taken": taken, "same_bytes": same, "different": bad}, indent=1))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
