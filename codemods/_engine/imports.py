"""Import statements of a libcst tree, found without visiting expressions (the base of the
commands and of the lazy metadata; it depends on neither)."""

from __future__ import annotations

from typing import Union

import libcst as cst

_BLOCKS = ("body", "handlers", "orelse", "finalbody", "cases")


def import_statements(tree: cst.CSTNode) -> list[Union[cst.Import, cst.ImportFrom]]:
    """Every ``import`` / ``from ... import`` statement in ``tree``, in source order, found through
    statement blocks only (an import is a statement), without visiting expressions."""
    found: list[Union[cst.Import, cst.ImportFrom]] = []

    def walk(node: cst.CSTNode) -> None:
        if isinstance(node, (cst.Import, cst.ImportFrom)):
            found.append(node)
            return
        if isinstance(node, (cst.BaseSmallStatement, cst.BaseExpression)):
            return
        for name in _BLOCKS:
            value = getattr(node, name, None)
            if isinstance(value, cst.CSTNode):
                walk(value)
            elif isinstance(value, (tuple, list)):
                for child in value:
                    if isinstance(child, cst.CSTNode):
                        walk(child)

    walk(tree)
    return found


def import_aliases(tree: cst.CSTNode) -> dict[str, str]:
    """``{alias: last part of the imported name}`` of every ``import ... as alias`` in ``tree``
    (later imports win; the same as over ``find_all(tree, cst.ImportAlias)`` in source order, but
    only statement blocks are walked)."""
    aliases: dict[str, str] = {}
    for statement in import_statements(tree):
        if isinstance(statement.names, cst.ImportStar):
            continue
        for alias in statement.names:
            if alias.asname is not None and isinstance(alias.asname.name, cst.Name):
                aliases[alias.asname.name.value] = alias.evaluated_name.rpartition(".")[2]
    return aliases
