"""Move the repo into its package layout (idempotent; run from anywhere inside the repo).

- ``mesh_core/``: the core stays at the top; DeepSpeed's process-wide roles go to ``mesh_core/roles/``
  (:data:`ROLES`), the command line and pictures to ``mesh_core/cli/`` (:data:`CLI`). A module this
  script does not name stays in the core (it is listed, so it can be placed by hand).
- ``tests/``: every ``tests/test_*.py`` at the top goes to ``tests/<home>/`` by :func:`test_home`
  (``e2e``, ``codemods``, ``compat``, ``mesh_core``; the repo-wide checks stay at the top); shared
  helpers (``fakepg.py``, ``spawn.py``, ``codemod_scripts.py``, ``conftest.py``), ``fixtures/``,
  ``e2e/`` scripts and ``upstream/`` stay where they are, so ``from fakepg import ...`` and every
  path to them keep working; a moved test's ``__file__``-relative paths get one more ``parent``.
- Imports are rewritten everywhere (``.py`` and ``.md``; relative imports inside ``mesh_core``
  re-derived from the new places), test paths (``tests/test_x.py``) in text files too, then the
  files are ``git mv``-ed. Every name ``mesh_core/__init__`` exports keeps working from ``mesh_core``.
- Self-check at the end: every module imports, ``python -m mesh_core show`` runs, ``pytest
  --collect-only`` collects as many tests as before, the import-cycle test passes, and the codemods'
  output on a deepspeed subset (``tools/codemods_digest.py``) is byte-identical before and after.

Usage: ``python tools/restructure.py`` (``--dry-run``: print the plan only; ``--no-check``: skip the
self-check). Run it on a clean tree; it changes the working tree and the index, it does not commit.
"""
from __future__ import annotations

import argparse
import ast
import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parents[1]
PYTHON = sys.executable

# old module (under mesh_core/) -> new module path (under mesh_core/)
ROLES = {
    "hpz": "roles.hpz",
    "tensor_parallel": "roles.tensor_parallel",
    "node_groups": "roles.node_groups",
    "process_experts": "roles.process_experts",
    "process_state": "roles.state",
    "mpu_mesh": "roles.mpu_mesh",
    "from_groups": "roles.from_groups",
    "pipe_topology": "roles.pipe_topology",
    "current": "roles.current",
    "default": "roles.default",
    "legacy_state": "roles.legacy_state",  # issue 22a: what migrated code reads under legacy DeepSpeed's state
}
CLI = {"cli": "cli.commands", "render": "cli.render", "legacy_counts": "cli.legacy_counts"}
CORE_KNOWN = {
    "__init__", "__main__", "spec", "layout", "registry", "device_mesh", "consistency", "plan", "config",
    "transfer", "transfer_agree", "transfer_buckets", "transfer_engines", "rendezvous",
}

ROLES_INIT = '''"""DeepSpeed's process-wide roles on the mesh: what migrated DeepSpeed code calls where legacy read
``deepspeed.utils.groups`` (hpZ, AutoTP, node all-to-all, the expert table, the mpu adapters, the
current / default mesh). Their state has one owner, :data:`mesh_core.roles.state.PROCESS_ROLES`.
Import the public names from :mod:`mesh_core`; this package imports nothing on its own."""
'''
CLI_INIT = '''"""The ``mesh`` command line (``python -m mesh_core show``) and its pictures; see :mod:`.commands`."""
from .commands import main

__all__ = ["main"]
'''

# tests: repo-wide checks stay at tests/; explicit homes where the rule would guess wrong
TEST_OVERRIDES = {"test_import_cycles.py": "", "test_docs.py": "", "test_upstream_runner.py": "compat"}
TEST_HELPERS = {"conftest.py", "fakepg.py", "spawn.py", "codemod_scripts.py"}
CONFTEST_MARK = "# tests/<package>/ folders (tools/restructure.py)"
CONFTEST_BLOCK = f"""
{CONFTEST_MARK}: a test may import a test module of another folder (``from test_layout import specs``)
for _folder in ("mesh_core", "compat", "codemods", "e2e"):
    sys.path.insert(1, os.path.join(os.path.dirname(__file__), _folder))
"""
TEXT_SUFFIXES = {".py", ".md", ".toml", ".cfg", ".ini", ".yml", ".yaml", ".txt", ".sh"}


