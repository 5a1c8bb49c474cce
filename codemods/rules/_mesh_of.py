"""The mpu getters ``mesh_of(mpu)`` answers, and how: shared by the codemods for an mpu inside
DeepSpeed (:mod:`codemods.rules.mpu_internal`) and for one passed to ``deepspeed.initialize``
(:mod:`codemods.rules.mpu_calls`)."""

from __future__ import annotations

_MP = '("pp", "tp")'
# getter stem -> dims code; only stems that come first in mesh_of's probe order for their dims
_STEMS = {
    "data_parallel": '"dp"',
    "tensor_model_parallel": '"tp"',
    "pipeline_model_parallel": '"pp"',
    "sequence_parallel": '"sp"',
    "model_parallel": _MP,
}
_QUERIES = {"group": "get_group", "world_size": "size", "rank": "get_local_rank"}

GETTERS: dict[str, str] = {
    f"get_{stem}_{what}": f"{query}({dims})" for stem, dims in _STEMS.items() for what, query in _QUERIES.items()
}
GETTERS["get_data_parallel_group_ranks"] = 'get_group_ranks("dp")'

# getters mesh_of answers only through a probe that may pick another getter first -> what to do
MANUAL: dict[str, str] = {
    **{
        f"get_slice_parallel_{what}": (
            f'mesh_of(mpu).{query}("tp") calls get_tensor_model_parallel_{what} first when the mpu has it; '
            "use it once every mpu reaching here answers both alike (PipelineParallelGrid, MeshMPU do)"
        )
        for what, query in _QUERIES.items()
    },
    **{
        f"get_pipe_parallel_{what}": (
            f'mesh_of(mpu).{query}("pp") calls get_pipeline_model_parallel_{what} first when the mpu has it; '
            "use it once every mpu reaching here answers both alike (PipelineParallelGrid, MeshMPU do)"
        )
        for what, query in _QUERIES.items()
    },
    "get_tensor_model_parallel_src_rank": (
        'the TP source rank is the first rank of the TP group: mesh_of(mpu).get_group_ranks("tp")[0] '
        "once every mpu reaching here derives it that way (Megatron's parallel_state does)"
    ),
}
