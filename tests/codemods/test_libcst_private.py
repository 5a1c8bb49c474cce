"""The private libcst names the codemods' fast paths use: all in ``codemods._engine.libcst_private``, all
present in the libcst installed, and nowhere else imported.

CI runs this file and the codemods tests on the lowest libcst pyproject allows too
(``.ci/run``; by hand: docs/codemods_safety.md "libcst range").
"""
from __future__ import annotations

import ast
import pathlib

import libcst as cst
from libcst.matchers import MatcherDecoratableTransformer

from codemods._engine import libcst_private

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_every_private_name_resolves_on_this_libcst():
    for name in libcst_private.__all__:
        assert getattr(libcst_private, name) is not None, name
    assert libcst_private.top_imports_gatherer() is not None
    assert callable(libcst_private.gather_matchers)
    assert isinstance(libcst_private.MODULES_IGNORED_BY_DEFAULT, (set, frozenset, list, tuple))
    assert hasattr(cst.Name, libcst_private.VISIT_AND_REPLACE_CHILDREN)
    transformer = MatcherDecoratableTransformer()
    for attr in (libcst_private.EXTRA_VISIT_FUNCS, libcst_private.EXTRA_LEAVE_FUNCS):
        assert hasattr(transformer, attr), attr
    assert issubclass(cst.CSTVisitor, libcst_private.CSTTypedBaseFunctions)
    assert libcst_private.LazyValue(lambda: 3)() == 3


def _private_libcst_imports(path: pathlib.Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "libcst":
            if any(part.startswith("_") for part in node.module.split(".")) or any(
                a.name.startswith("_") for a in node.names
            ):
                found.append(f"{path.name}:{node.lineno}")
        elif isinstance(node, ast.Import):
            found += [f"{path.name}:{node.lineno}" for a in node.names
                      if a.name.split(".")[0] == "libcst" and any(p.startswith("_") for p in a.name.split("."))]
    return found


def test_no_other_codemods_module_imports_a_private_libcst_name():
    bad = [hit for path in sorted((ROOT / "codemods").rglob("*.py")) if path.name != "libcst_private.py"
           for hit in _private_libcst_imports(path)]
    assert not bad, f"private libcst names imported outside codemods/_engine/libcst_private.py: {bad}"


def test_the_libcst_range_is_declared_with_both_ends():
    import re

    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    match = re.search(r'"libcst>=([0-9.]+),<([0-9.]+)"', text)
    assert match, "pyproject must bound libcst on both sides, e.g. \"libcst>=1.2,<1.10\""
