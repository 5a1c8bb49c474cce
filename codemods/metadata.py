"""Metadata for the codemods at the cost of what they use: no deep copy of a tree that holds each
node once, providers resolved on first use, and parent nodes from one walk over the tree.

libcst's ``MetadataWrapper`` deep-copies the module and resolves every declared provider before a
codemod visits the first node. On a large file that no rule touches (most of deepspeed's runtime),
that is most of the migration's time: the codemods only ask for metadata at candidate sites. The
values are the same: a provider is resolved by libcst itself on the same module, only later, and
the parent map equals ``ParentNodeProvider``'s (tested).
"""
from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from contextlib import contextmanager
from dataclasses import replace
from typing import Collection, Generator, Iterator, Optional

import libcst as cst
from libcst.metadata import MetadataWrapper, ParentNodeProvider

logger = logging.getLogger(__name__)

_FIELDS: dict[type, tuple[str, ...]] = {}


def parent_map(module: cst.Module) -> Optional[dict[cst.CSTNode, cst.CSTNode]]:
    """``{child: parent}`` for every node below ``module``, or None when a node object occurs twice
    in the tree (then positions, parents and scopes need libcst's deep copy to be unambiguous)."""
    parents: dict[cst.CSTNode, cst.CSTNode] = {}
    stack: list[cst.CSTNode] = [module]
    node_type = cst.CSTNode
    while stack:
        node = stack.pop()
        names = _FIELDS.get(type(node))
        if names is None:
            names = _FIELDS[type(node)] = tuple(f.name for f in dataclasses.fields(node))
        for name in names:
            value = getattr(node, name)
            if isinstance(value, node_type):
                children = (value,)
            elif isinstance(value, (tuple, list)):
                children = value
            else:
                continue
            for child in children:
                if isinstance(child, node_type):
                    if child in parents:
                        return None
                    parents[child] = node
                    stack.append(child)
    return parents


class _OnFirstUse(Mapping):
    """One provider's ``{node: value}``, resolved by the wrapper when first read. It stands in the
    wrapper's metadata until then (libcst's visitors check there that their parent transform
    declared what they read)."""

    __slots__ = ("_wrapper", "_provider", "_values")

    def __init__(self, wrapper: "LazyMetadataWrapper", provider) -> None:
        self._wrapper = wrapper
        self._provider = provider
        self._values: Optional[Mapping] = None

    def _resolved(self) -> Mapping:
        if self._values is None:
            wrapper, provider = self._wrapper, self._provider
            if wrapper._metadata.get(provider) is self:
                del wrapper._metadata[provider]  # libcst resolves what is not there (and its dependencies)
            self._values = MetadataWrapper.resolve_many(wrapper, [provider])[provider]
        return self._values

    def __getitem__(self, node):
        return self._resolved()[node]

    def get(self, node, default=None):
        return self._resolved().get(node, default)

    def __contains__(self, node) -> bool:
        return node in self._resolved()

    def __iter__(self) -> Iterator:
        return iter(self._resolved())

    def __len__(self) -> int:
        return len(self._resolved())


class LazyMetadataWrapper(MetadataWrapper):
    """A ``MetadataWrapper`` that copies ``module`` only when a node object occurs twice in it, and
    resolves each provider when a codemod first reads it."""

    __slots__ = ()

    def __init__(self, module: cst.Module) -> None:
        parents = parent_map(module)
        super().__init__(module, unsafe_skip_copy=parents is not None)
        if parents is None:
            logger.debug("a node occurs twice in the tree: metadata on a deep copy")
            parents = parent_map(self.module)
        if parents is not None:
            self._metadata[ParentNodeProvider] = parents

    def resolve_many(self, providers: Collection) -> Mapping:
        return {p: self._metadata.setdefault(p, _OnFirstUse(self, p)) for p in providers}


class LazyMetadata:
    """Mixin for a libcst ``Codemod``: its metadata comes from a :class:`LazyMetadataWrapper`."""

    @contextmanager
    def _handle_metadata_reference(self, module: cst.Module) -> Generator[cst.Module, None, None]:
        if self.context.metadata_manager is not None:  # full-repo metadata: libcst's own path
            with super()._handle_metadata_reference(module) as tree:
                yield tree
            return
        old = self.context.wrapper
        wrapper = LazyMetadataWrapper(module)
        with self.resolve(wrapper):
            self.context = replace(self.context, wrapper=wrapper)
            try:
                yield wrapper.module
            finally:
                self.context = replace(self.context, wrapper=old)


_LAZY_CLASSES: dict[type, type] = {}


def lazy(codemod_class: type) -> type:
    """``codemod_class`` (e.g. libcst's ``AddImportsVisitor``) with :class:`LazyMetadata`."""
    if issubclass(codemod_class, LazyMetadata):
        return codemod_class
    if codemod_class not in _LAZY_CLASSES:
        _LAZY_CLASSES[codemod_class] = type(codemod_class.__name__, (LazyMetadata, codemod_class), {})
    return _LAZY_CLASSES[codemod_class]
