"""Run the migration over many files: in parallel, atomically, with a per-file report."""

from __future__ import annotations

import difflib
import logging
import os
import tempfile
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Iterator, Optional, Sequence

import libcst as cst

from .cache import FixedPoints, content_hash
from .files import module_and_package, read_source
from .pipeline import migrate_code
from .todo_wrap import numbered
from .vendored import vendored_copy

logger = logging.getLogger(__name__)
TODO_MARK = "# TODOV1:"


@dataclass
class FileReport:
    """What the migration did (or would do) to one file."""

    path: str
    changed: bool = False
    sites: Counter = field(default_factory=Counter)
    todos: Counter = field(default_factory=Counter)
    error: Optional[str] = None
    diff: Optional[str] = None
    fixed: Optional[str] = None  # content hash of the migrated code (a fixed point of the migration)
    cached: bool = False
    # each TODOV1 comment this run wrote: (line in the migrated file, the comment, its full advice)
    todo_lines: list = field(default_factory=list)
    failed: bool = False  # ``error`` is a codemod failure (the file parses), not a read/parse/write error
    # (line, why) of each site a rule failed at: left as it is, neither rewritten nor commented
    failures: list = field(default_factory=list)


@dataclass
class Summary:
    """Totals over a run."""

    scanned: int = 0
    changed: int = 0
    errors: list[tuple[str, str]] = field(default_factory=list)  # files not read, parsed or written
    failed: list[tuple[str, str]] = field(default_factory=list)  # files the codemods failed on (left unchanged)
    failed_sites: list[tuple[str, int, str]] = field(default_factory=list)  # (path, line, why): sites left as they are
    sites: Counter = field(default_factory=Counter)
    todos: Counter = field(default_factory=Counter)
    reports: list = field(default_factory=list, repr=False)

    def add(self, report: FileReport) -> None:
        self.reports.append(report)
        self.scanned += 1
        self.changed += report.changed
        self.sites.update(report.sites)
        self.todos.update(report.todos)
        if report.error:
            (self.failed if report.failed else self.errors).append((report.path, report.error))
        self.failed_sites += [(report.path, line, why) for line, why in report.failures]

    def as_dict(self) -> dict:
        return {
            "files_scanned": self.scanned,
            "files_changed": self.changed,
            "parse_errors": len(self.errors),
            "codemod_failures": len(self.failed),
            "failed_sites": [{"path": p, "line": line, "why": why} for p, line, why in self.failed_sites],
            "sites_rewritten": dict(sorted(self.sites.items())),
            "sites_todo": dict(sorted(self.todos.items())),
        }


def write_atomically(path: Path, text: str, encoding: str = "utf-8") -> None:
    """Replace ``path`` with ``text`` (in ``encoding``) so that readers see the old or the new file, never a part.

    A symbolic link stays a link: its target is replaced."""
    path = Path(os.path.realpath(path))
    mode = path.stat().st_mode
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".migrate", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding=encoding, newline="") as fh:
            fh.write(text)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def migrate_file(
    path: str,
    write: bool = True,
    want_diff: bool = False,
    comm_to_torch: bool = False,
    vendored: bool = False,
) -> FileReport:
    """Migrate one file (``vendored``: a file of a DeepSpeed copy a tree ships, codemods._engine.vendored);
    errors (unreadable, unparsable) are reported, never raised."""
    report = FileReport(path)
    file = Path(path)
    try:
        source, encoding = read_source(file)
        module, package = module_and_package(file)
    except (OSError, UnicodeDecodeError, SyntaxError) as err:  # SyntaxError: an unknown coding name
        report.error = f"cannot read: {err}"
        return report
    try:
        result = migrate_code(
            source,
            filename=path,
            module=module,
            package=package,
            comm_to_torch=comm_to_torch,
            vendored=vendored,
        )
    except cst.ParserSyntaxError as err:
        report.error = f"cannot parse: {str(err).splitlines()[0]} (line {err.raw_line})"
        return report
    except Exception as err:  # a codemod bug must not stop the run or touch the file
        report.error = f"codemod failed (file left unchanged): {type(err).__name__}: {' '.join(str(err).split())}"
        report.failed = True
        logger.debug("codemod failed on %s", path, exc_info=True)
        return report
    report.failures = list(result.failures)
    report.sites, report.todos = result.sites, result.todos
    report.changed = result.code != source
    if report.changed and result.advice:
        report.todo_lines = written_todos(source, result.code, result.advice)
    report.fixed = content_hash(result.code, module, package, vendored)
    if report.changed and want_diff:
        lines = difflib.unified_diff(_lines(source), _lines(result.code), f"a/{path}", f"b/{path}")
        # a last line without a newline gets the marker patch tools expect (and no glued next line)
        report.diff = "".join(
            line if line.endswith("\n") else line + "\n\\ No newline at end of file\n" for line in lines
        )
    if report.changed and write:
        try:
            write_atomically(file, result.code, encoding=encoding)
        except (OSError, UnicodeEncodeError) as err:
            report.error = f"cannot write: {err}"
            report.changed, report.sites, report.todos = False, Counter(), Counter()
            report.todo_lines = []
    return report