def log(message: str) -> None:
    print(message, flush=True)


# --- the plan ---------------------------------------------------------------------------------
@dataclass
class Plan:
    modules: dict[str, str] = field(default_factory=dict)  # old dotted -> new dotted (mesh_core.*)
    moves: dict[Path, Path] = field(default_factory=dict)  # old file -> new file (repo-relative)
    tests: dict[str, str] = field(default_factory=dict)  # old test file name -> new dir ("" = top)
    unplaced: list[str] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not self.moves


def _imported_names(path: Path) -> set[str]:
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except SyntaxError:
        return set()
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


def _package_modules(root: Path) -> dict[str, str]:
    """``{module file stem: package}`` for mesh_core (roles and cli included), compat, codemods."""
    found: dict[str, str] = {}
    for package in ("mesh_core", "compat", "codemods"):
        for p in sorted((root / package).rglob("*.py")):
            found.setdefault(p.stem, package)
    for old, new in {**ROLES, **CLI}.items():
        found.setdefault(old, "mesh_core")
        found.setdefault(new.rpartition(".")[2], "mesh_core")
    return found


def test_home(path: Path, modules: dict[str, str]) -> str:
    """The folder under tests/ a top-level test file belongs in (``""``: stays at the top).

    In order: :data:`TEST_OVERRIDES`; ``test_e2e_*`` or a test that puts ``tests/e2e`` on sys.path
    (it drives the end-to-end scripts) -> ``e2e``; a ``test_<package>`` prefix -> that package;
    ``test_<module>[_gloo].py`` naming a module of one package -> that package; else the package it
    imports (``codemods`` or the ``codemod_scripts`` helper, then ``compat``, then ``mesh_core``)."""
    name = path.name
    if name in TEST_OVERRIDES:
        return TEST_OVERRIDES[name]
    text = path.read_text(encoding="utf-8")
    if name.startswith("test_e2e_") or re.search(r"""dirname\(__file__\),\s*["']e2e["']""", text):
        return "e2e"
    for package in ("codemods", "compat", "mesh_core"):
        if name.startswith(f"test_{package}"):
            return package
    stem = path.stem[len("test_"):]
    for candidate in (stem, re.sub(r"_gloo$", "", stem)):
        if candidate in modules:
            return modules[candidate]
    tops = {n.split(".")[0] for n in _imported_names(path)}
    if tops & {"codemods", "codemod_scripts"}:
        return "codemods"
    if "compat" in tops:
        return "compat"
    return "mesh_core"


def make_plan(root: Path) -> Plan:
    plan = Plan()
    pkg = root / "mesh_core"
    for old, new in {**ROLES, **CLI}.items():
        src = pkg / f"{old}.py"
        if src.exists():  # only modules that are there: a text naming another stays as it is
            plan.modules[f"mesh_core.{old}"] = f"mesh_core.{new}"
            plan.moves[src.relative_to(root)] = (pkg / (new.replace(".", "/") + ".py")).relative_to(root)
    for path in sorted(pkg.glob("*.py")):
        if path.stem not in CORE_KNOWN and path.stem not in ROLES and path.stem not in CLI:
            plan.unplaced.append(path.name)
    tests = root / "tests"
    modules = _package_modules(root)
    for path in sorted(tests.glob("test_*.py")):
        home = test_home(path, modules)
        plan.tests[path.name] = home
        if home:
            plan.moves[path.relative_to(root)] = Path("tests") / home / path.name
    return plan


# --- rewriting --------------------------------------------------------------------------------
def _text_files(root: Path) -> list[Path]:
    """The tracked text files to rewrite (``git ls-files``; codemod fixtures are data and stay)."""
    listed = run(["git", "ls-files", "-z"]).stdout.split("\0")
    out = []
    for name in listed:
        rel = Path(name)
        if not name or rel.parts[:2] == ("tests", "fixtures") or rel == Path("tools/restructure.py"):
            continue
        if rel.suffix in TEXT_SUFFIXES or rel.parts[0] == ".ci":
            path = root / rel
            if path.is_file():
                out.append(path)
    return out


