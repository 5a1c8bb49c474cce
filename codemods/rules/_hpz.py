"""Codemod rules: DeepSpeed's ZeRO++ hpZ helpers in ``deepspeed.utils.groups`` → the mesh's hpZ
functions (``mesh_core.runtime_hooks``).

``groups._create_zero_param_parallel_group(N)`` (a bare statement) becomes
``create_hpz_group(<mesh>, N)``; the four getters become ``hpz_group(<mesh>)``,
``hpz_group_size(<mesh>)``, ``hpz_group_rank(<mesh>)`` and ``hpz_group_ranks(<mesh>)``. ``<mesh>`` is the
model's mesh (``model_mesh(self)`` in a DeepSpeed engine, ``current_mesh()`` elsewhere; see
``GroupsGettersCommand.model_mesh``).

Why this is exact (``mesh_core.roles.hpz``): legacy keeps one process-global hpZ group; the mesh keeps
one per world and ZeRO domain, shared by every mesh of that domain, and the compat layer's legacy
functions read and write the same state. Before any engine exists ``current_mesh()`` is the
data-parallel world mesh, whose domain is the world: DeepSpeed's world blocks, built once, read
by the engine later whatever its mesh object, None / world size / global rank / ``[]`` while none
is built, AssertionError on a second build or a size that does not divide the world. Inside an
engine (and after one, as its mesh becomes the default) the mesh is the engine's, the one the
compat layer's legacy functions serve from. Call forms with no exact equivalent (extra arguments,
a build whose result is used) stay with a TODOV1.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst

from .._engine.base import arg_by, fill_hooks

if TYPE_CHECKING:
    from ._rule_api import RuleHost

CREATE = "_create_zero_param_parallel_group"
CREATE_TEMPLATE = "{create_hpz_group}({mesh}, {n})"
GETTERS: dict[str, str] = {
    "_get_zero_param_intra_parallel_group": "{hpz_group}({mesh})",
    "_get_zero_param_intra_parallel_group_world_size": "{hpz_group_size}({mesh})",
    "_get_zero_param_intra_parallel_rank_in_mygroup": "{hpz_group_rank}({mesh})",
    "_get_zero_param_intra_parallel_group_ranks": "{hpz_group_ranks}({mesh})",
}
FUNCTIONS = frozenset(GETTERS) | {CREATE}
_HPZ_GROUP = "_get_zero_param_intra_parallel_group"
KIND = "groups getter"
# DeepSpeed modules whose hpZ calls run only with torch.distributed initialised (zero.Init calls
# init_distributed first; the engine and its ZeRO-3 optimizer exist only after it). Elsewhere a
# getter may run before init_process_group, where legacy returns None and current_mesh() raises.
MODULES = frozenset(
    {"deepspeed.runtime.zero.partition_parameters", "deepspeed.runtime.zero.stage3", "deepspeed.runtime.engine"}
)
_ELSEWHERE = (
    "{call} is the mesh form, but here it may run before torch.distributed is initialised (legacy: None / "
    "AssertionError, current_mesh(): MeshSpecError); call it on the model's mesh once the process group exists"
)


def rewrite(command: "RuleHost", call: cst.Call, updated: cst.Call, fname: str) -> cst.BaseExpression:
    """The mesh form of hpZ helper ``fname`` at ``call``, or ``updated`` with a TODOV1."""
    if command.context.full_module_name not in MODULES:
        shown = _show(fname) if fname in GETTERS else _show_template(CREATE_TEMPLATE, n="N")
        command.flag(KIND, f"groups.{fname}: " + _ELSEWHERE.format(call=shown))
        return updated
    if fname in GETTERS:
        if call.args:
            command.flag(KIND, f"groups.{fname} takes no arguments (legacy raises TypeError); use {_show(fname)}")
            return updated
        return command.rewrite(call, GETTERS[fname])
    size = arg_by(updated, 0, "group_size")
    if size is None or len(call.args) != 1:
        command.flag(
            KIND, f"groups.{fname} takes one argument, group_size; use " + _show_template(CREATE_TEMPLATE, n="N")
        )
        return updated
    if not isinstance(command.parent(call), cst.Expr):
        command.flag(
            KIND,
            f"groups.{fname} returns None, {_show_template(CREATE_TEMPLATE, n='N')} this rank's "
            f"group: call it as a statement, then read {_show(_HPZ_GROUP)}",
        )
        return updated
    return command.rewrite(call, CREATE_TEMPLATE, n=cst.Module([]).code_for_node(size.value))


def _show(fname: str) -> str:
    return _show_template(GETTERS[fname])


def _show_template(template: str, **parts: str) -> str:
    """A template as advice text: ``<mesh>`` for the mesh, each function by its own name."""
    return fill_hooks(template, lambda name: name, mesh="<mesh>", **parts)
