"""The Megatron-style ``mpu`` protocol, both ways.

- :class:`MeshMPU` serves every method DeepSpeed 0.19.8 calls or probes on an ``mpu`` (engine,
  ZeRO, pipe engine, checkpointing, MoE, the ``bwc`` helpers) from a mesh.
- :func:`mesh_from_mpu` reads a user's existing ``mpu`` groups and builds the equivalent mesh,
  adopting the mpu's communicators instead of creating new ones.

The ``bwc_*`` functions are DeepSpeed's probe order for mpu objects (``deepspeed.utils.bwc``).
"""

from __future__ import annotations

import logging
from typing import Any, Optional

import torch.distributed as dist

from mesh_core import DeepSpeedDeviceMesh, MeshSpecError
from mesh_core.axis_names import LEGACY_DIMS
from mesh_core.runtime_hooks import NoPipelineGroupError

from .device import default_device_type

logger = logging.getLogger(__name__)

__all__ = [
    "MeshMPU",
    "bwc_pipeline_parallel_group",
    "bwc_pipeline_parallel_world_size",
    "bwc_tensor_model_parallel_group",
    "bwc_tensor_model_parallel_rank",
    "bwc_tensor_model_parallel_world_size",
    "mesh_from_mpu",
]


# --- DeepSpeed's probe order (deepspeed/utils/bwc.py) -----------------------------------------
def bwc_tensor_model_parallel_rank(mpu: Any = None) -> int:
    if mpu is None:
        return 0
    if hasattr(mpu, "get_tensor_model_parallel_rank"):
        return mpu.get_tensor_model_parallel_rank()
    if hasattr(mpu, "get_slice_parallel_rank"):
        return mpu.get_slice_parallel_rank()
    return mpu.get_model_parallel_rank()


def bwc_tensor_model_parallel_world_size(mpu: Any = None) -> int:
    if mpu is None:
        return 1
    if hasattr(mpu, "get_tensor_model_parallel_world_size"):
        return mpu.get_tensor_model_parallel_world_size()
    if hasattr(mpu, "get_slice_parallel_world_size"):
        return mpu.get_slice_parallel_world_size()
    return mpu.get_model_parallel_world_size()


def bwc_tensor_model_parallel_group(mpu: Any = None) -> Any:
    if mpu is None:
        return None
    if hasattr(mpu, "get_tensor_model_parallel_group"):
        return mpu.get_tensor_model_parallel_group()
    if hasattr(mpu, "get_slice_parallel_group"):
        return mpu.get_slice_parallel_group()
    return mpu.get_model_parallel_group()


def bwc_pipeline_parallel_world_size(mpu: Any = None) -> int:
    if mpu is not None:
        if hasattr(mpu, "get_pipeline_model_parallel_world_size"):
            return mpu.get_pipeline_model_parallel_world_size()
        if hasattr(mpu, "get_pipe_parallel_world_size"):
            return mpu.get_pipe_parallel_world_size()
    return 1


def bwc_pipeline_parallel_group(mpu: Any = None) -> Any:
    if mpu is None:
        return None
    if hasattr(mpu, "get_pipeline_model_parallel_group"):
        return mpu.get_pipeline_model_parallel_group()
    if hasattr(mpu, "get_pipe_parallel_group"):
        return mpu.get_pipe_parallel_group()
    raise NoPipelineGroupError(  # DeepSpeed asserts here; the error is an AssertionError too
        f"mpu does not support pipeline parallel group: {type(mpu).__name__} has neither "
        "get_pipeline_model_parallel_group nor get_pipe_parallel_group"
    )


# --- mesh -> mpu ---------------------------------------------------------------------------
MODEL_PARALLEL_DIMS = ("pp", "tp")
MPU_DIMS = LEGACY_DIMS
SEQUENCE_DATA_DIMS = ("dp", "sp")


PIPELINE_GETTERS = (
    "get_pipe_parallel_group",
    "get_pipe_parallel_world_size",
    "get_pipe_parallel_rank",
    "get_pipeline_model_parallel_group",
    "get_pipeline_model_parallel_world_size",
    "get_pipeline_model_parallel_rank",
    "get_stage_id",
)


class _PipelineGetter:
    """A pipeline getter of :class:`MeshMPU`; absent (``AttributeError``, so ``hasattr`` is False)
    on an instance standing for an mpu that had no pipeline getters."""

    def __init__(self, name: str, method: Any) -> None:
        self.name, self.method = name, method
        self.__doc__ = method.__doc__

    def __get__(self, instance: Any, owner: Optional[type] = None) -> Any:
        if instance is None:
            return self.method
        if not instance.__dict__.get("_pipeline_getters", True):
            raise AttributeError(f"{instance!r} stands for an mpu without pipeline getters; it has no {self.name}")
        return self.method.__get__(instance, owner)


