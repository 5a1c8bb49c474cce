"""Move a model's weights from one mesh's layout to another's (RL post-training: actor → rollout).

Each parameter is described on each side by a :class:`ParamLayout`: its full shape, the tensor dim
(if any) split across some mesh dims (``tp`` by default), and the pipeline stage that holds it.
:func:`plan_transfer` is pure layout math over the two :class:`~mesh_core.MeshSpec` s: for every
rank of the destination mesh and every box of the full tensor it needs, which source rank sends
it (the rank itself when it holds the data, else the source replicas in turn, so the load is
spread). :func:`transfer` runs a plan with point-to-point messages on the world's default group,
which the group registry serves as WORLD itself: no communicator is created, and ranks that are in
neither mesh take no part. Ranks in one mesh only call it with the other side's tensors ``None``.

Every rank of both meshes must call :func:`transfer` with the same specs and layouts (the plan is
computed locally on each rank; message tags come from the plan order). Tensors must be the local
shards (contiguous or not); values arrive bit for bit (the sender casts to ``ParamLayout.dtype``
when one is given).
"""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence, Union

import torch
import torch.distributed as dist

from .layout import MeshLayout
from .spec import MeshSpec, MeshSpecError

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
    mesh_layout = MeshLayout(spec)
    shards = spec_size(spec, layout.over) if layout.shard_dim is not None else 1
    if layout.shard_dim is not None and layout.shape[layout.shard_dim] % shards:
        raise MeshSpecError(
            f"{side} parameter {name!r}: dim {layout.shard_dim} of shape {layout.shape} does not split evenly "
            f"over {'x'.join(layout.over)}={shards} of {spec.describe()}"
        )
    if layout.stage is not None and not 0 <= layout.stage < spec.dim_size("pp"):
        raise MeshSpecError(f"{side} parameter {name!r}: stage={layout.stage} but {spec.describe()} has pp={spec.dim_size('pp')}")
    out = []
    for rank in sorted(spec.ranks):
        if layout.stage is not None and mesh_layout.coordinate(rank).get("pp", 0) != layout.stage:
            continue
        box = [(0, s) for s in layout.shape]
        if layout.shard_dim is not None:
            index = mesh_layout.coordinate_of(rank, layout.over)
            step = layout.shape[layout.shard_dim] // shards
            box[layout.shard_dim] = (index * step, (index + 1) * step)
        out.append((rank, tuple(box)))
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
            raise MeshSpecError(f"parameter {name!r} has shape {s_layout.shape} at the source but {d_layout.shape} at the destination")
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


def _local(box: Box, shard: Box) -> tuple[slice, ...]:
    return tuple(slice(lo - slo, hi - slo) for (lo, hi), (slo, _) in zip(box, shard))


@dataclass
class TransferStats:
    sent: int = 0  # elements sent to other ranks
    received: int = 0
    copied: int = 0  # elements copied locally (source and destination on this rank)
    messages: int = 0


def transfer(
    src: SpecLike,
    dst: SpecLike,
    src_tensors: Optional[Mapping[str, torch.Tensor]],
    dst_tensors: Optional[Mapping[str, torch.Tensor]],
    src_layouts: Mapping[str, ParamLayout],
    dst_layouts: Optional[Mapping[str, ParamLayout]] = None,
    *,
    plan: Optional[list[Piece]] = None,
) -> TransferStats:
    """Copy the parameters from ``src``'s layout into ``dst_tensors`` (in place), over p2p messages.

    ``src_tensors`` / ``dst_tensors`` are this rank's shards by name (None on a rank outside that
    mesh). Pass ``plan`` (from :func:`plan_transfer`) to skip recomputing it every iteration.
    """
    dst_layouts = src_layouts if dst_layouts is None else dst_layouts
    pieces = plan_transfer(src, dst, src_layouts, dst_layouts) if plan is None else plan
    rank = dist.get_rank()
    stats = TransferStats()
    handles, landing = [], []
    for tag, piece in enumerate(pieces):
        if rank not in (piece.src, piece.dst):
            continue
        if piece.src == rank:
            if src_tensors is None or piece.name not in src_tensors:
                raise MeshSpecError(f"rank {rank} sends {piece.name!r} but was given no source tensor for it")
            data = _check(src_tensors[piece.name], piece.src_box, piece.name, "source")[_local(piece.box, piece.src_box)]
            dtype = src_layouts[piece.name].dtype
            data = data.to(dtype) if dtype is not None else data
        if piece.dst == rank:
            if dst_tensors is None or piece.name not in dst_tensors:
                raise MeshSpecError(f"rank {rank} receives {piece.name!r} but was given no destination tensor for it")
            target = _check(dst_tensors[piece.name], piece.dst_box, piece.name, "destination")[_local(piece.box, piece.dst_box)]
        numel = math.prod(hi - lo for lo, hi in piece.box)
        if piece.src == piece.dst:
            with torch.no_grad():
                target.copy_(data)
            stats.copied += numel
        elif piece.src == rank:
            buffer = data.detach().contiguous()
            handles.append(dist.isend(buffer, dst=piece.dst, tag=tag))
            landing.append((buffer, None))
            stats.sent += numel
            stats.messages += 1
        else:
            buffer = torch.empty(target.shape, dtype=target.dtype, device=target.device)
            handles.append(dist.irecv(buffer, src=piece.src, tag=tag))
            landing.append((buffer, target))
            stats.received += numel
            stats.messages += 1
    for handle in handles:
        handle.wait()
    with torch.no_grad():
        for buffer, target in landing:
            if target is not None:
                target.copy_(buffer)
    logger.debug("transfer on rank %d: %s", rank, stats)
    return stats


def _check(tensor: torch.Tensor, shard: Box, name: str, side: str) -> torch.Tensor:
    expected = tuple(hi - lo for lo, hi in shard)
    if tuple(tensor.shape) != expected:
        raise MeshSpecError(f"{side} tensor {name!r} on rank {dist.get_rank()} has shape {tuple(tensor.shape)}; its layout needs {expected}")
    return tensor.detach()
