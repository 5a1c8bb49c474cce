#!/usr/bin/env python
"""Outside code as the referee: migrate copies of public trees and count, per tree, the legacy
DeepSpeed process-group sites an independent scan finds, how many the migration rewrote, flagged
with ``TODOV1`` or missed, the files that no longer compile on each Python, and the time.

    python tools/outside_referee.py /work/trees/*            # one table row per tree
    python tools/outside_referee.py TREE --missed            # and every missed site (file:line family code)
    python tools/outside_referee.py TREE --keep out/         # keep the migrated copies under out/

The scan does not use the codemods: it reads the legacy names from the installed deepspeed's own
sources (``deepspeed/utils/groups.py``, ``utils/bwc.py``, ``runtime/pipe/topology.py``) and walks each
file's ``ast``. A site still present after the migration counts as flagged when its statement (for a
compound statement: its header lines) carries a ``TODOV1`` comment, or the comment lines directly
above it hold one (a long line's TODOV1 stands there), else as missed; the sites it no
longer finds count as rewritten (a reader kept with the legacy state its builder keeps counts as
flagged: the builder's one TODOV1, ``groups.<builder> kept with ...``, stands for them — a lettered
getter for an AutoTP builder, an expert getter for an expert builder). Families:

- ``groups``: a call of a ``deepspeed.utils.groups`` function (module alias, dotted, imported name,
  or a ``deepspeed.utils`` re-export), and ``groups.mpu = ...`` assignments;
- ``topology``: ``PipelineParallelGrid`` / ``ProcessTopology`` / ``Pipe*Topology`` constructions;
- ``grid``: a ``PipelineParallelGrid`` method call or attribute read on ``<x>.grid`` / ``<x>._grid``
  / ``<x>.mpu`` (the engine's grid), on a name annotated ``PipelineParallelGrid`` or bound to one;
- ``initialize``: ``deepspeed.initialize(..., mpu=...)`` / ``mesh_param=...``;
- ``mpu``: a getter of DeepSpeed's mpu protocol (the ``mpu.get_*`` the installed deepspeed calls) on
  the very expression passed as ``mpu=`` to ``initialize`` in that file;
- ``bwc``: calls of the ``deepspeed.utils.bwc`` helpers.

A call counts as ``deepspeed.initialize`` only when its name resolves to deepspeed's through the
file's imports (``import deepspeed [as ds]`` then ``ds.initialize``, or ``from deepspeed import
initialize``): a project's own ``initialize`` and the Megatron ``parallel_state`` calls around it
are look-alikes. ``mpu`` also counts a protocol getter on a parameter named ``mpu`` in a file that
imports deepspeed; ``groups`` also counts the pre-0.6 names 0.19.8 no longer has.

The table also shows the migration's exit status and its codemod failures (files left unchanged /
statements a rule failed at, each listed).

Exit status 0; 1 when a migrated file fails to compile where its original compiled, a second run
would change something, or the migration failed on a file or a site (or exited non-zero).
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Optional, Sequence

REPO = Path(__file__).resolve().parents[1]
FAMILIES = ("groups", "topology", "grid", "initialize", "mpu", "bwc")
PYTHONS = {"3.10": "/root/.pyenv/versions/3.10.13/bin/python", "3.11": "/root/.pyenv/versions/3.11.7/bin/python"}
TOPOLOGY_CLASSES = {
    "PipelineParallelGrid",
    "ProcessTopology",
    "PipeDataParallelTopology",
    "PipeModelDataParallelTopology",
}
GROUPS_MODULE = "deepspeed.utils.groups"
GRID_HOLDERS = {"grid", "_grid"}
# pre-0.6 deepspeed.utils.groups names that 0.19.8 no longer has (not in the installed sources):
# a call of one is a legacy site all the same
PRE_06_GROUPS = frozenset(
    {
        "expert_parallel_is_initialized",
        "initialize_expert_parallel",
        "initialize_model_parallel",
        "get_expert_parallel_group",
        "get_expert_data_parallel_group",
        "get_expert_parallel_world_size",
        "get_expert_data_parallel_world_size",
        "get_expert_parallel_rank",
        "get_expert_data_parallel_rank",
        "get_expert_parallel_src_rank",
        "get_max_expert_size",
        "get_model_parallel_src_rank",
    }
)


def _deepspeed_dir() -> Path:
    spec = importlib.util.find_spec("deepspeed")  # the top-level spec: deepspeed is not imported
    if spec is None or spec.origin is None:
        raise SystemExit("deepspeed is not installed in this interpreter; run with the venv that has deepspeed==0.19.8")
    return Path(spec.origin).parent


def _functions(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}


def _grid_api(path: Path) -> set[str]:
    """Methods and ``self.<attr>`` attributes of the installed ``PipelineParallelGrid``."""
    tree = ast.parse(path.read_text())
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "PipelineParallelGrid":
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and not item.name.startswith("__"):
                    names.add(item.name)
            for sub in ast.walk(node):
                if (
                    isinstance(sub, ast.Attribute)
                    and isinstance(sub.ctx, ast.Store)
                    and isinstance(sub.value, ast.Name)
                    and sub.value.id == "self"
                ):
                    names.add(sub.attr)
    return names


def _mpu_protocol(root: Path) -> set[str]:
    """The ``get_*`` methods the installed deepspeed calls on an ``mpu``."""
    found: set[str] = set()
    for path in root.rglob("*.py"):
        found.update(re.findall(r"\bmpu\.(get_\w+)\(", path.read_text(errors="replace")))
    return found


@dataclass(frozen=True)
class LegacyNames:
    groups: frozenset
    bwc: frozenset
    grid: frozenset
    mpu: frozenset

    @classmethod
    def installed(cls) -> "LegacyNames":
        root = _deepspeed_dir()
        return cls(
            frozenset(_functions(root / "utils" / "groups.py")),
            frozenset(_functions(root / "utils" / "bwc.py")),
            frozenset(_grid_api(root / "runtime" / "pipe" / "topology.py")),
            frozenset(_mpu_protocol(root)),
        )


@dataclass(frozen=True)
class Site:
    family: str
    line: int
    end: int  # last line of the statement's header (where a TODOV1 comment goes)
    start: int
    text: str


def _dotted(node: ast.AST) -> Optional[str]:
    """``a.b.c`` of a name or attribute chain (a subscript in it as ``a.b[]``: ``engines[-1].grid``)."""
    parts = []
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        if isinstance(node, ast.Subscript):
            node = node.value
            if isinstance(node, ast.Attribute):
                parts.append(node.attr + "[]")
                node = node.value
            elif isinstance(node, ast.Name):
                parts.append(node.id + "[]")
                return ".".join(reversed(parts))
            continue
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "super":
        parts.append("super()")
        return ".".join(reversed(parts))
    return None


class _Scan(ast.NodeVisitor):
    """One file's legacy sites (see the module docstring for the families)."""

    def __init__(self, names: LegacyNames, source: str) -> None:
        self.names = names
        self.lines = source.splitlines()
        self.sites: list[Site] = []
        self.stack: list[ast.stmt] = []
        self.groups_modules: set[str] = {GROUPS_MODULE}
        self.groups_functions: set[str] = set()
        self.bwc_functions: set[str] = set()
        self.topology_names: set[str] = set()
        self.grid_names: set[str] = set()
        self.mpu_exprs: set[str] = set()
        # import resolution: what names deepspeed and its initialize here (a project's own
        # ``initialize`` or Megatron's ``parallel_state`` calls are look-alikes, not legacy sites)
        self.deepspeed_modules: set[str] = set()
        self.initialize_names: set[str] = set()
        self.mpu_parameter = False  # a function here has a parameter named mpu

    def is_deepspeed_initialize(self, func: ast.AST) -> bool:
        if isinstance(func, ast.Name):
            return func.id in self.initialize_names
        return (
            isinstance(func, ast.Attribute)
            and func.attr == "initialize"
            and _dotted(func.value) in self.deepspeed_modules
        )

    # pass 1: aliases and the mpu= expressions
    def collect(self, tree: ast.Module) -> None:
        for node in ast.walk(tree):  # the imports first: the initialize calls are resolved with them
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.name == "deepspeed" or a.name.startswith("deepspeed."):
                        if a.asname is None:
                            self.deepspeed_modules.add("deepspeed")  # ``import deepspeed.x`` binds deepspeed
                        elif a.name == "deepspeed":
                            self.deepspeed_modules.add(a.asname)
            elif isinstance(node, ast.ImportFrom) and node.module == "deepspeed" and not node.level:
                for a in node.names:
                    if a.name == "initialize":
                        self.initialize_names.add(a.asname or a.name)
            elif isinstance(node, ast.arg) and node.arg == "mpu":
                self.mpu_parameter = True
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.name == GROUPS_MODULE:
                        self.groups_modules.add(a.asname or a.name)
            elif isinstance(node, ast.ImportFrom) and node.module:
                for a in node.names:
                    bound = a.asname or a.name
                    full = f"{node.module}.{a.name}"
                    if full == GROUPS_MODULE:
                        self.groups_modules.add(bound)
                    elif node.module == GROUPS_MODULE or (
                        node.module == "deepspeed.utils" and a.name in self.names.groups
                    ):
                        self.groups_functions.add(bound)
                    elif node.module == "deepspeed.utils.bwc" or (
                        node.module == "deepspeed.utils" and a.name in self.names.bwc
                    ):
                        self.bwc_functions.add(bound)
                    if a.name in TOPOLOGY_CLASSES and node.module.startswith("deepspeed"):
                        self.topology_names.add(bound)
            elif isinstance(node, ast.Call) and self.is_deepspeed_initialize(node.func):
                for kw in node.keywords:
                    values = [kw.value.body, kw.value.orelse] if isinstance(kw.value, ast.IfExp) else [kw.value]
                    for value in values:
                        if kw.arg == "mpu" and _dotted(value):
                            self.mpu_exprs.add(_dotted(value))
            elif (
                isinstance(node, ast.arg)
                and node.annotation is not None
                and _last(node.annotation) == "PipelineParallelGrid"
            ):
                self.grid_names.add(node.arg)
            elif (
                isinstance(node, ast.AnnAssign)
                and isinstance(node.target, ast.Name)
                and _last(node.annotation) == "PipelineParallelGrid"
            ):
                self.grid_names.add(node.target.id)
            elif (
                isinstance(node, ast.Assign)
                and isinstance(node.value, ast.Call)
                and _last(node.value.func) == "PipelineParallelGrid"
            ):
                for t in node.targets:
                    if isinstance(t, ast.Name):
                        self.grid_names.add(t.id)

    def add(self, family: str, node: ast.AST) -> None:
        stmt = self.stack[-1]
        body = getattr(stmt, "body", None)
        if isinstance(body, list) and body and not isinstance(stmt, (ast.Module,)):
            end = max(stmt.lineno, body[0].lineno - 1)  # the header of a compound statement
        else:
            end = stmt.end_lineno or stmt.lineno
        text = ast.get_source_segment("\n".join(self.lines), node) or ""
        self.sites.append(Site(family, node.lineno, end, stmt.lineno, " ".join(text.split())[:90]))

    def generic_visit(self, node: ast.AST) -> None:
        if isinstance(node, ast.stmt):
            self.stack.append(node)
            super().generic_visit(node)
            self.stack.pop()
        else:
            super().generic_visit(node)

    def visit_Assign(self, node: ast.Assign) -> None:
        for t in node.targets:
            if isinstance(t, ast.Attribute) and t.attr == "mpu" and _dotted(t.value) in self.groups_modules:
                self.stack.append(node)
                self.add("groups", t)
                self.stack.pop()
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        dotted = _dotted(func)
        owner, _, attr = (dotted or "").rpartition(".")
        if isinstance(func, ast.Name):
            if func.id in self.groups_functions:
                self.add("groups", node)
            elif func.id in self.bwc_functions:
                self.add("bwc", node)
            elif func.id in self.topology_names:
                self.add("topology", node)
            elif self.is_deepspeed_initialize(func) and self._moves_layout(node):
                self.add("initialize", node)
        elif isinstance(func, ast.Attribute):
            if owner in self.groups_modules and (attr in self.names.groups or attr in PRE_06_GROUPS):
                self.add("groups", node)
            elif owner.endswith("bwc") and attr in self.names.bwc:
                self.add("bwc", node)
            elif attr in TOPOLOGY_CLASSES and owner.startswith("deepspeed"):
                self.add("topology", node)
            elif self.is_deepspeed_initialize(func) and any(kw.arg in ("mpu", "mesh_param") for kw in node.keywords):
                if self._moves_layout(node):
                    self.add("initialize", node)
            elif attr in self.names.mpu and owner in self.mpu_exprs and not self._grid_owner(owner):
                self.add("mpu", node)
            elif (
                attr in self.names.mpu
                and owner == "mpu"
                and self.mpu_parameter
                and self.deepspeed_modules | self.initialize_names
            ):
                self.add("mpu", node)  # a parameter named mpu in a file that imports deepspeed
        self.generic_visit(node)

    @staticmethod
    def _moves_layout(node: ast.Call) -> bool:
        return any(kw.arg in ("mpu", "mesh_param") and not _is_none(kw.value) for kw in node.keywords)

    def _grid_owner(self, owner: str) -> bool:
        head, _, last = owner.rpartition(".")
        return (last in GRID_HOLDERS and bool(head)) or owner in self.grid_names

    def visit_Attribute(self, node: ast.Attribute) -> None:
        owner = _dotted(node.value)
        if (
            owner is not None
            and node.attr in self.names.grid
            and isinstance(node.ctx, ast.Load)
            and self._grid_owner(owner)
        ):
            self.add("grid", node)
        self.generic_visit(node)


