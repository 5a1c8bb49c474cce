"""The mesh behind a runtime ``mpu`` value: what migrated DeepSpeed code calls instead of
``mpu.get_*()`` and the ``bwc_*`` helpers.

Inside DeepSpeed the mpu is a value known only at run time (``self.mpu``, a parameter,
``groups.mpu``, a module global): None, a ``PipelineParallelGrid``, a Megatron-style mpu, a test
MPU with only ``get_model_parallel_*``, compat's ``MeshMPU``, or the Ulysses
``parallel_state_sp`` module. :func:`mesh_of` turns any of them into something answering the mesh
queries (``get_group`` / ``size`` / ``get_rank`` / ``get_group_ranks``):

- None → None (callers keep their ``if mpu is not None`` handling);
- a :class:`~mesh_core.DeepSpeedDeviceMesh` → itself;
- an object exposing its mesh as ``__deepspeed_mesh__`` (compat's ``MeshMPU``) → that mesh;
- anything else → an :class:`MpuMesh` over it (one per mpu object), which answers each query with
  the mpu's own getter, called at query time.

``MpuMesh`` reads the mpu at every call instead of snapshotting its groups: Megatron's
``parallel_state`` is one module object whose groups change when it is re-initialised, and a test
MPU with only model/data-parallel groups, or a Megatron layout with context or expert parallelism,
is no row-major mesh (:meth:`DeepSpeedDeviceMesh.from_mpu` would raise where the legacy code ran).
Nothing here creates a process group or runs a collective.

Dims on an ``MpuMesh`` follow DeepSpeed's probe order (``deepspeed/utils/bwc.py``):

- ``"dp"``: ``get_data_parallel_*``; ``"sp"``: ``get_sequence_parallel_*``;
- ``"tp"``: ``get_tensor_model_parallel_*``, else ``get_slice_parallel_*``, else
  ``get_model_parallel_*`` (= ``bwc_tensor_model_parallel_*``);
- ``"pp"``: ``get_pipeline_model_parallel_*``, else ``get_pipe_parallel_*``; with neither, size 1
  and rank 0 (= ``bwc_pipeline_parallel_world_size``) and no group: :class:`NoPipelineGroupError`,
  an ``AssertionError`` as ``bwc_pipeline_parallel_group`` raised;
- ``("pp", "tp")`` — model parallel: ``get_model_parallel_*``, whatever the mpu means by it (pipe ×
  tensor for a grid, tensor for AutoTP and Megatron-style mpus, sequence for ``parallel_state_sp``);
  on a ``DeepSpeedDeviceMesh`` it is the flattened pp × tp group, as compat's ``MeshMPU`` serves it.
"""

from __future__ import annotations

import functools
import logging
import weakref
from typing import Any, Optional, Sequence, Union

import torch.distributed as dist

from ..renamed import TorchGetRank

logger = logging.getLogger(__name__)

MESH_ATTRIBUTE = "__deepspeed_mesh__"
MODEL_PARALLEL = ("pp", "tp")

Dims = Union[str, Sequence[str]]

# dims -> the mpu getter stems, in probe order ("get_<stem>_group", "get_<stem>_world_size", ...)
PROBE_ORDER: dict[tuple[str, ...], tuple[str, ...]] = {
    ("dp",): ("data_parallel",),
    ("sp",): ("sequence_parallel",),
    ("tp",): ("tensor_model_parallel", "slice_parallel", "model_parallel"),
    ("pp",): ("pipeline_model_parallel", "pipe_parallel"),
    MODEL_PARALLEL: ("model_parallel",),
}
# what a query answers when the mpu has none of the dim's getters (bwc_pipeline_parallel_world_size)
_ABSENT = {(("pp",), "world_size"): 1, (("pp",), "rank"): 0}

# id(mpu) -> (weak reference to the mpu, its view); keyed by identity, not by ``==``
_views: dict[int, tuple["weakref.ref[Any]", "MpuMesh"]] = {}


class NoPipelineGroupError(AssertionError, AttributeError):
    """The mpu has no pipeline-parallel group getter. DeepSpeed's ``bwc_pipeline_parallel_group``
    asserted there (``AssertionError``) and calling the missing getter raised ``AttributeError``;
    this error is both, so code written for either keeps working."""


def _key(dims: Dims) -> tuple[str, ...]:
    key = (dims,) if isinstance(dims, str) else tuple(dims)
    if key not in PROBE_ORDER:
        valid = ", ".join(repr(k[0] if len(k) == 1 else k) for k in PROBE_ORDER)
        raise ValueError(f"dims={dims!r} has no mpu getter; valid dims on an mpu are {valid}")
    return key


