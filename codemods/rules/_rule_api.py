"""What a codemod rule module may ask of the command that runs it.

Rule helper modules (``codemods.rules._autotp``, ``_hpz``, ``_mpu_exact``, ``_node_groups``, ...) hold
the knowledge of one family of legacy calls; the command (:class:`~codemods.rules.groups_getters.GroupsGettersCommand`)
walks the tree and hands them each call. They talk to it only through this protocol, so a rule
depends on this interface, not on the command's module (no import circle) nor on its private
methods.
"""

from __future__ import annotations

from typing import Optional, Protocol

import libcst as cst
from libcst.codemod import CodemodContext
from libcst.metadata import Scope

__all__ = ["RuleHost"]


class RuleHost(Protocol):
    """The command a rule runs in."""

    context: CodemodContext

    def flag(self, kind: str, message: str) -> None:
        """Leave a ``TODOV1`` comment with ``message`` at the current statement."""

    def record(self, kind: str) -> None:
        """Count one rewritten site of ``kind``."""

    def keep_comments(self, replaced: cst.CSTNode) -> None:
        """Carry ``replaced``'s comments over to its replacement."""

    def parent(self, node: cst.CSTNode) -> Optional[cst.CSTNode]:
        """``node``'s parent in the tree."""

    def scope_of(self, node: cst.CSTNode) -> Optional[Scope]:
        """The scope ``node`` is in."""

    def legacy_names(self, node: cst.CSTNode) -> set[str]:
        """The legacy qualified names ``node`` may refer to."""

    def mesh_ref(self, name: str) -> str:
        """Code naming mesh name ``name``, its import added."""

    def engine_owner(self, node: cst.CSTNode) -> Optional[str]:
        """The name of the DeepSpeed engine ``self`` whose method ``node`` is in, or None."""

    def rewrite(self, call: cst.Call, template: str, **parts: str) -> cst.BaseExpression:
        """``call`` replaced by ``template`` (``{mesh}``: the model's mesh; ``{<hook>}``: a runtime hook)."""

    def outside_engine(self, also_scoped: bool = False) -> bool:
        """This file is part of DeepSpeed and its reads may run outside an engine's scope."""

    def engine_scoped(self) -> bool:
        """This file is one of DeepSpeed's engine-scoped modules."""
