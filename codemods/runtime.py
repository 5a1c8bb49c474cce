"""Migrated scripts that need the mesh runtime activate it.

DeepSpeed 0.19.8 neither reads the config's ``"mesh"`` section nor gives engines a mesh: without
``compat.install()`` a migrated ``engine.mesh_device`` is None and a moved ``mpu=`` is lost. A file
whose migration relies on the engine's mesh (``<engine>.mesh_device`` after
``deepspeed.initialize``, or ``mpu=`` / ``mesh_param=`` moved into the config) gets
``import compat`` and ``compat.install()`` after its imports, before any engine is built.
"""
from __future__ import annotations

import re
from collections import Counter
from typing import Optional

import libcst as cst

RUNTIME_KINDS = ("initialize mpu", "initialize mesh_param")
_ENGINE_MESH = re.compile(r"\b(?!self\b)[A-Za-z_]\w*\.mesh_device\b")
INSTALL = "compat.install()"


def needs_runtime(source: str, code: str, sites: Counter) -> bool:
    if INSTALL in code or "initialize" not in code:
        return False
    if any(sites.get(kind) for kind in RUNTIME_KINDS):
        return True
    return len(_ENGINE_MESH.findall(code)) > len(_ENGINE_MESH.findall(source))


def add_runtime(tree: cst.Module) -> Optional[cst.Module]:
    """``tree`` with ``import compat`` / ``compat.install()`` after its leading imports."""
    body = list(tree.body)
    index = 0
    for i, statement in enumerate(body):
        if isinstance(statement, cst.SimpleStatementLine) and all(
            isinstance(s, (cst.Import, cst.ImportFrom)) for s in statement.body
        ):
            index = i + 1
        elif i == 0 and isinstance(statement, cst.SimpleStatementLine) and isinstance(
            statement.body[0], cst.Expr
        ) and isinstance(statement.body[0].value, (cst.SimpleString, cst.ConcatenatedString)):
            index = 1  # the docstring
        else:
            break
    lines = [
        cst.parse_statement("import compat\n"),
        cst.parse_statement(f"{INSTALL}  # the mesh runtime: deepspeed.initialize reads the config's \"mesh\" section\n"),
    ]
    return tree.with_changes(body=[*body[:index], *lines, *body[index:]])
