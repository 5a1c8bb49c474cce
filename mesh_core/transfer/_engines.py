"""A weight transfer straight from DeepSpeed engines (or a module and its mesh) on either side.

:func:`transfer_weights` derives each side's layouts from this rank's engine (duck typing, no
import of deepspeed until a ZeRO-3 gather is needed):

- ZeRO-0/1/2 and plain modules: every rank of the side holds each parameter whole;
- ZeRO-3 (parameters carrying ``ds_id`` / ``ds_shape``): the full shape is ``ds_shape``, and the
  parameters are gathered with ``deepspeed.runtime.zero.GatheredParameters`` one group of at most
  ``bucket_bytes`` at a time (every rank of the engine takes part in each gather; the whole model is
  never materialised on one rank); a ZeRO-3 destination is written in the gathered group and
  re-partitioned from its first rank on leaving it;
- AutoTP layers (parameters carrying DeepSpeed's ``ds_autotp_universal_checkpoint_meta``): the
  logical shape and the partition dim of that metadata, split over the side's ``tp`` dim
  (uneven splits are refused).

Ranks of the other side learn these layouts in the transfer's agreement, so every rank of both
meshes makes the same one call, passing None for a side it is not on.
"""

from __future__ import annotations

import contextlib
from datetime import timedelta
from typing import Any, Iterator, Mapping, Optional, Sequence

import torch
import torch.distributed as dist

from ..spec import MeshSpec
from ._buckets import DEFAULT_BUCKET_BYTES, DEFAULT_WINDOW
from ._devices import WorldDevices
from ._in_job import ParamLayout, SpecLike, TensorMeta, TransferStats, _member, _spec, check_tensors, run_transfer

AUTOTP_META = "ds_autotp_universal_checkpoint_meta"  # deepspeed.checkpoint.constants.DS_AUTOTP_UC_META


class EngineSide:
    """One side of a transfer from this rank's engine or module (see the module docstring)."""

    def __init__(
        self,
        model: Any,
        spec: MeshSpec,
        names: Optional[Sequence[str]] = None,
        layouts: Optional[Mapping[str, ParamLayout]] = None,
    ) -> None:
        module = getattr(model, "module", model)
        if not isinstance(module, torch.nn.Module):
            raise TypeError(f"expected a DeepSpeed engine or a torch.nn.Module, got {type(model).__name__}")
        params = dict(module.named_parameters())
        if names is not None:
            params = {n: params[n] for n in names if n in params}
        self.params = params
        self.spec = spec
        self.problems: list[str] = []
        engine_spec = getattr(getattr(model, "mesh_device", None), "spec", None)
        if isinstance(engine_spec, MeshSpec) and engine_spec != spec:
            self.problems.append(
                f"the engine's mesh is {engine_spec.describe()}, but the transfer names {spec.describe()}"
            )
        if spec.dim_size("pp") > 1:
            self.problems.append(
                f"{spec.describe()}: pipeline engines are not supported; pass ParamLayouts with stage= to transfer()"
            )
        self.gather = any(_is_zero3(p) for p in params.values())
        self.layouts = {}
        self.shapes = {}
        for name, param in params.items():
            if layouts and name in layouts:  # a layout the caller knows (hand-written tensor-parallel layers)
                self.layouts[name] = layouts[name]
                continue
            self.layouts[name], self.shapes[name] = self._layout(name, param)

    def _layout(self, name: str, param: torch.nn.Parameter) -> tuple[ParamLayout, tuple[int, ...]]:
        local = tuple(param.ds_shape) if _is_zero3(param) else tuple(param.shape)
        meta = getattr(param, AUTOTP_META, None)
        if not isinstance(meta, Mapping) or meta.get("replicated") or meta.get("partition_dim") is None:
            return ParamLayout(local), local
        dim, sizes, full = meta["partition_dim"], list(meta.get("partition_sizes") or []), tuple(meta["logical_shape"])
        tp = self.spec.dim_size("tp")
        if len(sizes) != tp or len(set(sizes)) > 1:
            self.problems.append(
                f"AutoTP parameter {name!r} is split {sizes} along dim {dim}; only an even split over "
                f"the mesh's tp={tp} is supported"
            )
        return ParamLayout(full, shard_dim=dim, over=("tp",)), local

    def metas(
        self, spec: MeshSpec, rank: int, side: str, world: WorldDevices
    ) -> tuple[dict[str, TensorMeta], list[str]]:
        metas, problems = check_tensors(spec, rank, side, self.layouts, self.params, shapes=self.shapes, world=world)
        return metas, self.problems + problems

    @contextlib.contextmanager
    def tensors(self, names: Sequence[str]) -> Iterator[Mapping[str, torch.Tensor]]:
        if not self.gather:
            yield self.params
            return
        from deepspeed.runtime.zero import GatheredParameters  # only a ZeRO-3 engine gets here

        group = [self.params[n] for n in names if n in self.params]
        with torch.no_grad(), GatheredParameters(group, modifier_rank=0):
            yield self.params


