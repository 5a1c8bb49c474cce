"""The codemods package split by role: a private engine (``codemods/_engine/``) behind the faces
(``codemods``, ``codemods.migrate``), and the rules (``codemods/rules/``), one module per codemod
command with its private helpers in underscore modules beside it. The engine reaches a rule only
through the pipeline's list of rules; a rule is usable on its own with ``python -m libcst.tool
codemod``."""

from __future__ import annotations

import ast
import importlib
import inspect
import os
import subprocess
import sys
from pathlib import Path

from libcst.codemod import CodemodCommand

import codemods
from codemods.rules.comm_to_torch import CommToTorchCommand

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "codemods"


def _commands_defined_in(module) -> list[type]:
    return [
        obj
        for obj in vars(module).values()
        if inspect.isclass(obj) and issubclass(obj, CodemodCommand) and obj.__module__ == module.__name__
    ]


def test_the_package_holds_the_faces_the_engine_and_the_rules_only():
    top = sorted(p.name for p in PACKAGE.iterdir() if p.name != "__pycache__")
    assert top == ["__init__.py", "_engine", "migrate.py", "rules"], top


def test_each_rule_module_is_one_codemod_command_and_each_command_is_a_rule_module():
    rules = sorted(p.stem for p in (PACKAGE / "rules").glob("*.py") if not p.name.startswith("_"))
    commands = {}
    for name in rules:
        defined = _commands_defined_in(importlib.import_module(f"codemods.rules.{name}"))
        assert len(defined) == 1, (name, defined)
        commands[name] = defined[0]
    assert set(commands.values()) == {*codemods.CODEMODS, CommToTorchCommand}
    for path in sorted((PACKAGE / "rules").glob("_*.py")) + sorted((PACKAGE / "_engine").glob("*.py")):
        module = importlib.import_module(
            ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        )
        # helpers and the engine define no command of their own (the engine: the rules' base class)
        expected = ["MigrationCommand"] if module.__name__ == "codemods._engine.base" else []
        assert [c.__name__ for c in _commands_defined_in(module)] == expected, path
    assert {c.__name__ for c in codemods.CODEMODS} - {
        "GridInternalCommand",
        "GridUsersCommand",
        "MpuInternalCommand",
    } <= set(codemods.__all__)


def _imported_modules(path: Path) -> list[str]:
    """The absolute names of the codemods modules ``path`` imports (at any depth of its code)."""
    package = ".".join(path.relative_to(ROOT).parent.parts)
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            base = package.rsplit(".", node.level - 1)[0] if node.level else ""
            module = ".".join(p for p in (base, node.module or "") if p)
            found += [module] + [f"{module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            found += [a.name for a in node.names]
    return [m for m in found if m.split(".")[0] == "codemods"]


def test_the_engine_reaches_the_rules_only_through_the_pipelines_list():
    reaching = {}
    for path in sorted((PACKAGE / "_engine").glob("*.py")):
        rules = sorted({m for m in _imported_modules(path) if m.startswith("codemods.rules")})
        if rules:
            reaching[path.name] = rules
    assert list(reaching) == ["pipeline.py"], reaching
    assert not any(m.startswith("codemods.rules._") for m in reaching["pipeline.py"]), reaching


def test_a_rule_imports_the_engine_and_helpers_only_not_another_rule():
    rules = {f"codemods.rules.{p.stem}" for p in (PACKAGE / "rules").glob("*.py") if not p.name.startswith("_")}
    crossing = {
        path.name: sorted(set(_imported_modules(path)) & rules - {f"codemods.rules.{path.stem}"})
        for path in sorted((PACKAGE / "rules").glob("*.py"))
    }
    assert not any(crossing.values()), crossing


def test_the_import_scan_reads_relative_imports():
    imported = _imported_modules(PACKAGE / "rules" / "groups_getters.py")
    assert "codemods._engine.base" in imported and "codemods.rules._hpz" in imported


def test_a_rule_runs_alone_under_libcsts_codemod_tool(tmp_path):
    target = tmp_path / "train.py"
    target.write_text("from deepspeed.utils import groups\n\n\ndef f():\n    return groups.get_data_parallel_group()\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "libcst.tool",
            "codemod",
            "-x",
            "--no-format",
            "--hide-progress",
            "codemods.rules.groups_getters.GroupsGettersCommand",
            str(target),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert target.read_text() == (
        "from deepspeed.utils import groups\nfrom mesh_core import current_mesh\n\n\n"
        'def f():\n    return current_mesh().get_group("dp")\n'
    )
