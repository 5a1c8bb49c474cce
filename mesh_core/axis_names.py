"""The one list of mesh dim names, and the legacy names for them as data.

:class:`MeshDim` names every dim a mesh may declare (torchtitan's ``MeshAxisName`` is the model: a
``str`` enum, so ``MeshDim.TP == "tp"`` and either spelling works wherever a dim is asked for).
The legacy vocabularies map onto it here and nowhere else: DeepSpeed's pipeline-topology axes
(``'pipe'``, ``'data'``, ``'model'`` → ``pp``, ``dp``, ``tp``), the dims a legacy grid / mpu /
``mesh_param`` can state (:data:`LEGACY_DIMS`) and the names users bring from other frameworks
(``fsdp`` → ``dp_shard``, :data:`ALIASES`, for suggestions). (The codemods, which never import
``mesh_core``, keep a copy of :data:`AXIS_TO_DIM` in ``codemods.rules._grid_api``; a test holds the two
equal.)

Exported, each for its users outside ``mesh_core`` (tests/test_structure.py holds the count; the other
tables here are ``mesh_core``'s own, read by ``mesh_core.spec`` and ``mesh_core.config``):

- ``MeshDim`` — users naming a dim (docs/API.md)
- ``AXIS_TO_DIM`` — compat.topology, compat.engine_spec (a grid's axes as dims)
- ``DIM_TO_AXIS`` — compat.topology (dims as a grid's axes)
- ``LEGACY_DIMS`` — compat.engine_spec, .initialize, .mpu (what an mpu or ``mesh_param`` can state)
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
# what other frameworks call a dim (torch FSDP / HSDP / DDP, Megatron, DeepSpeed, torchtitan) -> the
# mesh dim; for suggestions ("hsdp", which is two dims, is answered in mesh_core.config.suggest_key)
ALIASES: dict[str, str] = {
    **AXIS_TO_DIM,
    "fsdp": "dp_shard",
    "shard": "dp_shard",
    "sharded": "dp_shard",
    "zero": "dp_shard",
    "ddp": "dp_replicate",
    "replicate": "dp_replicate",
    "replica": "dp_replicate",
    "replicas": "dp_replicate",
    "data_parallel": "dp",
    "data_parallel_size": "dp",
    "dp_size": "dp",
    "tensor": "tp",
    "tensor_parallel": "tp",
    "model_parallel": "tp",
    "mp": "tp",
    "tp_size": "tp",
    "autotp": "tp",
    "autotp_size": "tp",
    "pipeline": "pp",
    "pipeline_parallel": "pp",
    "pp_size": "pp",
    "num_stages": "pp",
    "sequence": "sp",
    "sequence_parallel": "sp",
    "sequence_parallel_size": "sp",
    "ulysses": "sp",
    "cp": "sp",
    "context_parallel": "sp",
}
# not a mesh dim: what MoE users may write for the expert split of the data ranks
EXPERT_ALIASES: dict[str, str] = {
    "expert": "ep",
    "experts": "ep",
    "moe": "ep",
    "expert_parallel": "ep",
    "ep_size": "ep",
}

__all__ = ["AXIS_TO_DIM", "DIM_TO_AXIS", "LEGACY_DIMS", "MeshDim"]
