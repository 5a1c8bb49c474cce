"""HSDP under ZeRO: partition over ``dp_shard``, average gradients across ``dp_replicate``.

On a mesh declaring ``dp_replicate`` (R > 1) x ``dp_shard`` (S), DeepSpeed 0.19.8's ZeRO runs
unchanged with two groups instead of one (what MiCS did before it was removed):

- the *partition group* is this rank's ``(dp_shard, sp)`` group: the engine hands it to the ZeRO
  optimizer as ``dp_process_group`` and ``zero.Init`` partitions parameters over it, so every rank
  holds 1/S of the parameters (stage 3), gradients (stage 2, 3) and optimizer states (1, 2, 3), and
  ZeRO's all-gathers / reduce-scatters stay inside the shard group;
- the *replicate group* (``dp_replicate``) joins the ranks holding the same partition: after ZeRO
  averaged a gradient partition inside the shard group, it is all-reduced across the replicas and
  divided by R (stage 3: each reduced bucket, in ``partition_grads``; stage 1/2: the rank's
  partition at the start of ``step``, before the overflow check and the norm), so every replica
  applies the same update and the result is dp-only ZeRO's over R x S ranks. These per-step hooks
  sit on the HSDP optimizer instances only (:func:`hook_replica_average`): other optimizers run
  DeepSpeed's methods untouched, and an HSDP engine keeps averaging after ``compat.uninstall()``.

Checkpoints: the replica whose ``dp_replicate`` coordinate is 0 writes the S ZeRO partition files
(``zero_pp_rank_<shard rank>_...``); every replica reads them back. Between HSDP and dp-only ZeRO
(S files against R x S), convert through DeepSpeed's universal checkpoint (``ds_to_universal``).

:data:`WRAPPERS` lists the in-place wrappers :mod:`compat.install` puts on DeepSpeed's classes.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import logging
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch
import torch.distributed as dist

from mesh_core import DeepSpeedDeviceMesh, MeshSpec, MeshSpecError, default_mesh, torch_compat
from mesh_core.runtime_hooks import HPZ_DIMS, is_hsdp

logger = logging.getLogger(__name__)

SHARD_DIMS = HPZ_DIMS  # ("dp_shard", "sp"): the ZeRO partition group of an HSDP mesh
REPLICATE_DIM = "dp_replicate"


def zero_stage(config: dict) -> int:
    """The ZeRO stage a config asks for (``"zero_optimization": true`` is stage 1, as in deepspeed)."""
    section = config.get("zero_optimization")
    if isinstance(section, bool):
        return int(section)
    if isinstance(section, dict):
        return int(section.get("stage", 0))
    return 0


def hsdp_zero_config(config: dict, spec: MeshSpec) -> dict:
    """``config`` itself, after checking that ZeRO can run HSDP on ``spec``; raises otherwise.

    Pure: raises :class:`MeshSpecError` before any group is created, naming what to change.
    """
    stage = zero_stage(config)
    if not is_hsdp(spec) or stage == 0:
        return config
    layout = f"{spec.describe()} with zero_optimization.stage={stage}"
    flat = f'{{"mesh": {{"dp": {spec.dim_size("dp_replicate") * spec.dim_size("dp_shard")}}}}}'
    shard = spec.dim_size("dp_shard") * spec.dim_size("sp")
    if shard == 1:
        raise MeshSpecError(
            f"{layout} is not supported: dp_shard x sp = 1 leaves ZeRO nothing to shard inside a replica; "
            f"use dp_shard > 1, or a flat data-parallel dim, e.g. {flat}"
        )
    section = config["zero_optimization"] if isinstance(config["zero_optimization"], dict) else {}
    hpz = section.get("zero_hpz_partition_size", 1)
    if hpz not in (1, None):
        raise MeshSpecError(
            f"{layout} and zero_optimization.zero_hpz_partition_size={hpz} is not supported: HSDP already "
            f"partitions over dp_shard x sp = {shard} ranks (hpZ's secondary partition would be a second copy "
            f"of it); leave zero_hpz_partition_size out, or use a flat dim, e.g. {flat}, for hpZ"
        )
    offload = section.get("offload_optimizer") or {}
    if stage in (1, 2) and isinstance(offload, dict) and offload.get("device", "none") not in ("none", None):
        raise MeshSpecError(
            f"{layout} and offload_optimizer.device={offload.get('device')!r} is not supported: ZeRO-{stage} "
            "with an offloaded optimizer reduces gradients straight into the CPU partition and sums their "
            "norm while reducing, before a cross-replica average could run; use stage 3 (which averages "
            "each reduced bucket) or offload_optimizer.device='none'"
        )
    logger.info("HSDP %s: ZeRO partitions over %s, averages across %s", spec.describe(), SHARD_DIMS, REPLICATE_DIM)
    return config


# --- the groups of an HSDP engine --------------------------------------------------------------
@dataclass(frozen=True)
class HsdpGroups:
    """The two groups of one HSDP rank: ZeRO's partition group and the replicas of its partition."""

    shard: Any
    replicate: Any
    replicate_size: int
    replicate_rank: int

    @classmethod
    def of(cls, mesh: DeepSpeedDeviceMesh) -> "HsdpGroups":
        """This rank's groups on ``mesh`` (creates them on first request; every member calls it)."""
        return cls(
            shard=mesh.get_group(SHARD_DIMS),
            replicate=mesh.get_group(REPLICATE_DIM),
            replicate_size=mesh.size(REPLICATE_DIM),
            replicate_rank=mesh.get_local_rank(REPLICATE_DIM),
        )

    def average(self, tensors: list[torch.Tensor]) -> None:
        """Average ``tensors`` in place across the replicas (one all-reduce per dtype)."""
        by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
        for tensor in tensors:
            if tensor is not None and tensor.numel():
                by_dtype.setdefault(tensor.dtype, []).append(tensor)
        for group in by_dtype.values():
            flat = torch_compat.flatten_dense_tensors(group)
            dist.all_reduce(flat, group=self.replicate)
            flat.div_(self.replicate_size)
            for tensor, synced in zip(group, torch_compat.unflatten_dense_tensors(flat, group)):
                tensor.copy_(synced)


