"""Every private libcst name the codemods' fast paths rely on, in one place.

The speed engine (:mod:`codemods.walk`, :mod:`codemods.metadata`) reads libcst internals that are not
part of its public API: the typed visitor stubs, the matcher decorators' attributes, the lazy
metadata value, the unused-import gatherer's default ignore list and the top-import gatherer
``AddImportsVisitor`` runs. They are imported here only, so a libcst release that moves one fails
here, at import, with the name (``tests/codemods/test_libcst_private.py`` imports each; the range of
libcst releases this holds for is pyproject's ``libcst`` requirement, tested at both ends, see
docs/codemods_safety.md). Every user of a private name checks what it relies on where libcst allows
(``codemods.metadata`` falls back to libcst's own paths when a check fails).
"""
from __future__ import annotations

from typing import Optional

from libcst._metadata_dependent import LazyValue
from libcst._typed_visitor import CSTTypedBaseFunctions
from libcst.codemod.visitors._gather_unused_imports import MODULES_IGNORED_BY_DEFAULT
from libcst.matchers._decorators import (
    CONSTRUCTED_LEAVE_MATCHER_ATTR,
    CONSTRUCTED_VISIT_MATCHER_ATTR,
    VISIT_NEGATIVE_MATCHER_ATTR,
    VISIT_POSITIVE_MATCHER_ATTR,
)
from libcst.matchers._visitors import _gather_matchers as gather_matchers

# private attributes of public libcst classes, read by name
VISIT_AND_REPLACE_CHILDREN = "_visit_and_replace_children"  # CSTNode: the children a node visits
EXTRA_VISIT_FUNCS = "_extra_visit_funcs"  # MatcherDecoratableTransformer: decorated visit hooks
EXTRA_LEAVE_FUNCS = "_extra_leave_funcs"  # MatcherDecoratableTransformer: decorated leave hooks


def top_imports_gatherer() -> Optional[type]:
    """The visitor ``AddImportsVisitor`` runs to find the top-of-module imports, or None where this
    libcst has none by that name."""
    try:
        from libcst.codemod.visitors._add_imports import _GatherTopImportsBeforeStatements
    except ImportError:
        return None
    return _GatherTopImportsBeforeStatements


__all__ = [
    "CONSTRUCTED_LEAVE_MATCHER_ATTR",
    "CONSTRUCTED_VISIT_MATCHER_ATTR",
    "CSTTypedBaseFunctions",
    "EXTRA_LEAVE_FUNCS",
    "EXTRA_VISIT_FUNCS",
    "LazyValue",
    "MODULES_IGNORED_BY_DEFAULT",
    "VISIT_AND_REPLACE_CHILDREN",
    "VISIT_NEGATIVE_MATCHER_ATTR",
    "VISIT_POSITIVE_MATCHER_ATTR",
    "gather_matchers",
    "top_imports_gatherer",
]
