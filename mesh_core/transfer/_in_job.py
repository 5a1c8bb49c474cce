"""Move a model's weights from one mesh's layout to another's (RL post-training: actor → rollout).

Each parameter is described on each side by a :class:`ParamLayout`: its full shape, the tensor dim
(if any) split across some mesh dims (``tp`` by default), and the pipeline stage that holds it.
:func:`plan_transfer` is pure layout math over the two :class:`~mesh_core.MeshSpec` s: for every
rank of the destination mesh and every box of the full tensor it needs, which source rank sends
it (the rank itself when it holds the data, else the source replicas in turn, so the load is
spread).

:func:`transfer` runs it on every rank of both meshes (ranks in neither take no part):

1. this rank's checks (every tensor it sends or receives: present, not ``None``, the shape its
   layout needs, a dtype it may travel / land in, a device its world moves and this rank owns:
   :mod:`mesh_core.transfer._devices`), then one agreement among all participants through the
   default store (:mod:`mesh_core.transfer._agree`): a problem on any rank, or ranks that disagree
   on the meshes, layouts or device types, is the same :class:`~mesh_core.MeshSpecError` on every
   participant before any message is sent;
2. the pieces of each (sender, receiver) pair travel in flat buckets of at most ``bucket_bytes``
   (:mod:`mesh_core.transfer._buckets`), point to point on the world's default group, each round's
   messages posted as one ``batch_isend_irecv`` (no communicator is created beside the world's),
   and are copied once into their destinations.

Values arrive bit for bit in the sender's dtype; between floating-point dtypes they are converted on
arrival like ``Tensor.copy_`` (bf16 → fp16 rounds); other dtype changes are refused (see
:mod:`mesh_core.transfer._agree`). :mod:`mesh_core.transfer._engines` builds both sides from
DeepSpeed engines.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, ContextManager, Iterator, Mapping, Optional, Protocol, Sequence, Union

import torch
import torch.distributed as dist

from ..layout import MeshLayout
from ..spec import MeshSpec, MeshSpecError
from ._agree import SIDES, Agreed, TensorMeta, agree, check_dtypes, conversion_refused, dtype_name, dtype_of, record_for
from ._buckets import (
    DEFAULT_BUCKET_BYTES,
    DEFAULT_WINDOW,
    BufferPool,
    box_numel,
    execute,
    local_copies,
    local_index,
    schedule,
)
from ._devices import WorldDevices, device_problems, device_text, tensor_device, world_devices

logger = logging.getLogger(__name__)

Box = tuple[tuple[int, int], ...]  # [lo, hi) per tensor dim
SpecLike = Union[MeshSpec, Any]  # a MeshSpec, or anything with a ``.spec`` (a mesh)


@dataclass(frozen=True)
class ParamLayout:
    """How one parameter is laid out on a mesh.

    ``shape`` is the full (unsharded) shape; ``shard_dim`` the tensor dim split evenly across the
    mesh dims ``over`` (None: every rank holds the whole tensor); ``stage`` the ``pp`` coordinate
    of the ranks holding it (None: every stage).
    """

    shape: tuple[int, ...]
    shard_dim: Optional[int] = None
    over: tuple[str, ...] = ("tp",)
    stage: Optional[int] = None
    dtype: Optional[torch.dtype] = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", tuple(int(s) for s in self.shape))
        object.__setattr__(self, "over", (self.over,) if isinstance(self.over, str) else tuple(self.over))
        if self.shard_dim is not None and not 0 <= self.shard_dim < len(self.shape):
            raise MeshSpecError(f"shard_dim={self.shard_dim} is out of range for shape {self.shape}")
        object.__setattr__(self, "_hash", hash((self.shape, self.shard_dim, self.over, self.stage, self.dtype)))

    def __hash__(self) -> int:  # looked up on every transfer call (the box cache): computed once
        return self._hash  # type: ignore[attr-defined]

    @functools.cached_property
    def fields(self) -> tuple:
        """The layout as JSON-able values (what the agreement exchanges)."""
        return (
            list(self.shape),
            self.shard_dim,
            list(self.over),
            self.stage,
            None if self.dtype is None else dtype_name(self.dtype),
        )


@dataclass(frozen=True)
class Piece:
    """One message: ``box`` of parameter ``name`` (full-tensor coordinates) from ``src`` to ``dst``."""

    name: str
    src: int
    dst: int
    box: Box
    src_box: Box  # the sender's shard, full-tensor coordinates
    dst_box: Box  # the receiver's shard


def _spec(mesh: SpecLike) -> MeshSpec:
    spec = mesh if isinstance(mesh, MeshSpec) else getattr(mesh, "spec", None)
    if not isinstance(spec, MeshSpec):
        raise MeshSpecError(f"expected a MeshSpec or a mesh, got {type(mesh).__name__}: {mesh!r}")
    return spec


def _holders(spec: MeshSpec, layout: ParamLayout, name: str, side: str) -> list[tuple[int, Box]]:
    """(rank, box) of every rank of ``spec`` holding a part of the parameter, in rank order."""
    out = []
    for rank in sorted(spec.ranks):
        box = own_box(spec, layout, rank, name, side)
        if box is not None:
            out.append((rank, box))
    return out


def spec_size(spec: MeshSpec, dims: Sequence[str]) -> int:
    return math.prod(spec.dim_size(d) for d in dims)


def _intersect(a: Box, b: Box) -> Optional[Box]:
    box = tuple((max(al, bl), min(ah, bh)) for (al, ah), (bl, bh) in zip(a, b))
    return box if all(lo < hi for lo, hi in box) else None


def plan_transfer(
    src: SpecLike,
    dst: SpecLike,
    src_layouts: Mapping[str, ParamLayout],
    dst_layouts: Optional[Mapping[str, ParamLayout]] = None,
) -> list[Piece]:
    """Every message moving the parameters from ``src``'s layout to ``dst``'s (pure; no dist)."""
    src_spec, dst_spec = _spec(src), _spec(dst)
    dst_layouts = src_layouts if dst_layouts is None else dst_layouts
    if set(src_layouts) != set(dst_layouts):
        missing = sorted(set(src_layouts) ^ set(dst_layouts))
        raise MeshSpecError(f"source and destination name different parameters; only on one side: {missing[:8]}")
    if src_spec.world_size != dst_spec.world_size:
        raise MeshSpecError(f"{src_spec.describe()} and {dst_spec.describe()} are meshes of different worlds")
    pieces: list[Piece] = []
    for name in sorted(src_layouts):
        s_layout, d_layout = src_layouts[name], dst_layouts[name]
        if s_layout.shape != d_layout.shape:
            raise MeshSpecError(
                f"parameter {name!r} has shape {s_layout.shape} at the source but {d_layout.shape} at the destination"
            )
        sources = _holders(src_spec, s_layout, name, "source")
        by_box: dict[Box, list[int]] = {}
        for rank, box in sources:
            by_box.setdefault(box, []).append(rank)
        for position, (rank, d_box) in enumerate(_holders(dst_spec, d_layout, name, "destination")):
            for s_box, replicas in by_box.items():
                box = _intersect(s_box, d_box)
                if box is None:
                    continue
                sender = rank if rank in replicas else replicas[position % len(replicas)]
                pieces.append(Piece(name, sender, rank, box, s_box, d_box))
    return pieces


_local = local_index  # kept for callers of the former private name


@dataclass
class TransferStats:
    """What one :func:`transfer` call did on this rank."""

    sent: int = 0  # elements sent to other ranks
    received: int = 0
    copied: int = 0  # elements copied locally (source and destination on this rank)
    messages: int = 0  # buckets sent + received
    sent_bytes: int = 0
    received_bytes: int = 0
    peak_buffer_bytes: int = 0  # the most bytes of bucket buffers alive at once on this rank


class Side(Protocol):
    """One side's tensors on this rank, as :func:`run_transfer` needs them."""

    layouts: Mapping[str, ParamLayout]
    gather: bool  # tensors are materialised per group of parameters (ZeRO-3)

    def metas(
        self, spec: MeshSpec, rank: int, side: str, world: WorldDevices
    ) -> tuple[dict[str, TensorMeta], list[str]]:
        """This rank's tensors' shape, travelling / landing dtype and device by name, and its problems."""

    def tensors(self, names: Sequence[str]) -> ContextManager[Mapping[str, torch.Tensor]]:
        """The tensors of ``names`` (full shards), valid inside the context."""