TEXT_KEEP = {"mesh_core.cli"}  # the cli package keeps that name (its __init__ exports main)


def dotted_pattern(modules: dict[str, str]) -> Optional[re.Pattern]:
    """``mesh_core.<moved>`` not followed by an identifier character or ``(`` (a call is the
    top-level function of the same name, e.g. ``mesh_core.process_experts()``); names in
    :data:`TEXT_KEEP` are left as they are."""
    olds = sorted((m.split(".", 1)[1] for m in modules if m not in TEXT_KEEP), key=len, reverse=True)
    if not olds:
        return None
    return re.compile(r"(?<![\w.])mesh_core\.(" + "|".join(map(re.escape, olds)) + r")(?![\w(])")


def rewrite_dotted(text: str, modules: dict[str, str], pattern: Optional[re.Pattern]) -> str:
    if pattern is None:
        return text
    return pattern.sub(lambda m: modules[f"mesh_core.{m.group(1)}"], text)


def _module_of(path: Path) -> str:
    parts = list(path.with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _relative(from_module: str, is_package: bool, target: str) -> str:
    """A relative spec (``..spec``) from module ``from_module`` to ``target``."""
    here = from_module.split(".") if is_package else from_module.split(".")[:-1]
    there = target.split(".")
    common = 0
    while common < min(len(here), len(there)) and here[common] == there[common]:
        common += 1
    return "." * (len(here) - common + 1) + ".".join(there[common:])


def rewrite_relative_imports(text: str, old_module: str, new_module: str, is_package: bool,
                             modules: dict[str, str], known: set[str]) -> tuple[str, list[str]]:
    """Re-derive every relative import of a mesh_core module for its new place (and its targets')."""
    tree = ast.parse(text)
    lines = text.splitlines(keepends=True)
    problems: list[str] = []
    edits = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.ImportFrom) or not node.level:
            continue
        here = old_module.split(".") if is_package else old_module.split(".")[:-1]
        base_parts = here[: len(here) - node.level + 1]
        base = ".".join(base_parts + ([node.module] if node.module else []))
        subs = [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in known]
        if subs and len(subs) != len(node.names):
            problems.append(f"{old_module}:{node.lineno}: mixes submodules and names; split it by hand")
            continue
        if subs:
            parents = {modules.get(s, s).rpartition(".")[0] for s in subs}
            if len(parents) != 1:
                problems.append(f"{old_module}:{node.lineno}: imports submodules that move apart; split it by hand")
                continue
            new_base = parents.pop()
        else:
            new_base = modules.get(base, base)
        spec = _relative(new_module, is_package, new_base)
        old_spec = "." * node.level + (node.module or "")
        if spec != old_spec:
            edits.append((node.lineno, node.col_offset, old_spec, spec))
    for lineno, col, old_spec, spec in sorted(edits, reverse=True):
        line = lines[lineno - 1]
        head, tail = line[:col], line[col:]
        new_tail, n = re.subn(r"^from\s+" + re.escape(old_spec) + r"(?=\s+import\b)", "from " + spec, tail)
        if n != 1:
            problems.append(f"{old_module}:{lineno}: could not rewrite {old_spec!r}")
            continue
        lines[lineno - 1] = head + new_tail
    return "".join(lines), problems


_FILE_DIR_FIXES = [  # the directory of this file -> the directory above it (tests/)
    (re.compile(r"Path\(__file__\)\.resolve\(\)\.parents\[(\d+)\]"), lambda m: f"Path(__file__).resolve().parents[{int(m.group(1)) + 1}]"),
    (re.compile(r"Path\(__file__\)\.resolve\(\)\.parent\b"), lambda m: "Path(__file__).resolve().parent.parent"),
    (re.compile(r"Path\(__file__\)\.parent\b"), lambda m: "Path(__file__).parent.parent"),
    (re.compile(r"os\.path\.dirname\(os\.path\.abspath\(__file__\)\)"), lambda m: "os.path.dirname(os.path.dirname(os.path.abspath(__file__)))"),
    (re.compile(r"os\.path\.dirname\(__file__\)"), lambda m: "os.path.dirname(os.path.dirname(__file__))"),
]


