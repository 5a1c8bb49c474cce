"""Row-major rank ↔ coordinate math (the last dim varies fastest), shared by every layout:
:class:`~mesh_core.MeshLayout`, the pipeline topologies, the shim's ``ProcessTopology``, the layout a
set of legacy groups implies and ``mesh show``'s picture (``tests/test_structure.py`` holds every
``(i // stride) % size`` to this module)."""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

__all__ = ["coord_along", "coords", "flat_index", "rank_grid", "strides"]


def strides(sizes: Sequence[int]) -> tuple[int, ...]:
    """How far apart (in flat index) neighbours along each dim are: ``prod(sizes[i+1:])``."""
    return tuple(math.prod(sizes[i + 1 :]) for i in range(len(sizes)))


def coord_along(index, step: int, size: int):
    """The coordinate of flat ``index`` along the dim of stride ``step`` and size ``size`` (an int,
    or a numpy array of indices): the one decode every layout uses."""
    return (index // step) % size


def coords(index: int, sizes: Sequence[int], steps: Sequence[int]) -> tuple[int, ...]:
    """The coordinate of flat ``index`` (``steps`` is :func:`strides` of ``sizes``)."""
    return tuple(coord_along(index, step, size) for step, size in zip(steps, sizes))


def flat_index(coordinate: Sequence[int], steps: Sequence[int]) -> int:
    """The flat index of ``coordinate`` (``steps`` is :func:`strides` of the sizes)."""
    return sum(c * step for c, step in zip(coordinate, steps))


def rank_grid(sizes: Sequence[int]) -> np.ndarray:
    """Flat indices ``0..prod(sizes)-1`` laid out row-major in an array of shape ``sizes``."""
    return np.arange(math.prod(sizes)).reshape(list(sizes))