class TensorSide:
    """A side given as this rank's tensors by name and the side's layouts."""

    gather = False

    def __init__(self, tensors: Optional[Mapping[str, Any]], layouts: Optional[Mapping[str, ParamLayout]]) -> None:
        self._tensors = tensors
        self.layouts = layouts or {}
        self._given = layouts is not None

    def metas(
        self, spec: MeshSpec, rank: int, side: str, world: WorldDevices
    ) -> tuple[dict[str, TensorMeta], list[str]]:
        if not self._given:
            return {}, [
                f"rank {rank} is in the {side} mesh {spec.describe()} but was given None for its {side} layouts"
            ]
        if self._tensors is None:
            return {}, [
                f"rank {rank} is in the {side} mesh {spec.describe()} but was given None for its {side} tensors"
            ]
        return check_tensors(spec, rank, side, self.layouts, self._tensors, world=world)

    @contextlib.contextmanager
    def tensors(self, names: Sequence[str]) -> Iterator[Mapping[str, torch.Tensor]]:
        yield self._tensors  # type: ignore[misc]


def check_tensors(
    spec: MeshSpec,
    rank: int,
    side: str,
    layouts: Mapping[str, ParamLayout],
    tensors: Mapping[str, Any],
    shapes: Optional[Mapping[str, tuple[int, ...]]] = None,
    world: Optional[WorldDevices] = None,
) -> tuple[dict[str, TensorMeta], list[str]]:
    """This rank's checks of one side: every tensor its layout places here (``shapes`` overrides a
    tensor's shape; ``world``: what the world moves data on, default :func:`world_devices`)."""
    world = world_devices() if world is None else world
    metas: dict[str, TensorMeta] = {}
    problems: list[str] = []
    devices: dict[str, torch.device] = {}
    for name in sorted(layouts):
        layout = layouts[name]
        try:
            box = own_box(spec, layout, rank, name, side)
        except MeshSpecError as err:
            problems.append(str(err))
            continue
        if box is None:
            continue
        tensor = tensors.get(name, _MISSING)
        if tensor is _MISSING:
            problems.append(f"{side} tensor {name!r} is missing (its layout places a shard on this rank)")
            continue
        if not isinstance(tensor, torch.Tensor):
            problems.append(
                f"{side} tensor {name!r} is {'None' if tensor is None else type(tensor).__name__}, not a tensor"
            )
            continue
        need = tuple(hi - lo for lo, hi in box)
        shape = tuple(shapes[name]) if shapes and name in shapes else tuple(tensor.shape)
        if shape != need:
            problems.append(f"{side} tensor {name!r} has shape {shape}; its layout {layout.shape} needs {need} here")
            continue
        dtype = tensor.dtype
        if layout.dtype is not None and side == "source":
            refused = conversion_refused(tensor.dtype, layout.dtype)
            if refused:
                problems.append(
                    f"source tensor {name!r} is {tensor.dtype}, its layout casts it to {layout.dtype}: {refused}"
                )
                continue
            dtype = layout.dtype
        elif layout.dtype is not None and tensor.dtype != layout.dtype:
            problems.append(f"destination tensor {name!r} is {tensor.dtype}; its layout says {layout.dtype}")
            continue
        devices[name] = tensor_device(tensor)
        metas[name] = TensorMeta(shape, dtype, device_text(devices[name]))
    problems += device_problems(side, devices, world)
    if side == "destination":
        extra = sorted(set(tensors) - set(layouts))
        if extra:
            problems.append(f"destination tensors {extra[:6]} have no layout, so nothing would be written to them")
    return metas, problems


