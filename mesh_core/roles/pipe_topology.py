"""The ``topology=`` a pipeline module takes, stated in mesh dims: :func:`pipeline_topology`.

DeepSpeed's ``PipelineModule(topology=...)`` reads a topology object: named axes laid out row-major
over ranks (``'pipe'``, ``'data'`` and, with tensor parallelism, ``'model'``), queried for axis
sizes, coordinates, rank lists and the checkpoint names (``get_rank_repr``). A
:class:`PipelineTopology` is that object for mesh sizes ``pp`` / ``dp`` / ``tp`` — pure rank math,
no process group, no world-size check (the grid that the module builds from it checks) — with the
same axes, answers and exceptions as DeepSpeed 0.19.8's ``PipeModelDataParallelTopology(num_pp,
num_mp, num_dp)`` (``tp`` given, even 1: the ``'model'`` axis is kept, so checkpoint names are the
same) and ``PipeDataParallelTopology(num_pp, num_dp)`` (``tp`` omitted). Legacy rank lookups scan
every rank; these are O(number of axes) (``mapping`` is still built, on first use). The shim's
``ProcessTopology`` is this class too (:mod:`compat.topology`).
"""

from __future__ import annotations

import math
from collections import namedtuple
from functools import cached_property
from itertools import product
from typing import Any, Iterable, Optional

import numpy as np

from .. import row_major

__all__ = ["PipelineTopology", "exact_int", "pipeline_topology"]


# what _setup derives from ``axes`` / ``dims`` (the queries read these)
_DERIVED_FIELDS = frozenset({"_axis_index", "_strides", "_size"})


class PipelineTopology:
    """Named axes over ranks ``0..N-1``, row-major (the last axis varies fastest).

    A subclass that skips ``__init__`` and sets ``axes`` / ``dims`` itself (as DeepSpeed's own
    topology subclasses may) is served as in DeepSpeed: the derived lookup tables are built from its
    attributes on first use; a ``ProcessCoord`` or ``mapping`` it sets itself stays its own.
    """

    def __init__(self, axes: list[str], dims: list[int]) -> None:
        self._setup(axes, dims)

    def __getattr__(self, name: str) -> Any:
        # only reached for attributes the instance lacks: a subclass that never ran _setup
        own = self.__dict__
        if name in _DERIVED_FIELDS and "axes" in own and "dims" in own:
            mapping = own.get("mapping")
            coord = own.get("ProcessCoord")
            self._setup(own["axes"], own["dims"])
            if coord is not None:  # its own coordinate type and mapping win
                self.ProcessCoord = coord
            if mapping is not None:
                self.mapping = mapping
            return own[name]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def _setup(self, axes: list[str], dims: list[int]) -> None:
        self.axes = axes  # by reference, as in DeepSpeed
        self.dims = dims
        self.ProcessCoord = namedtuple("ProcessCoord", axes)  # type: ignore[misc]
        self._axis_index = {a: i for i, a in enumerate(axes)}
        self._strides = row_major.strides(dims)
        self._size = math.prod(dims)

    @cached_property
    def mapping(self) -> dict[Any, int]:
        """``ProcessCoord`` → rank for every rank, in rank order (O(N); built on first use)."""
        return {self.ProcessCoord(*c): r for r, c in enumerate(product(*[range(d) for d in self.dims]))}

    def get_rank(self, **coord_kwargs: int) -> int:
        if len(coord_kwargs) != len(self.axes):
            raise ValueError("get_rank() does not support slices. Use filter_match())")
        key = self.ProcessCoord(**coord_kwargs)  # TypeError for an unknown axis, as in DeepSpeed
        coord = [exact_int(c) for c in key]
        if not all(c is not None and 0 <= c < d for c, d in zip(coord, self.dims)):
            raise AssertionError(f"key {coord_kwargs} invalid")
        return row_major.flat_index(coord, self._strides)  # type: ignore[arg-type]

    def get_axis_names(self) -> list[str]:
        return self.axes

    def get_rank_repr(
        self, rank: int, omit_axes: Iterable[str] = ("data", "pipe"), inner_sep: str = "_", outer_sep: str = "-"
    ) -> str:
        omit = frozenset(omit_axes)
        axes = [ax for ax in self.axes if ax not in omit]
        coord = self.get_coord(rank) if axes else None  # DeepSpeed looks the rank up per kept axis
        return outer_sep.join(f"{ax}{inner_sep}{getattr(coord, ax):02d}" for ax in axes)

    def get_dim(self, axis: str) -> int:
        """Length of ``axis``; 0 for an axis the topology lacks (DeepSpeed's behaviour)."""
        index = self._axis_index.get(axis)
        return 0 if index is None else self.dims[index]

    def get_coord(self, rank: int) -> Any:
        index = exact_int(rank)
        if index is None or not 0 <= index < self._size:
            raise ValueError(f"rank {rank} not found in topology.")
        return self.ProcessCoord(*row_major.coords(index, self.dims, self._strides))

    def get_axis_comm_lists(self, axis: str) -> list[list[int]]:
        """Rank lists that differ only in ``axis`` (``[]`` for an unknown axis)."""
        index = self._axis_index.get(axis)
        if index is None:
            return []
        return np.moveaxis(row_major.rank_grid(self.dims), index, -1).reshape(-1, self.dims[index]).tolist()

    def filter_match(self, **filter_kwargs: int) -> list[int]:
        for key in filter_kwargs:
            if key not in self._axis_index:
                raise AttributeError(f"'ProcessCoord' object has no attribute '{key}'")
        ranks = row_major.rank_grid(self.dims)
        index = tuple(
            _matching(filter_kwargs[a], d) if a in filter_kwargs else slice(None) for a, d in zip(self.axes, self.dims)
        )
        return np.sort(ranks[index].reshape(-1)).tolist()

    def get_axis_list(self, axis: str, idx: int) -> list[int]:
        """All ranks whose coordinate on ``axis`` is ``idx`` (ValueError for an unknown axis)."""
        axis_num = self.axes.index(axis)
        ranks = row_major.rank_grid(self.dims)
        return ranks.take(_matching(idx, self.dims[axis_num]), axis=axis_num).reshape(-1).tolist()

    def world_size(self) -> int:
        return self._size

    def __str__(self) -> str:
        return str(self.mapping)


def exact_int(value: Any) -> Optional[int]:
    """``value`` as an int if it equals one, else None (DeepSpeed finds coordinates by ``==``, so
    ``1.0``, ``True`` and ``np.int64(1)`` all mean 1)."""
    try:
        index = int(value)
    except (TypeError, ValueError, OverflowError):
        return None
    return index if index == value else None


def _matching(value: Any, dim: int) -> list[int]:
    index = exact_int(value)
    return [index] if index is not None and 0 <= index < dim else []


def pipeline_topology(*, pp: int, dp: int, tp: Optional[int] = None) -> PipelineTopology:
    """The pipeline topology of ``pp`` stages × ``dp`` × ``tp`` (axes ``pipe, data[, model]``)."""
    if tp is None:
        return PipelineTopology(["pipe", "data"], [pp, dp])
    return PipelineTopology(["pipe", "data", "model"], [pp, dp, tp])
