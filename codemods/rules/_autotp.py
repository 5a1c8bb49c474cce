"""Rule: AutoTP's lettered ``groups`` getters and TP builder inside DeepSpeed → mesh_core's AutoTP groups.

Inside DeepSpeed's modules that may run before any engine exists (AutoTP layer replacement,
``TpTrainingManager``, ``tp_model_init``, the compiled TP collectives) the lettered getters
(``groups.get_tensor_model_parallel_group()``, ...) read the process's AutoTP groups, which legacy
keeps in module globals that only ``_init_tp_mesh_device`` fills. ``mesh_core.runtime_hooks.autotp_groups()`` is
that one state (the mesh runtime's legacy getters serve from it too) and its methods have the legacy
meaning and errors, so the rewrite is exact wherever the code runs; ``groups._init_tp_mesh_device``
becomes ``mesh_core.runtime_hooks.init_autotp`` with the same arguments and result (the mesh runtime's legacy
builder calls it). Called from ``GroupsGettersCommand.leave_Call``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst

from .._engine.base import has_star_args

if TYPE_CHECKING:
    from ._rule_api import RuleHost

# legacy lettered getter (no arguments) -> AutoTPGroups method
GETTERS: dict[str, str] = {
    "get_tensor_model_parallel_group": "tensor_parallel_group",
    "get_model_parallel_group": "model_parallel_group",
    "get_data_parallel_group": "data_parallel_group",
    "get_tensor_model_parallel_world_size": "tensor_parallel_world_size",
    "get_model_parallel_world_size": "tensor_parallel_world_size",
    "get_tensor_model_parallel_rank": "tensor_parallel_rank",
    "get_model_parallel_rank": "tensor_parallel_rank",
    "get_tensor_model_parallel_src_rank": "tensor_parallel_src_rank",
    "get_data_parallel_world_size": "data_parallel_world_size",
    "get_data_parallel_rank": "data_parallel_rank",
}
# legacy builder -> mesh_core function taking the same parameters (names and order) and returning the same
BUILDERS: dict[str, str] = {"_init_tp_mesh_device": "init_autotp"}
_BUILDER_PARAMS = ("tensor_model_parallel_size", "data_parallel_size")


def applies(command: "RuleHost", call: cst.Call, fname: str) -> bool:
    """``call`` (legacy ``groups.<fname>``) is one this rule rewrites: a getter without arguments in
    a DeepSpeed module outside the engine-scoped ones, or the TP builder in any DeepSpeed module,
    called with its own parameters (no star-args, no unknown keyword)."""
    if fname in GETTERS:
        return not call.args and command.outside_engine()
    if fname in BUILDERS:
        if not command.outside_engine(also_scoped=True) or has_star_args(call) or len(call.args) > 2:
            return False
        return all(a.keyword is None or a.keyword.value in _BUILDER_PARAMS for a in call.args)
    return False


def rewrite(command: "RuleHost", call: cst.Call, updated: cst.Call, fname: str) -> cst.BaseExpression:
    command.keep_comments(call)
    command.record("groups getter")
    if fname in BUILDERS:
        return updated.with_changes(func=cst.parse_expression(command.mesh_ref(BUILDERS[fname])))
    new = cst.parse_expression(f"{command.mesh_ref('autotp_groups')}().{GETTERS[fname]}()")
    return new.with_changes(lpar=call.lpar, rpar=call.rpar) if call.lpar else new