def _last(node: ast.AST) -> Optional[str]:
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value.rpartition(".")[2]
    return None


def _is_none(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and node.value is None


def scan_source(source: str, names: LegacyNames, original: Optional[str] = None) -> Optional[list[Site]]:
    """The legacy sites of ``source`` (None if it does not parse here); for a migrated file, the
    aliases and ``mpu=`` expressions of its ``original`` count too (the migration may have removed
    the import or the ``mpu=`` that made a call a legacy site)."""
    if original is None and all(m not in source for m in ("deepspeed", "groups", "Topology", "grid")):
        return []
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return None
    scan = _Scan(names, source)
    scan.collect(tree)
    if original is not None:
        try:
            scan.collect(ast.parse(original))
        except (SyntaxError, ValueError):
            pass
    if not (
        scan.groups_functions
        or scan.bwc_functions
        or scan.topology_names
        or scan.grid_names
        or scan.mpu_exprs
        or "deepspeed" in source
    ):
        return []
    scan.stack.append(tree)  # type: ignore[arg-type]
    scan.generic_visit(tree)
    return scan.sites


# a tree's own copy of a module that defines the legacy APIs (a vendored DeepSpeed): the codemods
# never rewrite it, as the installed one (codemods._engine.legacy_names.DEFINING_MODULES)
DEFINING_COPIES = ("deepspeed/utils/groups.py", "deepspeed/runtime/pipe/topology.py")


def flagged(site: Site, lines: list[str], advice: Sequence[str] = ()) -> bool:
    """The site's statement carries a TODOV1, or it is a reader kept with the legacy state a builder
    in this file keeps (the builder's one TODOV1 names it: ``kept with <name>:<line>``, in the
    comment or in its full ``advice``, the run's listing of the file's TODOV1s)."""
    if any("TODOV1" in lines[i - 1] for i in range(site.start, min(site.end, len(lines)) + 1)):
        return True
    above = site.start - 1  # a TODOV1 standing above the statement (a long line's), continued on "#   " lines
    while 1 <= above <= len(lines) and lines[above - 1].lstrip().startswith("#"):
        if "TODOV1" in lines[above - 1]:
            return True
        above -= 1
    name = re.match(r"[\w.]*?(\w+)\(", site.text)
    if not name:
        return False
    reader = name.group(1)
    for line in [*lines, *(f"TODOV1: {text}" for text in advice)]:
        kept = re.search(r"TODOV1: groups\.(\w+) kept with", line)
        if kept is None:
            continue
        builder = kept.group(1)
        if builder.startswith("_init_tp") and reader.startswith("get_"):  # the AutoTP groups' lettered getters
            return True
        if builder.startswith("_create_expert") and "expert" in reader:
            return True
    return False


@dataclass
class TreeResult:
    tree: str
    files: int = 0
    changed: int = 0
    found: Counter = field(default_factory=Counter)
    rewritten: Counter = field(default_factory=Counter)
    flagged: Counter = field(default_factory=Counter)
    missed: Counter = field(default_factory=Counter)
    missed_sites: list[str] = field(default_factory=list)
    compile_failures: dict = field(default_factory=dict)  # python -> [files that compiled before, not after]
    codemod_errors: int = 0  # files not read or parsed
    codemod_failures: int = 0  # files the codemods failed on (left unchanged)
    failed_sites: list[str] = field(default_factory=list)  # "file:line why": statements a rule failed at
    exit_status: Optional[int] = None  # of the migration run
    seconds: float = 0.0
    second_run_changes: Optional[int] = None
    sites_reported: int = 0
    todos_reported: int = 0


def _read(path: Path) -> Optional[str]:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None


def python_files(root: Path) -> Iterator[Path]:
    for directory, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d != "__pycache__")
        for name in sorted(files):
            if name.endswith(".py"):
                yield Path(directory) / name


