"""``PipelineParallelGrid`` methods and attributes → expressions on a ``DeepSpeedDeviceMesh``.

Shared by the topology codemod (a grid variable turned into a mesh) and the mpu codemod (a grid
passed to ``deepspeed.initialize`` as ``mpu``, whose calls go to the engine's mesh). The grid's
"model parallel" is pipe × model, hence ``("pp", "tp")``.
"""
from __future__ import annotations

from typing import Optional

import libcst as cst

PP_TP = '("pp", "tp")'

# method -> template ({m}: the mesh); the method takes no arguments.
METHODS: dict[str, str] = {
    "get_stage_id": '{m}.get_rank("pp")',
    "get_pipe_parallel_rank": '{m}.get_rank("pp")',
    "get_pipeline_model_parallel_rank": '{m}.get_rank("pp")',
    "get_data_parallel_id": '{m}.get_rank("dp")',
    "get_data_parallel_rank": '{m}.get_rank("dp")',
    "get_pipe_parallel_world_size": '{m}.size("pp")',
    "get_pipeline_model_parallel_world_size": '{m}.size("pp")',
    "get_pipe_parallel_group": '{m}.get_group("pp")',
    "get_data_parallel_world_size": '{m}.size("dp")',
    "get_data_parallel_group": '{m}.get_group("dp")',
    "get_data_parallel_group_ranks": '{m}.get_group_ranks("dp")',
    "get_model_parallel_rank": "{m}.get_rank(" + PP_TP + ")",
    "get_model_parallel_world_size": "{m}.size(" + PP_TP + ")",
    "get_model_parallel_group": "{m}.get_group(" + PP_TP + ")",
    "get_slice_parallel_rank": '{m}.get_rank("tp")',
    "get_tensor_model_parallel_rank": '{m}.get_rank("tp")',
    "get_slice_parallel_world_size": '{m}.size("tp")',
    "get_tensor_model_parallel_world_size": '{m}.size("tp")',
    "get_slice_parallel_group": '{m}.get_group("tp")',
    "get_global_rank": "{m}.rank",
}

# attribute (read) -> template.
ATTRIBUTES: dict[str, str] = {
    "stage_id": '{m}.get_rank("pp")',
    "data_parallel_id": '{m}.get_rank("dp")',
    "pipe_parallel_size": '{m}.size("pp")',
    "data_parallel_size": '{m}.size("dp")',
    "model_parallel_size": '{m}.size("tp")',
    "slice_parallel_size": '{m}.size("tp")',
    "is_first_stage": '({m}.get_rank("pp") == 0)',
    "is_last_stage": '({m}.get_rank("pp") == {m}.size("pp") - 1)',
    "dp_group": '{m}.get_group_ranks("dp")',
    "pp_group": '{m}.get_group_ranks("pp")',
    "slice_group": '{m}.get_group_ranks("tp")',
    "dp_groups": '{m}.get_all_group_ranks("dp")',
    "pipe_groups": '{m}.get_all_group_ranks("pp")',
    "model_groups": '{m}.get_all_group_ranks("tp")',
    "dp_proc_group": '{m}.get_group("dp")',
    "pp_proc_group": '{m}.get_group("pp")',
    "slice_proc_group": '{m}.get_group("tp")',
    "ds_model_proc_group": "{m}.get_group(" + PP_TP + ")",
    "ds_model_rank": "{m}.get_rank(" + PP_TP + ")",
    "ds_model_world_size": "{m}.size(" + PP_TP + ")",
    "global_rank": "{m}.rank",
    "world_size": "{m}.spec.world_size",
    "p2p_groups": "{m}.layout.p2p_pairs()",
}

_NO_TOPOLOGY = (
    "the mesh has no ProcessTopology: mesh_core.pipeline_topology(pp=, dp=, tp=) where a topology object is "
    "needed (PipelineModule), <mesh>.layout for rank math"
)
# What has no mesh equivalent (documented in MIGRATION.md).
MANUAL: dict[str, str] = {
    "topology": _NO_TOPOLOGY,
    "_topo": _NO_TOPOLOGY,
    "mp_group": "mp_group is always [] in 0.19.8; remove it",
    "_build_p2p_groups": "use <mesh>.layout.p2p_pairs()",
    "_is_grid_valid": "a mesh is valid by construction",
}

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
