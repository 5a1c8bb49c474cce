"""Rule: ``groups._get_local_all_to_all_group()`` inside DeepSpeed → ``mesh_core.runtime_hooks.local_all_to_all_groups``.

Legacy builds the node all-to-all groups from ``get_accelerator().device_count()`` into one
process-global dict it hands out; ``mesh_core.runtime_hooks.local_all_to_all_groups(devices_per_node)`` builds the
same rank sets into mesh_core's one dict (the mesh runtime's legacy getter serves that very dict), so
the call is rewritten with the device count passed in, where the module has DeepSpeed's
``get_accelerator`` imported at module level under that name. Called from
``GroupsGettersCommand.leave_Call``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

import libcst as cst

if TYPE_CHECKING:
    from ._rule_api import RuleHost

FUNCTION = "_get_local_all_to_all_group"


def code(node: cst.CSTNode) -> str:
    return cst.Module([]).code_for_node(node)


def replacement(command: "RuleHost", call: cst.Call) -> Optional[str]:
    """Code for ``call`` (None: ``get_accelerator`` is not provably DeepSpeed's there)."""
    if call.args:
        return None
    scope = command.scope_of(call)
    if scope is None:
        return None
    seen = list(scope["get_accelerator"])
    if len(seen) != 1:
        return None
    node = getattr(seen[0], "node", None)
    if not (
        isinstance(node, cst.ImportFrom)
        and not node.relative
        and node.module is not None
        and code(node.module) == "deepspeed.accelerator"
        and not isinstance(node.names, cst.ImportStar)
    ):
        return None
    if not any(a.name.value == "get_accelerator" and a.asname is None for a in node.names):
        return None
    return f"{command.mesh_ref('local_all_to_all_groups')}(get_accelerator().device_count())"
