"""The ``topology=`` a pipeline module takes, stated in mesh dims: :func:`pipeline_topology`.

DeepSpeed's ``PipelineModule(topology=...)`` reads a topology object: named axes laid out row-major
over ranks (``'pipe'``, ``'data'`` and, with tensor parallelism, ``'model'``), queried for axis
sizes, coordinates, rank lists and the checkpoint names (``get_rank_repr``). A
:class:`PipelineTopology` is that object for mesh sizes ``pp`` / ``dp`` / ``tp`` — pure rank math,
no process group, no world-size check (the grid that the module builds from it checks) — with the
same axes, answers and exceptions as DeepSpeed 0.19.8's ``PipeModelDataParallelTopology(num_pp,
num_mp, num_dp)`` (``tp`` given, even 1: the ``'model'`` axis is kept, so checkpoint names are the
same) and ``PipeDataParallelTopology(num_pp, num_dp)`` (``tp`` omitted). Legacy rank lookups scan
every rank; these are O(number of axes) (``mapping`` is still built, on first use).
"""
from __future__ import annotations

import math
from collections import namedtuple
from functools import cached_property
from itertools import product
from typing import Any, Iterable, Optional

AXIS_OF_DIM = {"pp": "pipe", "dp": "data", "tp": "model"}


class PipelineTopology:
    """Named axes over ranks ``0..N-1``, row-major (the last axis varies fastest)."""

    def __init__(self, axes: list[str], dims: list[int]) -> None:
        self.axes = axes
        self.dims = dims
        self.ProcessCoord = namedtuple("ProcessCoord", axes)  # type: ignore[misc]
        self._index = {a: i for i, a in enumerate(axes)}
        self._strides = [math.prod(dims[i + 1:]) for i in range(len(dims))]
        self._size = math.prod(dims)

    @cached_property
    def mapping(self) -> dict[Any, int]:
        """``ProcessCoord`` → rank for every rank, in rank order."""
        return {self.ProcessCoord(*c): r for r, c in enumerate(product(*[range(d) for d in self.dims]))}

    def get_rank(self, **coord_kwargs: int) -> int:
        if len(coord_kwargs) != len(self.axes):
            raise ValueError("get_rank() does not support slices. Use filter_match())")
        key = self.ProcessCoord(**coord_kwargs)  # TypeError for an unknown axis
        if key not in self.mapping:
            raise AssertionError(f"key {coord_kwargs} invalid")
        return self.mapping[key]

    def get_axis_names(self) -> list[str]:
        return self.axes

    def get_rank_repr(self, rank: int, omit_axes: Iterable[str] = ("data", "pipe"), inner_sep: str = "_",
                      outer_sep: str = "-") -> str:
        omit = frozenset(omit_axes)
        kept = [a for a in self.axes if a not in omit]
        return outer_sep.join(f"{a}{inner_sep}{getattr(self.get_coord(rank=rank), a):02d}" for a in kept)

    def get_dim(self, axis: str) -> int:
        """Length of ``axis``; 0 for an axis the topology lacks."""
        index = self._index.get(axis)
        return 0 if index is None else self.dims[index]

    def get_coord(self, rank: int) -> Any:
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < self._size:
            for coord, index in self.mapping.items():  # legacy's lookup by ==, for any rank value
                if index == rank:
                    return coord
            raise ValueError(f"rank {rank} not found in topology.")
        return self.ProcessCoord(*((rank // s) % d for s, d in zip(self._strides, self.dims)))

    def get_axis_comm_lists(self, axis: str) -> list[list[int]]:
        """Rank lists whose coordinates differ only in ``axis`` (``[]`` for an unknown axis)."""
        if axis not in self._index:
            return []
        others = [a for a in self.axes if a != axis]
        lists = []
        for coord in product(*[range(self.get_dim(a)) for a in others]):
            fixed = dict(zip(others, coord))
            lists.append([self.get_rank(**fixed, **{axis: i}) for i in range(self.get_dim(axis))])
        return lists

    def filter_match(self, **filter_kwargs: int) -> list[int]:
        return [r for c, r in self.mapping.items() if all(getattr(c, k) == v for k, v in filter_kwargs.items())]

    def get_axis_list(self, axis: str, idx: int) -> list[int]:
        axis_num = self.axes.index(axis)
        return [r for c, r in self.mapping.items() if c[axis_num] == idx]

    def world_size(self) -> int:
        return self._size

    def __str__(self) -> str:
        return str(self.mapping)


def pipeline_topology(*, pp: int, dp: int, tp: Optional[int] = None) -> PipelineTopology:
    """The pipeline topology of ``pp`` stages × ``dp`` × ``tp`` (axes ``pipe, data[, model]``)."""
    if tp is None:
        return PipelineTopology(["pipe", "data"], [pp, dp])
    return PipelineTopology(["pipe", "data", "model"], [pp, dp, tp])