def fix_file_dirs(text: str) -> str:
    """One pass per pattern, each occurrence rewritten once (the patterns do not overlap: the
    ``abspath`` form is matched before the bare one, and their outputs match no later pattern's
    input at the same place)."""
    spans: list[tuple[int, int, str]] = []
    for pattern, repl in _FILE_DIR_FIXES:
        for m in pattern.finditer(text):
            if any(s < m.end() and m.start() < e for s, e, _ in spans):
                continue
            spans.append((m.start(), m.end(), repl(m)))
    for start, end, new in sorted(spans, reverse=True):
        text = text[:start] + new + text[end:]
    return text


def rewrite_module_paths(text: str, moves: dict[Path, Path]) -> str:
    """File paths of moved mesh_core modules (``mesh_core/hpz.py``) in prose and comments."""
    moved = {str(old): str(new) for old, new in moves.items() if old.parts[0] == "mesh_core"}
    if not moved:
        return text
    pattern = re.compile(r"(?<![\w/.])(" + "|".join(map(re.escape, sorted(moved, key=len, reverse=True))) + r")(?![\w])")
    return pattern.sub(lambda m: moved[m.group(1)], text)


def rewrite_test_paths(text: str, tests: dict[str, str]) -> str:
    moved = {n: h for n, h in tests.items() if h}
    if not moved:
        return text
    pattern = re.compile(r"(?<![\w/])tests/(" + "|".join(map(re.escape, sorted(moved, key=len, reverse=True))) + r")\b")
    return pattern.sub(lambda m: f"tests/{moved[m.group(1)]}/{m.group(1)}", text)


