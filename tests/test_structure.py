"""One home per concern: the structure checks that keep the tree from growing a second copy.

Read from the source (``ast``) where the question is "how many definitions", so a copy anywhere in
``mesh_core`` / ``compat`` / ``codemods`` / ``examples`` / ``tools`` / ``bench`` is found.
"""
from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]
SOURCE_DIRS = ("mesh_core", "compat", "codemods", "examples", "tools", "bench")


def _definitions(name: str) -> list[str]:
    found = []
    for folder in SOURCE_DIRS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return found


def test_one_config_to_spec_path():
    """``spec_from_config`` is defined once; the shim's ``engine_spec`` is built on it."""
    assert _definitions("spec_from_config") == [_definitions("spec_from_config")[0]]
    assert _definitions("spec_from_config")[0].startswith("mesh_core/config.py:")
    tree = ast.parse((ROOT / "compat" / "engine_spec.py").read_text(encoding="utf-8"))
    engine_spec = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "engine_spec")
    calls = {n.func.id for n in ast.walk(engine_spec) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
    assert "spec_from_config" in calls
    assert not any(isinstance(n, ast.Attribute) and n.attr == "build" for n in ast.walk(tree)), (
        "compat.engine_spec builds a MeshSpec itself; it must go through mesh_core.config.spec_from_config"
    )