class MeshMPU:
    """A Megatron-style ``mpu`` served from a :class:`~mesh_core.DeepSpeedDeviceMesh`.

    Meanings (mesh dims):

    - data parallel: ``"dp"`` (batch size and data sampler; SP peers share samples);
    - tensor / slice parallel: ``"tp"``; pipeline: ``"pp"``; sequence: ``"sp"``;
    - sequence-data parallel (ZeRO partitioning, gradient reduction): ``("dp", "sp")``;
    - **model parallel: ``("pp", "tp")``**, every rank holding a distinct part of the model. DeepSpeed
      all-reduces overflow flags and gradient / weight norms over this group, so it must span the
      pipeline stages as well as TP (as the pipeline grid's ``get_model_parallel_*`` do); without
      pipelining it is exactly TP (as for AutoTP's ``groups`` mpu). Code that wants the TP rank
      (ZeRO 1/2, checkpoint TP shards, MoE) goes through the ``bwc`` helpers, which find
      ``get_tensor_model_parallel_*`` first.

    Unlike 0.19.8's grid it also has ``get_tensor_model_parallel_group`` and
    ``get_pipeline_model_parallel_group``; unlike the Ulysses ``parallel_state_sp`` module it has no
    ``initialize_sequence_parallel`` (DeepSpeed would then drop the DP group).

    ``pipeline_getters=False`` (what the shim passes for a user's mpu that had none, on a mesh with
    pp = 1): the pipeline getters are absent, so DeepSpeed's ``bwc`` helpers answer size 1 and
    assert for the group, as they did on that mpu.

    Construction is collective (it resolves every group, including size-1 ones, up front).
    """

    def __init__(self, mesh: DeepSpeedDeviceMesh, *, pipeline_getters: bool = True) -> None:
        if not isinstance(mesh, DeepSpeedDeviceMesh):
            raise TypeError(f"MeshMPU needs a DeepSpeedDeviceMesh, got {type(mesh).__name__}: {mesh!r}")
        if not pipeline_getters and mesh.spec.dim_size("pp") != 1:
            raise MeshSpecError(
                f"{mesh.spec.describe()} has pp={mesh.spec.dim_size('pp')}; its mpu needs the "
                "pipeline getters (pipeline_getters=False is for pp=1)"
            )
        self._pipeline_getters = pipeline_getters
        self.mesh = mesh
        self._groups = {  # collective: every rank resolves every group, members or not
            dims: mesh.ensure_group(dims) for dims in ("dp", "tp", "pp", "sp", SEQUENCE_DATA_DIMS, MODEL_PARALLEL_DIMS)
        }
        if not mesh.is_member:
            raise MeshSpecError(f"rank {mesh.rank} is not a member of {mesh.spec.describe()}; it has no mpu there")
        self._sizes = {dims: mesh.size(dims) for dims in self._groups}
        self._ranks = {dims: mesh.get_local_rank(dims) for dims in self._groups}

    def __repr__(self) -> str:
        return f"MeshMPU({self.mesh!r})"

    @property
    def __deepspeed_mesh__(self) -> DeepSpeedDeviceMesh:
        """The mesh, for ``mesh_core.mesh_of`` (migrated DeepSpeed code queries it directly)."""
        return self.mesh

    def get_global_rank(self) -> int:
        return self.mesh.rank

    # data parallel
    def get_data_parallel_group(self) -> Any:
        return self._groups["dp"]

    def get_data_parallel_world_size(self) -> int:
        return self._sizes["dp"]

    def get_data_parallel_rank(self) -> int:
        return self._ranks["dp"]

    def get_data_parallel_group_ranks(self) -> list[int]:
        return self.mesh.get_group_ranks("dp")

    # model parallel = pipe x tensor (see the class docstring)
    def get_model_parallel_group(self) -> Any:
        return self._groups[MODEL_PARALLEL_DIMS]

    def get_model_parallel_world_size(self) -> int:
        return self._sizes[MODEL_PARALLEL_DIMS]

    def get_model_parallel_rank(self) -> int:
        return self._ranks[MODEL_PARALLEL_DIMS]

    # tensor (slice) parallel
    def get_tensor_model_parallel_group(self) -> Any:
        return self._groups["tp"]

    def get_tensor_model_parallel_world_size(self) -> int:
        return self._sizes["tp"]

    def get_tensor_model_parallel_rank(self) -> int:
        return self._ranks["tp"]

    def get_tensor_model_parallel_src_rank(self) -> int:
        """Global rank of TP rank 0 of this rank's TP group."""
        return min(self.mesh.get_group_ranks("tp"))

    get_slice_parallel_group = get_tensor_model_parallel_group
    get_slice_parallel_world_size = get_tensor_model_parallel_world_size
    get_slice_parallel_rank = get_tensor_model_parallel_rank

    # pipeline
    def get_pipe_parallel_group(self) -> Any:
        return self._groups["pp"]

    def get_pipe_parallel_world_size(self) -> int:
        return self._sizes["pp"]

    def get_pipe_parallel_rank(self) -> int:
        return self._ranks["pp"]

    get_pipeline_model_parallel_group = get_pipe_parallel_group
    get_pipeline_model_parallel_world_size = get_pipe_parallel_world_size
    get_pipeline_model_parallel_rank = get_pipe_parallel_rank

    def get_stage_id(self) -> int:
        return self._ranks["pp"]

    # sequence parallel (Ulysses) and sequence-data parallel (ZeRO)
    def get_sequence_parallel_group(self) -> Any:
        return self._groups["sp"]

    def get_sequence_parallel_world_size(self) -> int:
        return self._sizes["sp"]

    def get_sequence_parallel_rank(self) -> int:
        return self._ranks["sp"]

    def get_sequence_data_parallel_group(self) -> Any:
        return self._groups[SEQUENCE_DATA_DIMS]

    def get_sequence_data_parallel_world_size(self) -> int:
        return self._sizes[SEQUENCE_DATA_DIMS]

    def get_sequence_data_parallel_rank(self) -> int:
        return self._ranks[SEQUENCE_DATA_DIMS]