_MISSING = object()


def own_box(spec: MeshSpec, layout: ParamLayout, rank: int, name: str, side: str) -> Optional[Box]:
    """The box of the parameter ``rank`` holds on this side (None: none, another pipeline stage)."""
    problem = _layout_problem(spec, layout)
    if problem:
        raise MeshSpecError(f"{side} parameter {name!r}: {problem}")
    return _box(spec, layout, rank)


@functools.lru_cache(maxsize=1 << 16)  # every call of a training loop asks the same (spec, layout, rank)
def _box(spec: MeshSpec, layout: ParamLayout, rank: int) -> Optional[Box]:
    mesh_layout = _mesh_layout(spec)
    if layout.stage is not None and mesh_layout.coordinate(rank).get("pp", 0) != layout.stage:
        return None
    box = [(0, s) for s in layout.shape]
    if layout.shard_dim is not None:
        step = layout.shape[layout.shard_dim] // spec_size(spec, layout.over)
        index = mesh_layout.coordinate_of(rank, layout.over)
        box[layout.shard_dim] = (index * step, (index + 1) * step)
    return tuple(box)


@functools.lru_cache(maxsize=256)
def _mesh_layout(spec: MeshSpec) -> MeshLayout:
    return MeshLayout(spec)


def layout_from(fields: Sequence) -> ParamLayout:
    shape, shard_dim, over, stage, dtype = fields
    return ParamLayout(
        tuple(shape),
        shard_dim=shard_dim,
        over=tuple(over),
        stage=stage,
        dtype=None if dtype is None else dtype_of(dtype),
    )


