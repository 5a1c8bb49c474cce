"""``EngineMesh``: the mesh an engine exposes as ``engine.mesh_device``.

Legacy DeepSpeed treats ``engine.mesh_device`` (and ``groups.mesh_device``) as a torch
``DeviceMesh`` built by ``deepspeed.initialize(mesh_param=(dp, sp))`` with the dim names
``("data_parallel", "sequence_parallel")``, and calls ``get_group(mesh_dim="data_parallel")`` or
``size(mesh_dim=...)`` on it. An :class:`EngineMesh` is a :class:`DeepSpeedDeviceMesh` that also
answers those calls: the legacy names are aliases of the mesh dims, and the torch-style keyword
``mesh_dim`` is accepted next to the mesh API's positional ``dims``.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence, Union

import torch

from mesh_core import DeepSpeedDeviceMesh, MeshSpecError

# Dim names legacy DeepSpeed (and torch DeviceMesh users) pass → mesh dims.
LEGACY_DIM_NAMES: dict[str, str] = {
    "data_parallel": "dp",
    "sequence_parallel": "sp",
    "tensor_parallel": "tp",
    "pipe_parallel": "pp",
    "pipeline_parallel": "pp",
    "expert_parallel": "ep",
    "expert_data_parallel": "edp",
}

DimsArg = Union[str, Sequence[str], None]


def mesh_dims(dims: DimsArg = None, mesh_dim: DimsArg = None) -> Union[str, tuple[str, ...]]:
    """Mesh dims for a call that names them positionally or as ``mesh_dim=``, legacy names allowed."""
    if dims is not None and mesh_dim is not None and dims != mesh_dim:
        raise MeshSpecError(f"got dims={dims!r} and mesh_dim={mesh_dim!r}; name the dims once")
    chosen = dims if dims is not None else mesh_dim
    if chosen is None:
        raise MeshSpecError(
            f"name the mesh dim(s); valid names are the mesh dims or the legacy names {sorted(LEGACY_DIM_NAMES)}"
        )
    if isinstance(chosen, str):
        return LEGACY_DIM_NAMES.get(chosen, chosen)
    return tuple(LEGACY_DIM_NAMES.get(name, name) for name in chosen)


class EngineMesh(DeepSpeedDeviceMesh):
    """A :class:`DeepSpeedDeviceMesh` that also serves the torch-``DeviceMesh`` calls of legacy code."""

    def get_group(self, dims: DimsArg = None, *, mesh_dim: DimsArg = None):  # type: ignore[override]
        return super().get_group(mesh_dims(dims, mesh_dim))

    def size(self, dims: DimsArg = None, *, mesh_dim: DimsArg = None) -> int:  # type: ignore[override]
        """Ranks along ``dims``; with no dims, every rank of the mesh (as ``DeviceMesh.size()``)."""
        if dims is None and mesh_dim is None:
            return super().size()
        return super().size(mesh_dims(dims, mesh_dim))

    def get_rank(self, dims: DimsArg = None, *, mesh_dim: DimsArg = None) -> int:  # type: ignore[override]
        """The global rank (as ``DeviceMesh.get_rank()``); the deprecated ``get_rank(dims)`` as the mesh's."""
        if dims is None and mesh_dim is None:
            return super().get_rank()
        return super().get_rank(mesh_dims(dims, mesh_dim))

    def get_local_rank(self, mesh_dim: DimsArg = None) -> int:  # type: ignore[override]
        """This rank's index along ``mesh_dim`` (torch ``DeviceMesh.get_local_rank``), legacy names allowed."""
        return super().get_local_rank(None if mesh_dim is None else mesh_dims(None, mesh_dim))

    def get_group_ranks(
        self, dims: DimsArg = None, rank: Optional[int] = None, *, mesh_dim: DimsArg = None
    ) -> list[int]:  # type: ignore[override]
        return super().get_group_ranks(mesh_dims(dims, mesh_dim), rank)

    def get_all_group_ranks(self, dims: DimsArg = None, *, mesh_dim: DimsArg = None) -> list[list[int]]:  # type: ignore[override]
        return super().get_all_group_ranks(mesh_dims(dims, mesh_dim))

    def __getitem__(self, dims: Any):  # type: ignore[override]
        return super().__getitem__(mesh_dims(dims))

    @property
    def mesh(self) -> torch.Tensor:
        """The global ranks laid out over the mesh's dims of size > 1 (as ``DeviceMesh.mesh``)."""
        shape = [self.spec.dim_size(name) for name in self.mesh_dim_names]
        return torch.tensor(self.spec.ranks, dtype=torch.int).reshape(shape)

    def __repr__(self) -> str:
        return f"DeepSpeedDeviceMesh({self.spec.describe()}; an engine's mesh_device, also answering legacy DeviceMesh calls)"


def as_engine_mesh(mesh: DeepSpeedDeviceMesh) -> EngineMesh:
    """``mesh`` itself, now answering legacy calls too (its class gains :class:`EngineMesh`).

    The upgrade is in place, not a copy, so every holder of the mesh (a pipeline grid, an mpu,
    the engine) keeps sharing one object and one set of groups.
    """
    if isinstance(mesh, EngineMesh):
        return mesh
    if not isinstance(mesh, DeepSpeedDeviceMesh):
        raise MeshSpecError(f"expected a DeepSpeedDeviceMesh, got {type(mesh).__name__}: {mesh!r}")
    mesh.__class__ = _engine_class(type(mesh))
    return mesh  # type: ignore[return-value]


_ENGINE_CLASSES: dict[type, type] = {DeepSpeedDeviceMesh: EngineMesh}


def _engine_class(cls: type) -> type:
    if cls not in _ENGINE_CLASSES:
        _ENGINE_CLASSES[cls] = type(f"Engine{cls.__name__}", (EngineMesh, cls), {})
    return _ENGINE_CLASSES[cls]
