"""Codemod: drop imports of legacy APIs that nothing uses any more (run after the rewrites)."""
from __future__ import annotations

from typing import Optional

import libcst as cst
from libcst.codemod.visitors import RemoveImportsVisitor
from libcst.helpers import get_full_name_for_node

from . import legacy_names as ln
from .base import MigrationCommand, import_statements


def is_legacy(qualified: str) -> bool:
    name = ln.canonical(qualified)
    return any(name == m or name.startswith(m + ".") for m in (ln.GROUPS, ln.TOPOLOGY))


class LegacyImportsCommand(MigrationCommand):
    CLEANUP = True
    DESCRIPTION = "remove unused imports of deepspeed.utils.groups / the pipe topology (and compat)"
    MARKERS = (("import", ),)

    def transform_module_impl(self, tree: cst.Module) -> cst.Module:
        # Only import statements matter and this codemod changes none itself (the removal pass
        # runs after it): visit those, not the whole tree.
        self.visit_Module(tree)
        for node in import_statements(tree):
            if isinstance(node, cst.Import):
                self.visit_Import(node)
            else:
                self.visit_ImportFrom(node)
        return tree

    def _unused(self, alias: cst.ImportAlias) -> bool:
        """No reference to the name ``alias`` binds (checked here so that the costly removal
        pass only runs when there is something to remove)."""
        scope = self.scope_of(alias)
        if scope is None:
            return True
        bound = alias.evaluated_alias or alias.evaluated_name
        return not any(a.references for a in scope.assignments[bound.split(".")[0]])

    def visit_Import(self, node: cst.Import) -> Optional[bool]:
        for alias in node.names:
            module = get_full_name_for_node(alias.name)
            if module and is_legacy(module) and self._unused(alias):
                asname = alias.asname.name.value if alias.asname and isinstance(alias.asname.name, cst.Name) else None
                RemoveImportsVisitor.remove_unused_import(self.context, module, asname=asname)
        return False

    def visit_ImportFrom(self, node: cst.ImportFrom) -> Optional[bool]:
        if isinstance(node.names, cst.ImportStar) or node.module is None or node.relative:
            return False
        module = get_full_name_for_node(node.module)
        if not module:
            return False
        for alias in node.names:
            obj = get_full_name_for_node(alias.name)
            if obj and is_legacy(f"{module}.{obj}") and self._unused(alias):
                asname = alias.asname.name.value if alias.asname and isinstance(alias.asname.name, cst.Name) else None
                RemoveImportsVisitor.remove_unused_import(self.context, module, obj, asname)
        return False