_optimizers: "weakref.WeakKeyDictionary[Any, HsdpGroups]" = weakref.WeakKeyDictionary()
_building: contextvars.ContextVar[Optional[HsdpGroups]] = contextvars.ContextVar("compat_hsdp_building", default=None)


def groups_of(optimizer: Any) -> Optional[HsdpGroups]:
    """The HSDP groups of a ZeRO optimizer built on an HSDP mesh, else None."""
    try:
        return _optimizers.get(optimizer)
    except TypeError:  # not weak-referenceable: not one of ours
        return None


def _hsdp_mesh() -> Optional[DeepSpeedDeviceMesh]:
    """The default mesh (the engine's, inside ``deepspeed.initialize``) when it is an HSDP mesh.

    Never builds one (``current_mesh()``'s world-mesh fallback is never HSDP, and a sub-world's
    ranks may call ``zero.Init`` alone)."""
    try:
        mesh = default_mesh()
    except MeshSpecError:
        return None
    if not is_hsdp(mesh.spec) or mesh.device_mesh is None:  # destroyed, or this rank is outside it
        return None
    return mesh


# --- wrappers (installed by compat.install) -----------------------------------------------------
def configure_zero_optimizer_wrapper(wrapped, instance, args, kwargs):
    """``DeepSpeedEngine._configure_zero_optimizer``: on an HSDP mesh, ZeRO's group is ``(dp_shard, sp)``."""
    mesh = _hsdp_mesh()
    if mesh is None or not instance.zero_optimization_stage():
        return wrapped(*args, **kwargs)
    if getattr(instance, "has_moe_layers", False):
        # expert parameters partition over their expert-data-parallel group, not dp_shard: the
        # cross-replica average would mix different partitions
        raise MeshSpecError(
            f"{mesh.spec.describe()} with MoE layers is not supported: ZeRO partitions expert parameters over "
            "their expert-data-parallel group, which spans the replicas; use a flat data-parallel dim, e.g. "
            f'{{"mesh": {{"dp": {mesh.size(("dp_replicate", "dp_shard"))}}}}}, for a model with MoE layers'
        )
    groups = HsdpGroups.of(mesh)
    saved = instance.seq_data_parallel_group
    instance.seq_data_parallel_group = groups.shard  # the engine passes it as dp_process_group
    token = _building.set(groups)
    try:
        optimizer = wrapped(*args, **kwargs)
    finally:
        _building.reset(token)
        instance.seq_data_parallel_group = saved
    _optimizers[optimizer] = groups
    hook_replica_average(optimizer, groups)
    logger.info(
        "HSDP ZeRO-%d on %s: partitions over %s",
        instance.zero_optimization_stage(),
        mesh.spec.describe(),
        mesh.get_group_ranks(SHARD_DIMS),
    )
    return optimizer


