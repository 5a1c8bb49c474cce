"""``PipelineParallelGrid`` methods and attributes → expressions on a ``DeepSpeedDeviceMesh``.

Shared by the topology codemod (a grid variable turned into a mesh) and the mpu codemod (a grid
passed to ``deepspeed.initialize`` as ``mpu``, whose calls go to the engine's mesh). The grid's
"model parallel" is pipe × model, hence ``("pp", "tp")``.
"""

from __future__ import annotations

from typing import Optional

import libcst as cst

import ds_mesh_advice

PP_TP = '("pp", "tp")'

_GRID = "deepspeed.runtime.pipe.topology.PipelineParallelGrid."
_ROWS = [r for r in ds_mesh_advice.rows() if r.section == "grid" and r.name.startswith(_GRID)]
# method -> template ({m}: the mesh); the method takes no arguments (the catalog's mesh expressions)
METHODS: dict[str, str] = {r.name[len(_GRID) :]: r.template(mesh="{m}") for r in _ROWS if r.mesh and r.form == "call"}
# attribute (read) -> template
ATTRIBUTES: dict[str, str] = {
    r.name[len(_GRID) :]: r.template(mesh="{m}") for r in _ROWS if r.mesh and r.form == "attribute"
}
# what has no mesh equivalent -> the catalog's advice
MANUAL: dict[str, str] = {r.name[len(_GRID) :]: r.advice for r in _ROWS if r.action == "flag"}

# topology axis name -> mesh dim (stage_to_global keyword arguments, ProcessTopology axes): a copy of
# mesh_core.axis_names.AXIS_TO_DIM (the codemods never import mesh_core; tests/test_structure.py holds them equal).
AXIS_TO_DIM = {"pipe": "pp", "data": "dp", "model": "tp"}

NEEDS_PP_TP = {name for name, t in {**METHODS, **ATTRIBUTES}.items() if PP_TP in t}


def code(node: cst.CSTNode) -> str:
    return cst.Module([]).code_for_node(node)


def rewrite_use(mesh: str, attribute: cst.Attribute, call: Optional[cst.Call]) -> Optional[str]:
    """Code for ``<grid>.<attr>`` (or the call ``<grid>.<method>(...)``) on ``mesh``; None if unmappable."""
    name = attribute.attr.value
    if call is not None:
        if name == "stage_to_global":
            return _stage_to_global(mesh, call)
        if name in METHODS and not call.args:
            return METHODS[name].format(m=mesh)
        return None
    if name in ATTRIBUTES:
        return ATTRIBUTES[name].format(m=mesh)
    return None


def _stage_to_global(mesh: str, call: cst.Call) -> Optional[str]:
    stage: list[str] = []
    args = []
    for arg in call.args:
        if arg.star:
            return None
        if arg.keyword is None or arg.keyword.value == "stage_id":
            stage.append(code(arg.value))
            continue
        dim = AXIS_TO_DIM.get(arg.keyword.value)
        if dim is None or dim == "pp":
            return None
        args.append(f"{dim}={code(arg.value)}")
    if len(stage) != 1:
        return None
    return f"{mesh}.stage_to_global({', '.join(stage + args)})"
