"""``ds-migrate PATH...`` (also ``python -m codemods.migrate``): rewrite legacy DeepSpeed
process-group call sites to the mesh API (``mesh_core``), in place, and report what was rewritten
and, by ``file:line``, each site left with a ``# TODOV1:`` comment.

Exit status (:data:`EPILOG`): 0 on success; 1 with ``--check`` when any file would change; 2 when
any file could not be read, parsed or written (left untouched); 3 when the files parse but the
codemods failed on a file (left untouched) or at a site (that statement left as it is, neither
rewritten nor commented, the rest of its file migrated). Each is reported on stderr: ``path:
error`` or ``path:line: not migrated: why``. 2 wins over 3, and both over 1.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Optional, Sequence

from ._engine.cache import FixedPoints
from ._engine.files import discover
from ._engine.runner import FileReport, Summary, run
from ._engine.todo_links import explain_command
from ._engine.vendored import MODES

DESCRIPTION = (
    "Rewrite legacy DeepSpeed process-group call sites (deepspeed.utils.groups, PipelineParallelGrid, "
    "topologies, deepspeed.initialize(mpu=, mesh_param=), mpu calls) to the mesh API (mesh_core), in place. "
    "Sites that cannot be rewritten safely keep their code and get a short '# TODOV1:' comment naming what to "
    "write and the 'ds-migrate --explain <code>' that prints the rest; the run lists each one as file:line with "
    "its full advice."
)
EPILOG = (
    "Exit status: 0 on success; 1 with --check when any file would change; 2 when a file could not be read, parsed "
    "or written (left untouched); 3 when the codemods failed on a file that parses (left untouched) or at a site "
    "(that statement left as it is, the rest of the file migrated). 2 wins over 3, both over 1."
)
EXIT_CHANGES, EXIT_UNREADABLE, EXIT_CODEMOD_FAILED = 1, 2, 3


def prog_name(argv0: Optional[str] = None) -> str:
    """The command as the user typed it: ``ds-migrate`` (the console script) or ``python -m codemods.migrate``."""
    name = os.path.basename(argv0 if argv0 is not None else (sys.argv[0] if sys.argv else ""))
    if not name or name in ("migrate.py", "__main__.py", "-c") or name.startswith("python"):
        return "python -m codemods.migrate"
    return name


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=prog_name(), description=DESCRIPTION, epilog=EPILOG)
    parser.add_argument("paths", nargs="*", help="files or directories to migrate")
    parser.add_argument(
        "--explain",
        action="append",
        default=[],
        metavar="CODE",
        help="print what a TODOV1 comment's code means (a legacy API such as "
        "_get_expert_parallel_group, or a kind such as groups) and exit",
    )
    parser.add_argument("--diff", action="store_true", help="print a unified diff; write nothing")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 when any file would change")
    parser.add_argument("--jobs", "-j", type=int, default=1, help="worker processes (default 1)")
    parser.add_argument("--include", action="append", default=[], metavar="GLOB", help="only files matching GLOB")
    parser.add_argument("--exclude", action="append", default=[], metavar="GLOB", help="skip files matching GLOB")
    parser.add_argument(
        "--comm-to-torch",
        action="store_true",
        help="also rewrite deepspeed.comm thin wrappers to torch.distributed (kill-switch, backend-specific and "
        "different-semantics sites get TODOV1)",
    )
    parser.add_argument(
        "--no-cache",
        action="store_true",
        help="do not skip files already migrated by these codemods (cache in $CODEMODS_CACHE_DIR)",
    )
    parser.add_argument(
        "--deepspeed-rules",
        choices=MODES,
        default="auto",
        help="how a 'deepspeed' package among PATHS is migrated: 'internal' as DeepSpeed itself (its reads of the "
        "legacy groups move to the mesh, its builders stay: it must run under compat.install()), 'user' as user code "
        "(a builder and its readers move together or stay). 'auto' (default): internal for the installed deepspeed and "
        "a path at or inside a 'deepspeed' package, user for a copy found below a directory given (a tree that ships "
        "its own deepspeed/)",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        help="print only JSON on stdout: the summary, each TODOV1 written (path, line, advice) "
        "and, with --diff, each file's diff",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)
    if not args.paths and not args.explain:
        parser.error("the following arguments are required: paths")
    if args.jobs < 1:
        parser.error(f"--jobs {args.jobs} is not valid; it must be at least 1")
    return args


def _progress_bar(enabled: bool) -> Optional[Callable[[Iterable[FileReport], int], Iterator[FileReport]]]:
    if not enabled:
        return None
    try:
        from tqdm import tqdm
    except ImportError:  # the bar is a convenience; the run does not need it
        return None

    def bar(reports: Iterable[FileReport], total: int) -> Iterator[FileReport]:
        yield from tqdm(reports, total=total, unit="file", file=sys.stderr, leave=False)

    return bar


def format_summary(summary: Summary, seconds: float, wrote: bool) -> str:
    verb = "changed" if wrote else "would change"
    lines = [
        f"files scanned: {summary.scanned}, {verb}: {summary.changed}, not read/parsed/written: {len(summary.errors)}, "
        f"codemod failures: {len(summary.failed)} files, {len(summary.failed_sites)} sites ({seconds:.1f} s)",
        "sites rewritten: " + (", ".join(f"{k}={v}" for k, v in sorted(summary.sites.items())) or "none"),
        "sites left with TODOV1: " + (", ".join(f"{k}={v}" for k, v in sorted(summary.todos.items())) or "none"),
    ]
    return "\n".join(lines)


def todo_list(summary: Summary) -> list[dict[str, Any]]:
    """Each TODOV1 comment the run wrote (or would write): path, line, the comment, its full advice
    and the ``ds-migrate --explain`` command it names."""
    out = []
    for report in sorted(summary.reports, key=lambda r: r.path):
        for line, comment, advice in report.todo_lines:
            see = explain_command(comment)
            out.append({"path": report.path, "line": line, "comment": comment, "advice": advice, "see": see})
    return out


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    if args.explain:
        import ds_mesh_advice

        sys.stdout.write("\n\n".join(ds_mesh_advice.explain(code) for code in args.explain) + "\n")
        return 0 if all(ds_mesh_advice.find(code) for code in args.explain) else 1
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s: %(message)s")
    try:
        paths = discover(args.paths, args.include, args.exclude)
    except FileNotFoundError as err:
        sys.stderr.write(f"error: {err}\n")
        return 2
    write = not (args.diff or args.check)

    def on_report(report: FileReport) -> None:
        if report.error:
            sys.stderr.write(f"error: {report.path}: {report.error}\n")
        for line, why in report.failures:
            sys.stderr.write(f"error: {report.path}:{line}: not migrated (statement left as it is): {why}\n")
        if report.diff and not args.json:  # with --json the diffs go inside the JSON
            sys.stdout.write(report.diff)

    show_bar = not args.no_progress and sys.stderr.isatty() and len(paths) > 20
    start = time.perf_counter()
    summary = run(
        paths,
        jobs=args.jobs,
        write=write,
        want_diff=args.diff,
        on_report=on_report,
        progress=_progress_bar(show_bar),
        comm_to_torch=args.comm_to_torch,
        cache=None if args.no_cache else FixedPoints(args.comm_to_torch),
        roots=[Path(p) for p in args.paths],
        deepspeed_rules=args.deepspeed_rules,
    )
    seconds = time.perf_counter() - start
    todos = todo_list(summary)
    if args.json:
        out = {**summary.as_dict(), "seconds": round(seconds, 3), "todos": todos}
        if args.diff:
            out["diffs"] = {r.path: r.diff for r in summary.reports if r.diff}
        sys.stdout.write(json.dumps(out) + "\n")
    else:
        for todo in todos:
            sys.stderr.write(
                f"{todo['path']}:{todo['line']}: TODOV1: {'; '.join(todo['advice'])} (see {todo['see']})\n"
            )
    sys.stderr.write(format_summary(summary, seconds, write) + "\n")
    if summary.errors:
        return EXIT_UNREADABLE
    if summary.failed or summary.failed_sites:
        return EXIT_CODEMOD_FAILED
    if args.check and summary.changed:
        return EXIT_CHANGES
    return 0


if __name__ == "__main__":
    sys.exit(main())