# --- running it -------------------------------------------------------------------------------
def run(cmd: list[str], *, check: bool = True, timeout: int = 1800, env: Optional[dict] = None) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), **(env or {})}
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=full_env)
    if check and proc.returncode != 0:
        raise SystemExit(f"failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
    return proc


def collected(tests_dir: str = "tests") -> int:
    """How many tests ``pytest --collect-only`` selects (fails on a collection error)."""
    proc = run([PYTHON, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", tests_dir], check=False)
    lines = proc.stdout.strip().splitlines()
    last = lines[-1] if lines else ""
    m = re.match(r"(\d+)(?:/\d+)? tests? collected", last)
    if proc.returncode != 0 or m is None or "error" in last:
        raise SystemExit(f"pytest --collect-only failed ({proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-2000:]}")
    return int(m.group(1))


def codemods_digest() -> dict:
    tool = ROOT / "tools" / "codemods_digest.py"
    if not tool.exists():
        return {}
    return json.loads(run([PYTHON, str(tool)]).stdout)


def apply(plan: Plan, root: Path) -> list[str]:
    """Rewrite the files' text, then ``git mv`` them; returns the problems that need a hand."""
    problems: list[str] = []
    pattern = dotted_pattern(plan.modules)
    known = {_module_of(p.relative_to(root)) for p in (root / "mesh_core").rglob("*.py")}
    moves = plan.moves
    for path in _text_files(root):
        rel = path.relative_to(root)
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        new = text
        if rel.parts[0] == "mesh_core" and rel.suffix == ".py":
            old_module = _module_of(rel)
            new_module = _module_of(moves.get(rel, rel))
            new, found = rewrite_relative_imports(new, old_module, new_module, rel.name == "__init__.py", plan.modules, known)
            problems += found
        new = rewrite_dotted(new, plan.modules, pattern)
        new = rewrite_test_paths(new, plan.tests)
        new = rewrite_module_paths(new, moves)
        if rel in moves and rel.parts[0] == "tests" and len(moves[rel].parts) > len(rel.parts):
            new = fix_file_dirs(new)
        if new != text:
            path.write_text(new, encoding="utf-8")
            log(f"  rewrote {rel}")
    for old, new in moves.items():
        (root / new).parent.mkdir(parents=True, exist_ok=True)
        run(["git", "mv", str(old), str(new)])
        log(f"  git mv {old} {new}")
    conftest = root / "tests" / "conftest.py"
    text = conftest.read_text(encoding="utf-8")
    if CONFTEST_MARK not in text:
        anchor = "sys.path.insert(0, os.path.dirname(__file__))\n"
        if anchor not in text:
            problems.append("tests/conftest.py: no tests/ sys.path line to put the folders after; add CONFTEST_BLOCK by hand")
        else:
            conftest.write_text(text.replace(anchor, anchor + CONFTEST_BLOCK, 1), encoding="utf-8")
            log("  tests/conftest.py: test folders on sys.path")
    for init, body in ((root / "mesh_core/roles/__init__.py", ROLES_INIT), (root / "mesh_core/cli/__init__.py", CLI_INIT)):
        if init.parent.exists() and not init.exists():
            init.write_text(body, encoding="utf-8")
            run(["git", "add", str(init.relative_to(root))])
            log(f"  wrote {init.relative_to(root)}")
    return problems


def check_test_imports(root: Path) -> list[str]:
    """Tests that import a test module of another folder (``from test_mpu_mesh import ...``)."""
    where = {p.stem: p.parent for p in (root / "tests").rglob("test_*.py") if "fixtures" not in p.parts}
    bad = []
    for stem, folder in where.items():
        for name in _imported_names(folder / f"{stem}.py"):
            if name in where and where[name] != folder:
                bad.append(f"{folder.relative_to(root)}/{stem}.py imports {name} from {where[name].relative_to(root)}")
    return bad


def self_check(before_digest: dict, before_count: Optional[int]) -> None:
    log("self-check:")
    modules = sorted(_module_of(p.relative_to(ROOT)) for pkg in ("mesh_core", "compat", "codemods") for p in (ROOT / pkg).rglob("*.py"))
    code = "import importlib, sys\nfor m in sys.argv[1:]:\n    importlib.import_module(m)\nprint(len(sys.argv) - 1)"
    log(f"  import every module: {run([PYTHON, '-c', code, *modules]).stdout.strip()} imported")
    show = run([PYTHON, "-m", "mesh_core", "show", "--world", "8", "--tp", "2"], check=False)
    if show.returncode != 0:
        show = run([PYTHON, "-m", "mesh_core", "show"])
    log(f"  python -m mesh_core show: ok ({len(show.stdout.splitlines())} lines)")
    for line in check_test_imports(ROOT):  # works: conftest puts every test folder on sys.path
        log(f"  note: {line}")
    count = collected()
    log(f"  pytest --collect-only: {count} tests" + ("" if before_count is None else f" (before: {before_count})"))
    if before_count is not None and count != before_count:
        raise SystemExit(f"collected {count} tests, {before_count} before the move")
    cycles = [p for p in (ROOT / "tests").rglob("test_import_cycles.py")]
    if cycles:
        run([PYTHON, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(cycles[0])])
        log("  import-cycle test: passed")
    if before_digest:
        after = codemods_digest()
        if after != before_digest:
            raise SystemExit(f"the codemods' output changed: {sorted(k for k in after if after[k] != before_digest.get(k))}")
        log(f"  codemods output on the deepspeed subset: byte-identical ({len(after)} files)")


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="print the plan, change nothing")
    parser.add_argument("--no-check", action="store_true", help="skip the self-check")
    args = parser.parse_args(argv)
    plan = make_plan(ROOT)
    log("plan:")
    for old, new in plan.moves.items():
        log(f"  {old} -> {new}")
    for name in plan.unplaced:
        log(f"  NOTE mesh_core/{name}: not named by this script, stays in the core (move it by hand if it is a role or CLI)")
    if args.dry_run:
        return 0
    if plan.empty:
        log("nothing to move (already restructured)")
    else:
        dirty = run(["git", "status", "--porcelain", "--untracked-files=no"]).stdout.strip()
        if dirty:
            raise SystemExit(f"the tree has uncommitted changes; commit or stash them first:\n{dirty}")
    before_digest = {} if args.no_check or plan.empty else codemods_digest()
    before_count = None if args.no_check or plan.empty else collected()
    if not plan.empty:
        log("applying:")
        problems = apply(plan, ROOT)
        for p in problems:
            log(f"  FIX BY HAND {p}")
    if not args.no_check:
        self_check(before_digest, before_count)
    log("done: review `git status` / `git diff --stat -M`, then commit")
    return 0


if __name__ == "__main__":
    sys.exit(main())