def transfer(
    src: SpecLike,
    dst: SpecLike,
    src_tensors: Optional[Mapping[str, torch.Tensor]],
    dst_tensors: Optional[Mapping[str, torch.Tensor]],
    src_layouts: Optional[Mapping[str, ParamLayout]],
    dst_layouts: Optional[Mapping[str, ParamLayout]] = None,
    *,
    plan: Optional[list[Piece]] = None,
    bucket_bytes: int = DEFAULT_BUCKET_BYTES,
    window: int = DEFAULT_WINDOW,
    timeout: Optional[timedelta] = None,
) -> TransferStats:
    """Copy the parameters from ``src``'s layout into ``dst_tensors`` (in place), over p2p messages.

    Every rank of both meshes calls it, in the same order as its other transfers; ``src_tensors`` /
    ``dst_tensors`` are this rank's shards by name (None on a rank outside that mesh). The layouts
    must be given on the ranks of their mesh (ranks outside the source mesh may pass
    ``src_layouts=None``: they learn them in the agreement); ``dst_layouts`` defaults to
    ``src_layouts``. ``bucket_bytes`` bounds each message, ``window`` the buffers in flight per
    rank (at most ``window * bucket_bytes`` bytes), ``timeout`` the wait for the other participants
    (default: the store's). ``plan`` is accepted for compatibility: the plan is computed once per
    agreed layouts and cached. Raises :class:`~mesh_core.MeshSpecError` on every participant, before
    any message, for a bad tensor or layout on any of them.
    """
    src_spec, dst_spec = _spec(src), _spec(dst)
    dst_layouts = src_layouts if dst_layouts is None else dst_layouts
    rank = dist.get_rank()
    sides = {
        "source": TensorSide(src_tensors, src_layouts) if _member(src_spec, rank) else None,
        "destination": TensorSide(dst_tensors, dst_layouts) if _member(dst_spec, rank) else None,
    }
    return run_transfer(
        src_spec,
        dst_spec,
        sides,
        {"source": src_layouts, "destination": dst_layouts},
        bucket_bytes=bucket_bytes,
        window=window,
        timeout=timeout,
    )


def run_transfer(
    src_spec: MeshSpec,
    dst_spec: MeshSpec,
    sides: Mapping[str, Optional[Side]],
    known_layouts: Mapping[str, Optional[Mapping[str, ParamLayout]]],
    *,
    bucket_bytes: int = DEFAULT_BUCKET_BYTES,
    window: int = DEFAULT_WINDOW,
    timeout: Optional[timedelta] = None,
    flags: Optional[Mapping[str, Any]] = None,
) -> TransferStats:
    """:func:`transfer` over :class:`Side` s (this rank's side objects; None where not a member)."""
    if not isinstance(bucket_bytes, int) or bucket_bytes < 1 or not isinstance(window, int) or window < 1:
        raise MeshSpecError(f"bucket_bytes={bucket_bytes!r} and window={window!r} must be positive ints")
    rank = dist.get_rank()
    specs = {"source": src_spec, "destination": dst_spec}
    participants = sorted(set(src_spec.ranks) | set(dst_spec.ranks))
    if rank not in participants:
        return TransferStats()
    if dist.get_backend() == "fake":
        raise MeshSpecError("transfer moves data with messages; torch's fake backend sends none (use gloo or nccl)")
    if src_spec.world_size != dst_spec.world_size or src_spec.world_size != dist.get_world_size():
        raise MeshSpecError(
            f"{src_spec.describe()} and {dst_spec.describe()} must both be meshes of this world "
            f"of {dist.get_world_size()} ranks"
        )
    metas: dict[str, Optional[dict[str, TensorMeta]]] = {}
    problems: list[str] = []
    world = world_devices()
    for side in SIDES:
        if sides.get(side) is not None:
            metas[side], found = sides[side].metas(specs[side], rank, side, world)  # type: ignore[union-attr]
            problems += found
    layouts = {
        side: None if known_layouts.get(side) is None else {n: v.fields for n, v in known_layouts[side].items()}
        for side in SIDES
    }  # type: ignore[union-attr]
    record = record_for((src_spec, dst_spec), layouts, metas, problems, dict(flags or {}), world.fields())
    agreed, finish = agree(participants, record, key=f"{src_spec.describe()} -> {dst_spec.describe()}", timeout=timeout)
    try:
        stats = _run_agreed(agreed, src_spec, dst_spec, sides, rank, bucket_bytes, window)
    finally:
        finish()
    logger.debug("transfer on rank %d: %s", rank, stats)
    return stats