for _name in PIPELINE_GETTERS:
    setattr(MeshMPU, _name, _PipelineGetter(_name, MeshMPU.__dict__[_name]))
del _name


# --- mpu -> mesh ---------------------------------------------------------------------------
def _mpu_groups(mpu: Any) -> dict[str, Any]:
    """The mpu's groups by mesh dim (this rank's view); dims the mpu lacks are left out."""
    found: dict[str, Any] = {}
    what = getattr(mpu, "__name__", None) or type(mpu).__name__
    if hasattr(mpu, "initialize_sequence_parallel"):
        raise MeshSpecError(
            f"mpu {what} is DeepSpeed's Ulysses sequence-parallel module; build the mesh with "
            "DeepSpeedDeviceMesh.build(sp=...) instead"
        )
    if not hasattr(mpu, "get_data_parallel_group"):
        raise MeshSpecError(f"mpu {what} has no get_data_parallel_group(); it is not a Megatron-style mpu")
    found["dp"] = mpu.get_data_parallel_group()
    # the order of deepspeed.utils.bwc.bwc_tensor_model_parallel_group; get_model_parallel_group
    # last and only when the mpu reports a model-parallel size > 1 (mpus whose size is 1 often hand
    # back the world group there: deepspeed's own DummyMPU does)
    for name in ("get_tensor_model_parallel_group", "get_slice_parallel_group"):
        if hasattr(mpu, name):
            found["tp"] = getattr(mpu, name)()
            break
    else:
        if (
            hasattr(mpu, "get_model_parallel_group")
            and int(getattr(mpu, "get_model_parallel_world_size", lambda: 1)()) > 1
        ):
            found["tp"] = mpu.get_model_parallel_group()
    for name in ("get_pipeline_model_parallel_group", "get_pipe_parallel_group"):
        if hasattr(mpu, name):
            found["pp"] = getattr(mpu, name)()
            break
    if hasattr(mpu, "get_sequence_parallel_group"):
        found["sp"] = mpu.get_sequence_parallel_group()
    return {dim: g for dim, g in found.items() if g is not None}


def has_pipeline_getters(mpu: Any) -> bool:
    """``mpu`` has a pipeline getter DeepSpeed's ``bwc`` helpers probe for."""
    return any(
        hasattr(mpu, name)
        for name in (
            "get_pipeline_model_parallel_group",
            "get_pipe_parallel_group",
            "get_pipeline_model_parallel_world_size",
            "get_pipe_parallel_world_size",
        )
    )


def mesh_from_mpu(mpu: Any, *, device_type: Optional[str] = None, check_agreement: bool = True) -> DeepSpeedDeviceMesh:
    """A mesh reproducing ``mpu``'s groups (dp, tp, pp and sp where the mpu has them).

    Sizes come from the sizes of this rank's groups and the dim order from their rank strides (a
    row-major mesh over ranks 0..W-1). The mesh adopts the mpu's communicators, so no new group is
    created for them. Raises :class:`~mesh_core.MeshSpecError` if the groups are not the groups of
    a row-major mesh. Collective: every rank must call it (with ``check_agreement`` the ranks also
    all-reduce their inferred layout, so a rank-dependent mismatch fails everywhere, not in a hang).
    ``device_type`` defaults to the default group's collective device (cuda under NCCL).
    """
    if not dist.is_available() or not dist.is_initialized():
        raise MeshSpecError("torch.distributed is not initialised; initialise it before mesh_from_mpu")
    _mpu_groups(mpu)  # the compat-specific checks (the Ulysses module is not an mpu here)
    mesh = DeepSpeedDeviceMesh.from_mpu(  # type: ignore[attr-defined]
        mpu, device_type=device_type or default_device_type(), check_agreement=check_agreement
    )
    logger.debug("mesh_from_mpu: %s from %s", mesh.spec.describe(), type(mpu).__name__)
    return mesh