def _not_compiling(python: str, files: list[Path]) -> set[str]:
    if not files:
        return set()
    script = (
        "import sys, json\nbad = []\n"
        "for p in sys.stdin.read().split('\\n'):\n"
        "    try:\n"
        "        compile(open(p, 'rb').read(), p, 'exec')\n"
        "    except (SyntaxError, ValueError):\n"
        "        bad.append(p)\n"
        "print(json.dumps(bad))\n"
    )
    done = subprocess.run(
        [python, "-c", script], input="\n".join(map(str, files)), capture_output=True, text=True, timeout=600
    )
    if done.returncode != 0:
        raise RuntimeError(f"{python} failed: {done.stderr[-500:]}")
    return set(json.loads(done.stdout))


def _migrate(copy: Path, check: bool = False) -> tuple[dict, float, int]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "CODEMODS_CACHE_DIR": str(copy.parent / "cache")}
    cmd = [sys.executable, "-m", "codemods.migrate", str(copy), "--json", "--no-progress", "--no-cache"]
    if check:
        cmd.append("--check")
    start = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
    seconds = time.perf_counter() - start
    lines = [l for l in done.stdout.splitlines() if l.startswith("{")]
    return (json.loads(lines[-1]) if lines else {}), seconds, done.returncode


def referee(tree: Path, names: LegacyNames, pythons: dict[str, str], keep: Optional[Path] = None) -> TreeResult:
    result = TreeResult(tree.name)
    work = Path(tempfile.mkdtemp(prefix="referee-"))
    copy = (keep / tree.name) if keep else work / tree.name
    if copy.exists():
        shutil.rmtree(copy)
    shutil.copytree(tree, copy, symlinks=True, ignore=shutil.ignore_patterns(".git", "__pycache__"))
    originals = {p.relative_to(copy): _read(p) for p in python_files(copy)}
    result.files = len(originals)
    summary, result.seconds, result.exit_status = _migrate(copy)
    result.codemod_errors = summary.get("parse_errors", 0)
    result.codemod_failures = summary.get("codemod_failures", 0)
    result.failed_sites = [
        f"{Path(f['path']).relative_to(copy)}:{f['line']} {f['why']}" for f in summary.get("failed_sites", [])
    ]
    result.sites_reported = sum(summary.get("sites_rewritten", {}).values())
    result.todos_reported = sum(summary.get("sites_todo", {}).values())
    advice: dict[Path, list[str]] = {}  # each file's TODOV1s, their full advice
    for todo in summary.get("todos", []):
        advice.setdefault(Path(todo["path"]).resolve().relative_to(copy.resolve()), []).extend(todo.get("advice", []))
    changed = []
    for rel, before in originals.items():
        if before is None or rel.as_posix().endswith(DEFINING_COPIES):
            continue  # (a tree's copy of a module defining the legacy APIs: never rewritten, no sites)
        after = _read(copy / rel)
        if after != before:
            changed.append(rel)
        old_sites = scan_source(before, names) or []
        new_sites = scan_source(after, names, original=before) if after is not None and old_sites else []
        new_sites = new_sites or []
        lines = (after or "").splitlines()
        old_by = Counter(s.family for s in old_sites)
        result.found.update(old_by)
        kept = Counter()
        for site in new_sites:
            kept[site.family] += 1
            if flagged(site, lines, advice.get(rel, ())):
                result.flagged[site.family] += 1
            else:
                result.missed[site.family] += 1
                result.missed_sites.append(f"{rel}:{site.line} {site.family} {site.text}")
        for family, count in old_by.items():
            result.rewritten[family] += max(0, count - kept[family])
    result.changed = len(changed)
    for label, python in pythons.items():
        before_bad = _not_compiling(python, [tree / rel for rel in changed])
        after_bad = _not_compiling(python, [copy / rel for rel in changed])
        result.compile_failures[label] = sorted(
            str(Path(p).relative_to(copy)) for p in after_bad if str(tree / Path(p).relative_to(copy)) not in before_bad
        )
    second, _, code = _migrate(copy, check=True)
    result.second_run_changes = second.get("files_changed")
    if not keep:
        shutil.rmtree(work, ignore_errors=True)
    return result


