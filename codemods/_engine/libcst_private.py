"""Every private libcst name the codemods rely on, in one place.

The speed engine (:mod:`~codemods._engine.walk`, :mod:`~codemods._engine.metadata`,
:class:`~codemods._engine.base.MigrationCommand`) reads libcst internals that are not part of its
public API: the typed visitor stubs, the matcher decorators' attributes, the lazy metadata value,
the unused-import gatherer's default ignore list and the top-import gatherer ``AddImportsVisitor``
runs (imported here), a metadata wrapper's store of resolved providers and a provider's computed
values (:func:`stored_metadata`, :func:`computed_metadata`), the two ``Codemod`` /
``CodemodCommand`` methods the engine overrides (:class:`MetadataReferenceHook`,
:class:`TransformRunHook`) and ``RemoveImportsVisitor``'s gathered unused imports
(:func:`set_unused_imports`). Nothing else in ``codemods`` names a private libcst name, so a libcst
release that moves one fails here, with the name: ``tests/codemods/test_libcst_private.py`` checks
each one's behaviour on the libcst installed and scans every other module for private libcst names;
the range of libcst releases this holds for is pyproject's ``libcst`` requirement, tested at both
ends (docs/codemods_safety.md). Every user of a private name checks what it relies on where libcst
allows (``codemods._engine.metadata`` falls back to libcst's own paths when a check fails).
"""

from __future__ import annotations

from types import MappingProxyType
from typing import ContextManager, Mapping, MutableMapping, Optional

import libcst as cst
from libcst._metadata_dependent import LazyValue
from libcst._typed_visitor import CSTTypedBaseFunctions
from libcst.codemod.visitors import RemoveImportsVisitor
from libcst.codemod.visitors._gather_unused_imports import MODULES_IGNORED_BY_DEFAULT
from libcst.matchers._decorators import (
    CONSTRUCTED_LEAVE_MATCHER_ATTR,
    CONSTRUCTED_VISIT_MATCHER_ATTR,
    VISIT_NEGATIVE_MATCHER_ATTR,
    VISIT_POSITIVE_MATCHER_ATTR,
)
from libcst.matchers._visitors import _gather_matchers as gather_matchers
from libcst.metadata import BaseMetadataProvider, MetadataWrapper

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


def stored_metadata(wrapper: MetadataWrapper) -> MutableMapping:
    """``wrapper``'s store of resolved metadata, ``{provider class: {node: value}}``
    (``MetadataWrapper._metadata``): ``resolve`` / ``resolve_many`` (and so a visitor's
    ``self.metadata``) return what is stored there without computing it, and compute and store
    what is not."""
    return wrapper._metadata


def computed_metadata(provider: BaseMetadataProvider) -> Mapping:
    """The ``{node: value}`` that ``provider`` has set (``BaseMetadataProvider._computed``), read-only
    and as libcst's batched resolution stores it."""
    return MappingProxyType(dict(provider._computed))


class MetadataReferenceHook:
    """Mixin for a libcst ``Codemod``: ``transform_module`` enters libcst's private context manager
    ``_handle_metadata_reference(module)`` (it makes the metadata wrapper, resolves the codemod's
    dependencies on it and yields the tree to transform); here that is :meth:`metadata_reference`."""

    def _handle_metadata_reference(self, module: cst.Module) -> ContextManager[cst.Module]:
        return self.metadata_reference(module)

    def metadata_reference(self, module: cst.Module) -> ContextManager[cst.Module]:
        """The tree ``transform_module`` transforms, with the codemod's metadata (default: libcst's)."""
        return self.libcst_metadata_reference(module)

    def libcst_metadata_reference(self, module: cst.Module) -> ContextManager[cst.Module]:
        """libcst's own :meth:`metadata_reference`."""
        return super()._handle_metadata_reference(module)  # type: ignore[misc]


class TransformRunHook:
    """Mixin for a libcst ``CodemodCommand``: its ``transform_module`` runs each pass it chains after
    the command (``AddImportsVisitor``, ``RemoveImportsVisitor``) through libcst's private
    ``_instantiate_and_run(transform, tree)``; here that is :meth:`run_transform`."""

    def _instantiate_and_run(self, transform: type, tree: cst.Module) -> cst.Module:
        return self.run_transform(transform, tree)

    def run_transform(self, transform: type, tree: cst.Module) -> cst.Module:
        """``transform`` (a codemod class) made with this command's context and run on ``tree``
        (default: libcst's)."""
        return super()._instantiate_and_run(transform, tree)  # type: ignore[misc]


def remove_imports_keeps_unused_imports() -> bool:
    """libcst's ``RemoveImportsVisitor`` keeps its pre-pass's result in ``_unused_imports`` (set in
    ``visit_Module``, read when it leaves an import) next to its public ``unused_module_imports`` /
    ``unused_obj_imports``, so :func:`set_unused_imports` can stand in for that pre-pass."""
    try:
        names = RemoveImportsVisitor.visit_Module.__code__.co_names + RemoveImportsVisitor.__init__.__code__.co_names
    except AttributeError:
        return False
    return {"_unused_imports", "unused_module_imports", "unused_obj_imports"} <= set(names)


def set_unused_imports(visitor: RemoveImportsVisitor, unused: Mapping) -> None:
    """Hand ``visitor`` the unused imports its pre-pass would find, ``{ImportAlias: its Import /
    ImportFrom}`` (``RemoveImportsVisitor._unused_imports``)."""
    visitor._unused_imports = unused


__all__ = [
    "CONSTRUCTED_LEAVE_MATCHER_ATTR",
    "CONSTRUCTED_VISIT_MATCHER_ATTR",
    "CSTTypedBaseFunctions",
    "EXTRA_LEAVE_FUNCS",
    "EXTRA_VISIT_FUNCS",
    "LazyValue",
    "MODULES_IGNORED_BY_DEFAULT",
    "MetadataReferenceHook",
    "TransformRunHook",
    "VISIT_AND_REPLACE_CHILDREN",
    "VISIT_NEGATIVE_MATCHER_ATTR",
    "VISIT_POSITIVE_MATCHER_ATTR",
    "computed_metadata",
    "gather_matchers",
    "remove_imports_keeps_unused_imports",
    "set_unused_imports",
    "stored_metadata",
    "top_imports_gatherer",
]
