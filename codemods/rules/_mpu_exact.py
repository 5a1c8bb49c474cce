"""Rules: mpu getters inside DeepSpeed whose exact mesh form depends on which mpus reach the site.

``mesh_of(mpu)`` probes an mpu's getters in a fixed order per dim, so a getter later in that order
(``get_pipe_parallel_*``, ``get_slice_parallel_*``) or outside it (``get_tensor_model_parallel_src_rank``)
is rewritten only where the mpus that can reach the site are known (called from
:mod:`codemods.rules.mpu_internal` and :mod:`codemods.rules.groups_getters`):

- ``self.mpu.get_pipe_parallel_*()`` in the pipeline engine → ``mesh_of(self.mpu).<query>("pp")``:
  the pipeline engine's mpu is always its ``PipelineModule``'s grid (``deepspeed.initialize``
  asserts ``mpu is None`` for a PipelineModule and passes ``model.mpu()``); DeepSpeed 0.19.8's grid
  has no ``get_pipeline_model_parallel_*`` (the probe falls through to ``get_pipe_parallel_*``) and
  the mesh runtime's grid answers both from one group.
- ``<mpu>.get_slice_parallel_*()`` as the body of ``... if hasattr(<mpu>, "get_slice_parallel_*")
  else ...`` → ``mesh_of(<mpu>).<query>("tp")``: of the mpus DeepSpeed accepts, those with slice
  getters (a grid, legacy or the mesh runtime's; the runtime's ``MeshMPU``) answer
  ``get_tensor_model_parallel_*`` with the slice getter, and DeepSpeed's test mpus that have slice
  getters have no tensor ones (the probe then calls the slice getter itself).
- ``self.mpu.<lettered getter>()`` in a method that set ``self.mpu = groups`` (the engine's AutoTP
  set-up, including the hooks it registers) → ``autotp_groups().<getter>()``: the engine's
  ``self.mpu`` is then the groups module, whose lettered getters serve the AutoTP state.
- ``groups._get_model_parallel_world_size()`` in an engine method → ``model_parallel_world_size(self.mpu)``:
  in the engine's scope ``groups.mpu`` is the engine's mpu (the engine sets it, the mesh runtime
  keeps one groups state per engine), and ``model_parallel_world_size`` has the legacy meaning
  (1 for None or ``parallel_state_sp``, else the mpu's model-parallel size).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

import libcst as cst

from .._engine import legacy_names as ln
from . import _node_groups as node_groups
from ._autotp import GETTERS as AUTOTP_GETTERS

if TYPE_CHECKING:
    from ._rule_api import RuleHost

PIPE_ENGINE = "deepspeed.runtime.pipe.engine"
_QUERIES = {"group": "get_group", "world_size": "size", "rank": "get_local_rank"}
PIPE = {f"get_pipe_parallel_{what}": f'{query}("pp")' for what, query in _QUERIES.items()}
SLICE = {f"get_slice_parallel_{what}": f'{query}("tp")' for what, query in _QUERIES.items()}


def code(node: cst.CSTNode) -> str:
    return cst.Module([]).code_for_node(node)


def mpu_getter(command: "RuleHost", call: cst.Call, receiver: str, method: str) -> Optional[str]:
    """Replacement code for ``<receiver>.<method>()`` (None: no rule proves it exact here)."""
    if call.args:
        return None
    module = command.context.full_module_name
    if method in PIPE and module == PIPE_ENGINE and receiver == "self.mpu":
        return f"{command.mesh_ref('mesh_of')}({receiver}).{PIPE[method]}"
    if method in SLICE and _hasattr_guarded(command, call, receiver, method):
        return f"{command.mesh_ref('mesh_of')}({receiver}).{SLICE[method]}"
    if method in AUTOTP_GETTERS and receiver == "self.mpu" and _mpu_is_groups_here(command, call):
        return f"{command.mesh_ref('autotp_groups')}().{AUTOTP_GETTERS[method]}()"
    return None


def _hasattr_guarded(command: "RuleHost", call: cst.Call, receiver: str, method: str) -> bool:
    """``call`` is the body of ``... if hasattr(<receiver>, "<method>") else ...``."""
    parent = command.parent(call)
    if not isinstance(parent, cst.IfExp) or parent.body is not call:
        return False
    test = parent.test
    if not (isinstance(test, cst.Call) and isinstance(test.func, cst.Name) and test.func.value == "hasattr"):
        return False
    if len(test.args) != 2 or any(a.keyword or a.star for a in test.args):
        return False
    name = test.args[1].value
    return (
        code(test.args[0].value) == receiver and isinstance(name, cst.SimpleString) and name.evaluated_value == method
    )


def _mpu_is_groups_here(command: "RuleHost", call: cst.Call) -> bool:
    """``call`` runs inside a method (or a function nested in it) whose body assigns
    ``self.mpu = groups`` (``deepspeed.utils.groups``) in a statement before the one that holds
    ``call``, and the class assigns ``self.mpu`` nowhere else than there and in ``__init__`` (the
    engine's ``self.mpu = mpu``, which runs before its AutoTP set-up)."""
    path: list[cst.CSTNode] = []
    node: Optional[cst.CSTNode] = call
    method: Optional[cst.FunctionDef] = None
    while node is not None:
        path.append(node)
        parent = command.parent(node)
        if (
            isinstance(node, cst.FunctionDef)
            and isinstance(parent, cst.IndentedBlock)
            and isinstance(command.parent(parent), cst.ClassDef)
        ):
            method = node
            break
        node = parent
    if method is None or len(path) < 3 or not isinstance(method.body, cst.IndentedBlock):
        return False
    holder = path[-3]  # path: call ... statement, method.body, method
    body = list(method.body.body)
    if holder not in body:
        return False
    before = [(t, v) for s in body[: body.index(holder)] for t, v in _assignments(s) if code(t) == "self.mpu"]
    if not before or not all(_is_groups(command, v) for _, v in before):
        return False
    cls = command.parent(command.parent(method))
    for func in _functions(cls):
        if func is method or func.name.value == "__init__":
            continue
        if any(code(t) == "self.mpu" for t in _all_targets(func)):
            return False
    return not any(code(t) == "self.mpu" for s in body[body.index(holder) :] for t, _ in _assignments(s))


def _functions(cls: cst.CSTNode):
    block = getattr(cls, "body", None)
    for statement in getattr(block, "body", ()):
        if isinstance(statement, cst.FunctionDef):
            yield statement


def _all_targets(func: cst.FunctionDef):
    from .._engine.base import find_all

    for assign in find_all(func, cst.Assign):
        for target in assign.targets:
            yield target.target
    for assign in find_all(func, cst.AugAssign):
        yield assign.target


def _assignments(statement: cst.CSTNode):
    if not isinstance(statement, cst.SimpleStatementLine):
        return
    for small in statement.body:
        if isinstance(small, cst.Assign):
            for target in small.targets:
                yield target.target, small.value


def _is_groups(command: "RuleHost", value: cst.BaseExpression) -> bool:
    return ln.GROUPS in command.legacy_names(value)


def engine_model_parallel_world_size(command: "RuleHost", call: cst.Call) -> Optional[str]:
    """``groups._get_model_parallel_world_size()`` inside an engine method (None elsewhere)."""
    if call.args:
        return None
    owner = command.engine_owner(call)
    if owner is None:
        return None
    return f"{command.mesh_ref('model_parallel_world_size')}({owner}.mpu)"


GROUPS_CALLS = frozenset({"_get_model_parallel_world_size", node_groups.FUNCTION})


def groups_call(command: "RuleHost", call: cst.Call, fname: str) -> Optional[str]:
    """Replacement code for ``groups.<fname>(...)`` (one of GROUPS_CALLS) inside DeepSpeed, or None."""
    module = command.context.full_module_name or ""
    if fname == node_groups.FUNCTION:
        return node_groups.replacement(command, call) if module.startswith("deepspeed.") else None
    if not command.engine_scoped():
        return None
    return engine_model_parallel_world_size(command, call)