def _cell(result: TreeResult, counter: Counter) -> str:
    total = sum(counter.values())
    detail = ", ".join(f"{f} {counter[f]}" for f in FAMILIES if counter[f])
    return f"{total}" + (f" ({detail})" if detail else "")


def table(results: list[TreeResult], pythons: dict[str, str]) -> str:
    head = [
        "tree",
        "files",
        "changed",
        "legacy sites (scan)",
        "rewritten",
        "flagged TODOV1",
        "missed",
        "codemod failures (files/sites)",
        "exit",
        *[f"no longer compile {v}" for v in pythons],
        "second run changes",
        "time (s)",
    ]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in results:
        rows.append(
            "| "
            + " | ".join(
                [
                    r.tree,
                    str(r.files),
                    str(r.changed),
                    _cell(r, r.found),
                    _cell(r, r.rewritten),
                    _cell(r, r.flagged),
                    _cell(r, r.missed),
                    f"{r.codemod_failures}/{len(r.failed_sites)}",
                    str(r.exit_status),
                    *[str(len(r.compile_failures.get(v, []))) for v in pythons],
                    str(r.second_run_changes),
                    f"{r.seconds:.1f}",
                ]
            )
            + " |"
        )
    return "\n".join(rows)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trees", nargs="+", type=Path, help="directories of public code (never changed)")
    parser.add_argument("--missed", action="store_true", help="list every missed site")
    parser.add_argument("--keep", type=Path, default=None, help="keep the migrated copies in this directory")
    parser.add_argument("--json", type=Path, default=None, help="also write the results as JSON here")
    args = parser.parse_args(argv)
    pythons = {v: p for v, p in PYTHONS.items() if os.path.exists(p)}
    missing = sorted(set(PYTHONS) - set(pythons))
    if missing:
        sys.stderr.write(f"warning: no Python {', '.join(missing)} interpreter at {[PYTHONS[v] for v in missing]}\n")
    names = LegacyNames.installed()
    if args.keep:
        args.keep.mkdir(parents=True, exist_ok=True)
    results = []
    for tree in args.trees:
        if not tree.is_dir():
            sys.stderr.write(f"error: {tree} is not a directory\n")
            return 2
        results.append(referee(tree, names, pythons, args.keep))
        r = results[-1]
        sys.stderr.write(
            f"{r.tree}: {sum(r.found.values())} sites, {sum(r.missed.values())} missed, {r.seconds:.1f} s\n"
        )
    print(table(results, pythons))
    bad = False
    for r in results:
        for v, files in r.compile_failures.items():
            for f in files:
                bad = True
                print(f"{r.tree}: {f} no longer compiles on Python {v}")
        if r.codemod_failures or r.failed_sites or r.exit_status not in (0, None):
            bad = True
            print(
                f"{r.tree}: the migration exited {r.exit_status}; {r.codemod_failures} files failed, "
                f"{len(r.failed_sites)} sites failed"
            )
            for line in r.failed_sites:
                print(f"{r.tree}: failed site {line}")
        if r.second_run_changes:
            bad = True
            print(f"{r.tree}: a second run would change {r.second_run_changes} files")
        if args.missed:
            for line in r.missed_sites:
                print(f"{r.tree}: missed {line}")
    if args.json:
        args.json.write_text(
            json.dumps(
                [
                    {
                        **vars(r),
                        "found": dict(r.found),
                        "rewritten": dict(r.rewritten),
                        "flagged": dict(r.flagged),
                        "missed": dict(r.missed),
                    }
                    for r in results
                ],
                indent=1,
            )
        )
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
