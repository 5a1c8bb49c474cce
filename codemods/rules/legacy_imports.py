"""Codemod: drop imports of legacy APIs that nothing uses any more (run after the rewrites)."""

from __future__ import annotations

from typing import Optional

import libcst as cst
from libcst.codemod.visitors import RemoveImportsVisitor
from libcst.helpers import get_full_name_for_node

from .._engine import legacy_names as ln
from .._engine.base import MigrationCommand, import_statements


def is_legacy(qualified: str) -> bool:
    name = ln.canonical(qualified)
    return any(name == m or name.startswith(m + ".") for m in (ln.GROUPS, ln.TOPOLOGY))


class LegacyImportsCommand(MigrationCommand):
    CLEANUP = True
    DESCRIPTION = "remove unused imports of deepspeed.utils.groups / the pipe topology (and compat)"
    MARKERS = (("import",),)

    def transform_module_impl(self, tree: cst.Module) -> cst.Module:
        # Only import statements matter and this codemod changes none itself (the removal pass
        # runs after it): visit those, not the whole tree.
        self.visit_Module(tree)
        for node in import_statements(tree):
            if isinstance(node, cst.Import):
                self.visit_Import(node)
            else:
                self.visit_ImportFrom(node)
        return self._carry_comments(tree)

    def visit_Module(self, node: cst.Module) -> Optional[bool]:
        self._gone: list = []  # import statements every name of which is scheduled for removal
        return super().visit_Module(node)

    def leave_Module(self, original_node: cst.Module, updated_node: cst.Module) -> cst.Module:
        return self._carry_comments(updated_node)  # the full-pass path (no transform_module_impl shortcut)

    def _carry_comments(self, tree: cst.Module) -> cst.Module:
        """libcst's removal drops a removed statement's comment lines (and, in a function, its
        blank lines); keep them above the statement that follows it in its block."""
        lines = {id(self.parent(n)) for n in self._gone if getattr(self.parent(n), "leading_lines", ())}
        return tree.visit(_CarryComments(lines)) if lines else tree

    def _unused(self, alias: cst.ImportAlias) -> bool:
        """No reference to the name ``alias`` binds (checked here so that the costly removal
        pass only runs when there is something to remove)."""
        scope = self.scope_of(alias)
        if scope is None:
            return True
        bound = alias.evaluated_alias or alias.evaluated_name
        return not any(a.references for a in scope.assignments[bound.split(".")[0]])

    def visit_Import(self, node: cst.Import) -> Optional[bool]:
        removed = 0
        for alias in node.names:
            module = get_full_name_for_node(alias.name)
            if module and is_legacy(module) and self._unused(alias):
                asname = alias.asname.name.value if alias.asname and isinstance(alias.asname.name, cst.Name) else None
                RemoveImportsVisitor.remove_unused_import(self.context, module, asname=asname)
                removed += 1
        self._note_gone(node, removed)
        return False

    def _note_gone(self, node: cst.CSTNode, removed: int) -> None:
        statement = self.parent(node)
        if (
            removed
            and removed == len(node.names)
            and isinstance(statement, cst.SimpleStatementLine)
            and len(statement.body) == 1
        ):
            self._gone.append(node)

    def visit_ImportFrom(self, node: cst.ImportFrom) -> Optional[bool]:
        if isinstance(node.names, cst.ImportStar) or node.module is None or node.relative:
            return False
        module = get_full_name_for_node(node.module)
        if not module:
            return False
        removed = 0
        for alias in node.names:
            obj = get_full_name_for_node(alias.name)
            if obj and is_legacy(f"{module}.{obj}") and self._unused(alias):
                asname = alias.asname.name.value if alias.asname and isinstance(alias.asname.name, cst.Name) else None
                RemoveImportsVisitor.remove_unused_import(self.context, module, obj, asname)
                removed += 1
        self._note_gone(node, removed)
        return False


def _has_comments(statement: cst.CSTNode) -> bool:
    return any(line.comment is not None for line in getattr(statement, "leading_lines", ()))


class _CarryComments(cst.CSTTransformer):
    """Move the comment lines of the statements ``ids`` (by ``id``) onto the next statement of their block."""

    def __init__(self, ids: set) -> None:
        super().__init__()
        self.ids = ids

    def _carry(self, original: cst.CSTNode, updated: cst.CSTNode, blank: bool = False) -> cst.CSTNode:
        """With ``blank``, the removed statement's blank lines go too (a blank line before a
        function's local import separates what comes before it from the statements after it)."""
        body, pending = list(updated.body), []
        for i, statement in enumerate(original.body):
            if id(statement) in self.ids and i + 1 < len(body):
                carried = [line for line in statement.leading_lines if blank or line.comment is not None]
                pending += carried
                body[i] = body[i].with_changes(
                    leading_lines=[line for line in body[i].leading_lines if not any(line is c for c in carried)]
                )
            elif pending:
                if any(line.comment is None for line in body[i].leading_lines):  # no second blank line
                    pending = [line for line in pending if line.comment is not None]
                body[i] = body[i].with_changes(leading_lines=[*pending, *body[i].leading_lines])
                pending = []
        return updated.with_changes(body=body)

    def leave_Module(self, original_node: cst.Module, updated_node: cst.Module) -> cst.Module:
        return self._carry(original_node, updated_node)

    def leave_IndentedBlock(
        self, original_node: cst.IndentedBlock, updated_node: cst.IndentedBlock
    ) -> cst.IndentedBlock:
        return self._carry(original_node, updated_node, blank=True)