def _run_agreed(
    agreed: Agreed,
    src_spec: MeshSpec,
    dst_spec: MeshSpec,
    sides: Mapping[str, Optional[Side]],
    rank: int,
    bucket_bytes: int,
    window: int,
) -> TransferStats:
    """The messages of an agreed transfer, group by group."""
    prepared = _prepared(agreed, src_spec, dst_spec, bucket_bytes)
    stats = TransferStats()
    for names, pieces, buckets in prepared:
        with contextlib.ExitStack() as stack:
            tensors = {
                side: stack.enter_context(sides[side].tensors(names))  # type: ignore[union-attr]
                for side in SIDES
                if sides.get(side) is not None
            }
            source = _getter(tensors.get("source"))
            target = _getter(tensors.get("destination"))
            copied = []
            run = execute(
                buckets,
                source,
                target,
                prepared.wire,
                lambda: copied.append(local_copies(pieces, source, target, rank)),
                buffer_bytes=window * bucket_bytes,
                pool=prepared.pool,
            )
        stats.copied += sum(copied)
        stats.messages += run.messages
        stats.sent_bytes += run.sent_bytes
        stats.received_bytes += run.received_bytes
        stats.peak_buffer_bytes = max(stats.peak_buffer_bytes, run.peak_buffer_bytes)
        for p in pieces:
            if p.src != p.dst and rank in (p.src, p.dst):
                if p.src == rank:
                    stats.sent += box_numel(p.box)
                else:
                    stats.received += box_numel(p.box)
    return stats


class _Prepared(list):
    """(names, pieces, buckets) per group of parameters, and the travelling dtype by (name, sender)."""

    wire: Any
    pool: BufferPool


def _prepared(agreed: Agreed, src_spec: MeshSpec, dst_spec: MeshSpec, bucket_bytes: int) -> _Prepared:
    key = ("prepared", bucket_bytes)
    cached = agreed.cache
    if key in cached:
        return cached[key]
    src_layouts = {n: layout_from(v) for n, v in agreed.layouts["source"].items()}
    dst_layouts = {n: layout_from(v) for n, v in agreed.layouts["destination"].items()}
    pieces = plan_transfer(src_spec, dst_spec, src_layouts, dst_layouts)
    check_dtypes(pieces, agreed)
    dtypes = {key: dtype_of(name) for key, name in agreed.dtypes["source"].items()}
    prepared = _Prepared()
    prepared.wire = lambda name, src: dtypes[(name, src)]
    prepared.pool = BufferPool()
    itemsize = lambda name, src: dtypes[(name, src)].itemsize  # noqa: E731
    for names in _groups(src_layouts, agreed, bucket_bytes):
        chosen = set(names)
        group = [p for p in pieces if p.name in chosen]
        prepared.append((names, group, schedule(group, itemsize, bucket_bytes)))
    cached[key] = prepared
    return prepared


def _groups(layouts: Mapping[str, ParamLayout], agreed: Agreed, bucket_bytes: int) -> list[list[str]]:
    """One group of all parameters, or (a side gathers per group: ZeRO-3) groups of at most a bucket."""
    names = sorted(layouts)
    if not any((agreed.flags.get(side) or {}).get("gather") for side in SIDES):
        return [names]
    groups: list[list[str]] = [[]]
    size = 0
    for name in names:
        layout = layouts[name]
        nbytes = math.prod(layout.shape) * (layout.dtype or torch.float32).itemsize
        if groups[-1] and size + nbytes > bucket_bytes:
            groups.append([])
            size = 0
        groups[-1].append(name)
        size += nbytes
    return groups


def _getter(tensors: Optional[Mapping[str, torch.Tensor]]):
    def get(name: str) -> torch.Tensor:
        return tensors[name].detach()  # type: ignore[index]

    return get


def _member(spec: MeshSpec, rank: int) -> bool:
    return _mesh_layout(spec).contains(rank)


@functools.lru_cache(maxsize=1 << 16)
def _layout_problem(spec: MeshSpec, layout: ParamLayout) -> Optional[str]:
    shards = spec_size(spec, layout.over) if layout.shard_dim is not None else 1
    if layout.shard_dim is not None and layout.shape[layout.shard_dim] % shards:
        return (
            f"dim {layout.shard_dim} of shape {layout.shape} does not split evenly "
            f"over {'x'.join(layout.over)}={shards} of {spec.describe()}"
        )
    if layout.stage is not None and not 0 <= layout.stage < spec.dim_size("pp"):
        return f"stage={layout.stage} but {spec.describe()} has pp={spec.dim_size('pp')}"
    return None