def written_todos(source: str, code: str, advice: dict) -> list[tuple[int, str, list[str]]]:
    """``(line, comment, full advice)`` of each TODOV1 comment in ``code`` that ``source`` lacks
    (one-based lines of ``code``; ``advice``: comment -> advice, from the migration)."""
    before = Counter(line.strip() for _, line in numbered(_lines(source)) if TODO_MARK in line)
    out = []
    for number, line in numbered(_lines(code)):  # a comment wrapped over lines: at its first line
        if TODO_MARK not in line:
            continue
        if before[line.strip()] > 0:  # a line the source had already
            before[line.strip()] -= 1
            continue
        for comment, full in advice.items():
            if comment in line:
                out.append((number, comment, list(full)))
                break
    return out


def _lines(text: str) -> list[str]:
    """``text`` split after each ``\n`` only (``str.splitlines`` also splits at form feeds)."""
    parts = text.split("\n")
    return [p + "\n" for p in parts[:-1]] + ([parts[-1]] if parts[-1] else [])


def _migrate_star(args: tuple[str, bool, bool, bool, bool]) -> FileReport:
    return migrate_file(*args)


def run(
    paths: Sequence[Path],
    *,
    jobs: int = 1,
    write: bool = True,
    want_diff: bool = False,
    on_report: Optional[Callable[[FileReport], None]] = None,
    progress: Optional[Callable[[Iterable[FileReport], int], Iterator[FileReport]]] = None,
    comm_to_torch: bool = False,
    cache: Optional[FixedPoints] = None,
    roots: Optional[Sequence[Path]] = None,
    deepspeed_rules: str = "auto",
) -> Summary:
    """Migrate ``paths`` with ``jobs`` worker processes; ``on_report`` sees reports in ``paths`` order.

    ``roots``: the paths the run was given (default: ``paths`` themselves), which tell a DeepSpeed
    package from a copy a tree vendors, as ``deepspeed_rules`` says (codemods._engine.vendored)."""
    if jobs < 1:
        raise ValueError(f"jobs={jobs} is not valid; it must be at least 1")
    copies = [vendored_copy(Path(p), [Path(p)] if roots is None else roots, deepspeed_rules) for p in paths]
    tasks = [(str(p), write, want_diff, comm_to_torch, copy) for p, copy in zip(paths, copies)]
    summary = Summary()
    known: dict[int, FileReport] = {}
    if cache is not None:  # files already migrated by these codemods need no parse
        for index, path in enumerate(paths):
            digest = _file_hash(path, copies[index])
            todos = cache.get(digest) if digest is not None else None
            if todos is not None:
                known[index] = FileReport(str(path), todos=Counter(todos), fixed=digest, cached=True)
    if known:
        pending = [i for i in range(len(tasks)) if i not in known]
        inner = run(
            [paths[i] for i in pending],
            jobs=jobs,
            write=write,
            want_diff=want_diff,
            comm_to_torch=comm_to_torch,
            on_report=None,
            progress=progress,
            cache=None,
            roots=roots,
            deepspeed_rules=deepspeed_rules,
        )
        merged: dict[int, FileReport] = dict(known)
        for i, report in zip(pending, inner.reports):
            merged[i] = report
        summary = _collect([merged[i] for i in range(len(tasks))], len(tasks), Summary(), on_report, None)
        _remember(cache, summary.reports)
        return summary
    if jobs == 1 or len(tasks) <= 1:
        reports: Iterable[FileReport] = map(_migrate_star, tasks)
        summary = _collect(reports, len(tasks), summary, on_report, progress)
    else:
        # largest files first, so that one big file does not finish last on a single worker
        order = sorted(range(len(tasks)), key=lambda i: -_size(tasks[i][0]))
        done: list[Optional[FileReport]] = [None] * len(tasks)
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            finished = pool.map(_migrate_star, [tasks[i] for i in order])
            stream = progress(finished, len(tasks)) if progress is not None else finished
            for index, report in zip(order, stream):
                done[index] = report
        summary = _collect(done, len(tasks), summary, on_report, None)
    if cache is not None:
        _remember(cache, summary.reports)
    return summary


def _file_hash(path, vendored: bool = False) -> Optional[str]:
    """The cache key of ``path``: its text and its place (module and package, and whether it is in a
    vendored DeepSpeed copy, which the rules depend on)."""
    try:
        return content_hash(read_source(path)[0], *module_and_package(Path(path)), vendored)
    except (OSError, UnicodeDecodeError, SyntaxError):
        return None


def _remember(cache: FixedPoints, reports) -> None:
    for report in reports:
        if report.fixed is not None and not report.error and not report.failures and not report.cached:
            cache.add(report.fixed, dict(report.todos))
    cache.save()


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def _collect(reports, total, summary, on_report, progress) -> Summary:
    stream = progress(reports, total) if progress is not None else reports
    for report in stream:
        summary.add(report)
        if on_report is not None:
            on_report(report)
    return summary