def transfer_weights(
    src: SpecLike,
    dst: SpecLike,
    src_model: Any,
    dst_model: Any,
    *,
    names: Optional[Sequence[str]] = None,
    src_layouts: Optional[Mapping[str, ParamLayout]] = None,
    dst_layouts: Optional[Mapping[str, ParamLayout]] = None,
    bucket_bytes: int = DEFAULT_BUCKET_BYTES,
    window: int = DEFAULT_WINDOW,
    timeout: Optional[timedelta] = None,
) -> TransferStats:
    """Copy ``src_model``'s parameters into ``dst_model``'s (same names), from ``src``'s layout to ``dst``'s.

    Every rank of both meshes calls it; ``src_model`` / ``dst_model`` are this rank's engine (or
    module) of that side, None on a rank outside that mesh. ``names`` restricts the parameters moved
    (default: all of the source model's). ``src_layouts`` / ``dst_layouts`` give the layout of
    parameters the engine cannot describe (hand-written tensor-parallel layers), by name. Errors are raised as by :func:`~mesh_core.transfer.transfer`:
    the same :class:`~mesh_core.MeshSpecError` on every rank, before any message.
    """
    src_spec, dst_spec = _spec(src), _spec(dst)
    rank = dist.get_rank()
    sides = {}
    for side, spec, model, given in (
        ("source", src_spec, src_model, src_layouts),
        ("destination", dst_spec, dst_model, dst_layouts),
    ):
        if not _member(spec, rank):
            sides[side] = None
        elif model is None:
            sides[side] = _Missing(side, spec, rank)
        else:
            sides[side] = EngineSide(model, spec, names, given)
    known = {side: None if s is None or isinstance(s, _Missing) else s.layouts for side, s in sides.items()}
    flags = {side: {"gather": s.gather} for side, s in sides.items() if isinstance(s, EngineSide)}
    return run_transfer(
        src_spec, dst_spec, sides, known, bucket_bytes=bucket_bytes, window=window, timeout=timeout, flags=flags
    )


class _Missing:
    """A member rank that passed None for its model: a problem every participant hears of."""

    gather = False
    layouts: Mapping[str, ParamLayout] = {}

    def __init__(self, side: str, spec: MeshSpec, rank: int) -> None:
        self.problem = f"rank {rank} is in the {side} mesh {spec.describe()} but was given None for its {side} model"

    def metas(
        self, spec: MeshSpec, rank: int, side: str, world: WorldDevices
    ) -> tuple[dict[str, TensorMeta], list[str]]:
        return {}, [self.problem]

    def tensors(self, names: Sequence[str]):  # never reached: the agreement fails first
        raise AssertionError("no tensors")


def _is_zero3(param: torch.Tensor) -> bool:
    return hasattr(param, "ds_id") and hasattr(param, "ds_shape")