class MpuMesh(TorchGetRank):
    """Mesh queries answered by an mpu's own getters (see the module docstring for the dims)."""

    def __init__(self, mpu: Any) -> None:
        if mpu is None:
            raise ValueError("MpuMesh needs an mpu object, got None")
        self.mpu = mpu

    def __repr__(self) -> str:
        what = getattr(self.mpu, "__name__", None) or type(self.mpu).__name__
        return f"MpuMesh({what})"

    def _call(self, dims: Dims, what: str) -> Any:
        key = _key(dims)
        for stem in PROBE_ORDER[key]:
            getter = getattr(self.mpu, f"get_{stem}_{what}", None)
            if getter is not None:
                return getter()
        if (key, what) in _ABSENT:
            return _ABSENT[(key, what)]
        names = [f"get_{stem}_{what}" for stem in PROBE_ORDER[key]]
        if key == ("pp",):  # legacy: "mpu does not support pipeline parallel group"
            raise NoPipelineGroupError(
                f"mpu {self!r} does not support a pipeline parallel group: it has none of {names} "
                "(its pipeline size is 1 and its pipeline rank 0)"
            )
        raise AttributeError(f"mpu {self!r} has none of {names}, so it has no {what} along {dims!r}")

    @property
    def rank(self) -> int:
        """This process's global rank."""
        return dist.get_rank()

    def get_group(self, dims: Dims) -> Any:
        """The mpu's process group along ``dims`` (the very object its getter returns)."""
        return self._call(dims, "group")

    def size(self, dims: Dims) -> int:
        return self._call(dims, "world_size")

    def get_local_rank(self, dims: Dims) -> int:
        """This rank's index inside its group along ``dims``."""
        return self._call(dims, "rank")

    def get_group_ranks(self, dims: Dims) -> list[int]:
        """Global ranks of this rank's group along ``dims`` (the mpu's ``get_*_group_ranks`` if it
        has one, else read off the group without communicating)."""
        key = _key(dims)
        for stem in PROBE_ORDER[key]:
            getter = getattr(self.mpu, f"get_{stem}_group_ranks", None)
            if getter is not None:
                return getter()
        return list(dist.get_process_group_ranks(self.get_group(key)))


def _forget(ref: "weakref.ref[Any]", key: int, views: dict) -> None:
    """Drop the view of a collected mpu (``views`` bound early: this may run at interpreter exit)."""
    entry = views.get(key)
    if entry is not None and entry[0] is ref:
        del views[key]


def mesh_of(mpu: Any) -> Optional[Any]:
    """The mesh to query for ``mpu``: None for None, a ``DeepSpeedDeviceMesh`` itself, the mesh an
    object exposes as ``__deepspeed_mesh__``, else the (cached) :class:`MpuMesh` over ``mpu``."""
    if mpu is None:
        return None
    from ..device_mesh import DeepSpeedDeviceMesh

    if isinstance(mpu, (DeepSpeedDeviceMesh, MpuMesh)):
        return mpu
    exposed = getattr(mpu, MESH_ATTRIBUTE, None)
    if isinstance(exposed, DeepSpeedDeviceMesh):
        return exposed
    key = id(mpu)
    cached = _views.get(key)
    if cached is not None and cached[0]() is mpu:
        return cached[1]
    view = MpuMesh(mpu)
    try:
        ref = weakref.ref(mpu, functools.partial(_forget, key=key, views=_views))
    except TypeError:  # not weak-referenceable: a view costs nothing to rebuild
        return view
    _views[key] = (ref, view)
    return view


def is_sequence_parallel_state(mpu: Any) -> bool:
    """``mpu`` is DeepSpeed's Ulysses ``parallel_state_sp`` module (or one shaped like it), which
    DeepSpeed recognises by its ``initialize_sequence_parallel``."""
    return hasattr(mpu, "initialize_sequence_parallel")


def model_parallel_world_size(mpu: Any) -> int:
    """Legacy ``groups._get_model_parallel_world_size()`` for the engine's mpu: 1 without an mpu or
    with the Ulysses ``parallel_state_sp`` module, else the mpu's own model-parallel size
    (``mesh_of(mpu).size(("pp", "tp"))``: ``get_model_parallel_world_size()``, pipe × tensor for a
    grid, tensor for AutoTP and Megatron-style mpus)."""
    if mpu is None or is_sequence_parallel_state(mpu):
        return 1
    return mesh_of(mpu).size(MODEL_PARALLEL)
