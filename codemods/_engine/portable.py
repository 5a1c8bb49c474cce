"""Generated code must parse on every Python the project supports (3.10+).

Before 3.12 an f-string's replacement field cannot contain the f-string's own quote character, so a
rewrite that puts ``mesh.get_group("tp")`` inside ``f"..."`` is valid only from 3.12. The migration
rewrites the string literals inside the replacement fields of the f-strings a codemod wrote (never an
untouched one: the bytes outside rewritten sites stay as they were) to the other quote character, and
refuses a result that does not parse.
"""

from __future__ import annotations

import ast
import re
from typing import Optional

import libcst as cst

OLDEST_PYTHON = (3, 10)


def _quote(fstring: cst.FormattedString) -> str:
    return fstring.start.lstrip("rRfFbBuU")


def _closes(inner: str, outer: str) -> bool:
    """A string literal quoted ``inner`` ends an enclosing f-string quoted ``outer`` (< 3.12)."""
    return inner.startswith(outer) if len(outer) == 3 else inner[0] == outer


class _RequoteInFStrings(cst.CSTTransformer):
    """String literals inside an f-string's replacement fields whose quotes would end an enclosing
    f-string before Python 3.12 get the other quote character (when their text allows it).
    F-strings in ``untouched`` (node identities of the parsed source) are left as they are."""

    def __init__(self, untouched: frozenset = frozenset()) -> None:
        self._quotes: list[str] = []
        self._untouched = untouched
        self.changed = False

    def visit_FormattedString(self, node: cst.FormattedString) -> Optional[bool]:
        self._quotes.append(_quote(node))
        return id(node) not in self._untouched

    def leave_FormattedString(self, original_node, updated_node):
        self._quotes.pop()
        return updated_node

    def leave_SimpleString(self, original_node: cst.SimpleString, updated_node: cst.SimpleString):
        if not self._quotes:
            return updated_node
        prefix = updated_node.prefix
        body = updated_node.value[len(prefix) :]
        quote = updated_node.quote
        if len(quote) != 1 or not any(_closes(quote, outer) for outer in self._quotes):
            return updated_node
        other = "'" if quote == '"' else '"'
        inner = body[1:-1]
        if any(_closes(other, outer) for outer in self._quotes) or other in inner or "\\" in inner:
            return updated_node  # cannot requote; the parse check below refuses the result
        self.changed = True
        return updated_node.with_changes(value=f"{prefix}{other}{inner}{other}")


_FSTRING_START = re.compile(r"(?<![\w])[rRbBuU]?[fF][rR]?['\"]")


def fstring_ids(nodes) -> frozenset:
    """The identities of the f-strings among ``nodes`` (the parsed source's, before any rewrite)."""
    return frozenset(id(n) for n in nodes if isinstance(n, cst.FormattedString))


def requote(tree: cst.Module, code: str, untouched: frozenset = frozenset()) -> cst.Module:
    """``tree`` (whose text is ``code``) with string literals in f-string replacement fields
    requoted for Python < 3.12, except inside the f-strings ``untouched`` (see :func:`fstring_ids`)."""
    if not _FSTRING_START.search(code):
        return tree
    return tree.visit(_RequoteInFStrings(untouched))


def parse_error(code: str) -> Optional[str]:
    """Why ``code`` does not parse as Python 3.10 syntax (on this interpreter), or None."""
    try:
        ast.parse(code, feature_version=OLDEST_PYTHON)
    except SyntaxError as err:
        return f"{err.msg} (line {err.lineno})"
    return None
