"""The one map between DeepSpeed's topology axis names and mesh dims.

DeepSpeed's pipeline topologies name their axes ``'pipe'``, ``'data'`` and ``'model'``; on a mesh
they are the dims ``pp``, ``dp`` and ``tp``. (The codemods, which never import ``mesh_core``, keep
a copy in ``codemods.grid_api``; a test holds the two equal.)
"""
from __future__ import annotations

AXIS_TO_DIM: dict[str, str] = {"pipe": "pp", "data": "dp", "model": "tp"}
DIM_TO_AXIS: dict[str, str] = {dim: axis for axis, dim in AXIS_TO_DIM.items()}

__all__ = ["AXIS_TO_DIM", "DIM_TO_AXIS"]
