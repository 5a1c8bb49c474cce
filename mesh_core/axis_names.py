"""The one list of mesh dim names, and the legacy names for them as data.

:class:`MeshDim` names every dim a mesh may declare (torchtitan's ``MeshAxisName`` is the model: a
``str`` enum, so ``MeshDim.TP == "tp"`` and either spelling works wherever a dim is asked for).
The legacy vocabularies map onto it here and nowhere else: DeepSpeed's pipeline-topology axes
(``'pipe'``, ``'data'``, ``'model'`` → ``pp``, ``dp``, ``tp``), the dims a legacy grid / mpu /
``mesh_param`` can state (:data:`LEGACY_DIMS`) and the names users bring from other frameworks
(``fsdp`` → ``dp_shard``, :data:`ALIASES`, for suggestions). (The codemods, which never import
``mesh_core``, keep a copy of :data:`AXIS_TO_DIM` in ``codemods.grid_api``; a test holds the two
equal.)
"""
from __future__ import annotations

import enum


class MeshDim(str, enum.Enum):
    """A mesh dim name."""

    PP = "pp"  # pipeline stages
    DP = "dp"  # data parallel (replicas; ZeRO partitions over dp × sp)
    DP_REPLICATE = "dp_replicate"  # HSDP: replicas of the sharded model
    DP_SHARD = "dp_shard"  # HSDP: ZeRO partitions within a replica
    SP = "sp"  # sequence parallel (Ulysses)
    TP = "tp"  # tensor parallel

    def __str__(self) -> str:
        return self.value


# every dim, in declaration order; "dp" and the HSDP pair are mutually exclusive
MESH_DIMS: tuple[str, ...] = tuple(d.value for d in MeshDim)
# the default row-major order, outermost first
DEFAULT_ORDER: tuple[str, ...] = ("pp", "dp_replicate", "dp_shard", "dp", "sp", "tp")
HSDP_DIMS: tuple[str, str] = (MeshDim.DP_REPLICATE.value, MeshDim.DP_SHARD.value)
# not dims of their own: expert parallelism splits the data ranks into ep × edp
EXPERT_DIMS: tuple[str, str] = ("ep", "edp")
# the dims a legacy grid, mpu or mesh_param can state (no HSDP), in the default order
LEGACY_DIMS: tuple[str, ...] = ("pp", "dp", "sp", "tp")

# DeepSpeed's pipeline-topology axis -> mesh dim
AXIS_TO_DIM: dict[str, str] = {"pipe": "pp", "data": "dp", "model": "tp"}
DIM_TO_AXIS: dict[str, str] = {dim: axis for axis, dim in AXIS_TO_DIM.items()}
# names from DeepSpeed, Megatron, torchtitan and FSDP users may write for a dim -> the mesh dim
ALIASES: dict[str, str] = {
    **AXIS_TO_DIM,
    "fsdp": "dp_shard", "shard": "dp_shard", "hsdp": "dp_shard", "replicate": "dp_replicate", "ddp": "dp",
    "pipeline": "pp", "tensor": "tp", "sequence": "sp", "ulysses": "sp", "cp": "sp",
}

__all__ = ["ALIASES", "AXIS_TO_DIM", "DEFAULT_ORDER", "DIM_TO_AXIS", "EXPERT_DIMS", "HSDP_DIMS", "LEGACY_DIMS",
           "MESH_DIMS", "MeshDim"]