def configure_checkpointing_wrapper(wrapped, instance, args, kwargs):
    """``DeepSpeedEngine._configure_checkpointing``: replica 0 of each partition writes its ZeRO file."""
    result = wrapped(*args, **kwargs)
    groups = groups_of(getattr(instance, "optimizer", None))
    if groups is not None:
        instance.save_zero_checkpoint = groups.replicate_rank == 0
    return result


def zero_init_wrapper(wrapped, instance, args, kwargs):
    """``zero.Init.__init__``: on an HSDP mesh, partition over its ``(dp_shard, sp)`` group.

    Inside an HSDP engine's ZeRO set-up the engine's data-parallel group (the mpu's) is replaced;
    elsewhere only a call naming no group, under an HSDP current mesh, is changed.
    """
    call = inspect.signature(wrapped).bind(*args, **kwargs)
    named = [call.arguments.get(k) for k in ("data_parallel_group", "sequence_data_parallel_group")]
    building = _building.get()
    if building is not None:
        shard = building.shard
    elif named == [None, None]:
        mesh = _hsdp_mesh()
        shard = None if mesh is None else mesh.get_group(SHARD_DIMS)
    else:
        shard = None
    if shard is not None:
        call.arguments.pop("sequence_data_parallel_group", None)
        call.arguments["data_parallel_group"] = shard
    return wrapped(*call.args, **call.kwargs)


def _stage3_partitions(optimizer: Any, args: tuple, kwargs: dict) -> list[torch.Tensor]:
    """``partition_grads(params_to_release, grad_partitions)``'s reduced partitions."""
    return list(args[1] if len(args) > 1 else kwargs["grad_partitions"])


def _stage12_partition(optimizer: Any, args: tuple, kwargs: dict) -> list[torch.Tensor]:  # noqa: ARG001
    """A stage 1/2 optimizer's gradient partition of this rank (``averaged_gradients``)."""
    tensors: list[torch.Tensor] = []
    for grads in optimizer.averaged_gradients.values():
        if isinstance(grads, torch.Tensor):
            tensors.append(grads)
        elif grads is not None:
            tensors.extend(grads)
    return tensors


def hook_replica_average(optimizer: Any, groups: HsdpGroups) -> None:
    """Average ``optimizer``'s gradient partitions across the replicas on every step: stage 3 each
    reduced bucket in ``partition_grads``, stage 1/2 the rank's partition at the start of ``step``.

    On this instance only; the hook holds the optimizer weakly (no reference cycle keeps its
    tensors alive after the engine is dropped)."""
    if hasattr(optimizer, "partition_grads"):
        name, tensors_of = "partition_grads", _stage3_partitions
    elif hasattr(optimizer, "averaged_gradients"):
        name, tensors_of = "step", _stage12_partition
    else:  # ZeRO-3 without an optimizer (DeepSpeedZeRoOffload): no gradients to average
        return
    method = getattr(type(optimizer), name)
    owner = weakref.ref(optimizer)

    @functools.wraps(method)
    def averaged_first(*args: Any, **kwargs: Any) -> Any:
        self = owner()
        groups.average(tensors_of(self, args, kwargs))
        return method(self, *args, **kwargs)

    setattr(optimizer, name, averaged_first)


Wrapper = Callable[[Any, Any, tuple, dict], Any]
# module -> (class, method, wrapper)
WRAPPERS: dict[str, list[tuple[str, str, Wrapper]]] = {
    "deepspeed.runtime.engine": [
        ("DeepSpeedEngine", "_configure_zero_optimizer", configure_zero_optimizer_wrapper),
        ("DeepSpeedEngine", "_configure_checkpointing", configure_checkpointing_wrapper),
    ],
    "deepspeed.runtime.zero.partition_parameters": [("Init", "__init__", zero_init_wrapper)],
}
