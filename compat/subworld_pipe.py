"""Pipeline engines on a sub-world: ``PipelineModule(..., topology=compat.mesh_topology(mesh))``.

DeepSpeed 0.19.8's ``PipelineModule.__init__`` clones the world (``dist.new_group(range(world))``,
a collective of every rank) and sizes its topology by the world, so a pipeline could only span all
ranks. A :class:`MeshTopology` is a ``ProcessTopology`` built from a mesh: its axes and sizes are the
mesh's pp/dp/tp, and its ranks are the mesh's *global* ranks (``get_rank`` / ``get_coord`` /
``filter_match`` ... answer in global ranks, so DeepSpeed's ``stage_to_global`` and p2p send to the
right peers). While such a module is built (only by the mesh's ranks), its "world" group is the
mesh's own group over its ranks, tied-weight groups are created by their members only, and the grid
takes every group from the mesh. Ranks outside the mesh never construct the module, never call
``deepspeed.initialize`` for it, and never take part in any group creation for it.

Usage (ranks 0-1 a 2-stage pipeline, ranks 2-3 another model)::

    ranks = [0, 1] if dist.get_rank() < 2 else [2, 3]
    topo = compat.mesh_topology({"ranks": ranks, "pp": 2})        # or a MeshSpec / DeepSpeedDeviceMesh
    model = PipelineModule(layers, topology=topo, loss_fn=...)
    engine, *_ = deepspeed.initialize(model=model, config=cfg)     # cfg needs no "mesh" section
"""

from __future__ import annotations

import contextlib
import logging
from functools import cached_property
from typing import Any, Iterator, Mapping, Union

import torch.distributed as torch_dist

from mesh_core import DeepSpeedDeviceMesh, MeshSpec, MeshSpecError
from mesh_core.runtime_hooks import exact_int, registry_for_world

from .device import default_device_type
from .topology import DIM_TO_AXIS, ProcessTopology

logger = logging.getLogger(__name__)

MeshLike = Union[DeepSpeedDeviceMesh, MeshSpec, Mapping[str, Any]]


class MeshTopology(ProcessTopology):
    """A pipeline topology on a mesh (any sub-world), answering in the mesh's global ranks."""

    def __init__(self, mesh: DeepSpeedDeviceMesh) -> None:
        spec = mesh.spec
        extra = [n for n, s in zip(spec.names, spec.sizes) if s > 1 and n not in DIM_TO_AXIS]
        if extra or spec.ep > 1:
            raise MeshSpecError(
                f"{spec.describe()} has dim(s) {extra or ['ep']} that a pipeline topology cannot express; "
                f"a pipeline mesh may only have {sorted(DIM_TO_AXIS)} (and dims of size 1)"
            )
        names = [n for n in spec.names if n in DIM_TO_AXIS]  # the mesh's order: same strides
        if "tp" not in names:
            names.append("tp")
        axes = [DIM_TO_AXIS[n] for n in names]
        dims = [spec.dim_size(n) for n in names]
        if axes[-1] == "model" and dims[-1] == 1:
            axes, dims = axes[:-1], dims[:-1]
        self._setup(axes, dims)
        self.mesh = mesh
        self._global = list(spec.ranks)  # local index (row-major over the mesh's dims) -> global rank
        self._local = {r: i for i, r in enumerate(self._global)}

    def _g(self, local: Any) -> list[int]:
        return [self._global[i] for i in local]

    @cached_property
    def mapping(self) -> dict[Any, int]:
        return {coord: self._global[i] for coord, i in super().mapping.items()}

    def get_rank(self, **coord_kwargs: int) -> int:
        return self._global[super().get_rank(**coord_kwargs)]

    def get_coord(self, rank: int) -> Any:
        local = self._local.get(exact_int(rank))  # type: ignore[arg-type]
        if local is None:
            raise ValueError(f"rank {rank} not found in topology (the mesh's ranks are {self._global[:8]}).")
        return super().get_coord(local)

    def get_axis_comm_lists(self, axis: str) -> list[list[int]]:
        return [self._g(lst) for lst in super().get_axis_comm_lists(axis)]

    def filter_match(self, **filter_kwargs: int) -> list[int]:
        return sorted(self._g(super().filter_match(**filter_kwargs)))

    def get_axis_list(self, axis: str, idx: int) -> list[int]:
        return self._g(super().get_axis_list(axis, idx))

    def __repr__(self) -> str:
        return f"MeshTopology({self.mesh.spec.describe()})"


def mesh_topology(mesh: MeshLike) -> MeshTopology:
    """The ``topology=`` for a ``PipelineModule`` on ``mesh`` (a mesh, a spec, or a ``"mesh"``-style dict
    such as ``{"ranks": [0, 1], "pp": 2}``). Only the mesh's ranks call it (a spec / dict is built into a
    mesh here, by those ranks alone)."""
    if isinstance(mesh, Mapping):
        try:
            mesh = MeshSpec.build(torch_dist.get_world_size(), **dict(mesh))
        except TypeError as err:
            raise MeshSpecError(f"mesh_topology({dict(mesh)!r}): {err}; give dim sizes, 'ranks' and 'order'") from None
    if isinstance(mesh, MeshSpec):
        if torch_dist.get_rank() not in mesh.ranks:
            raise _not_member(torch_dist.get_rank(), mesh)
        mesh = DeepSpeedDeviceMesh(mesh, device_type=default_device_type())
    if not isinstance(mesh, DeepSpeedDeviceMesh):
        raise MeshSpecError(
            f"mesh_topology() takes a DeepSpeedDeviceMesh, a MeshSpec or a mesh dict, got {type(mesh).__name__}"
        )
    if not mesh.is_member:
        raise _not_member(mesh.rank, mesh.spec)
    return MeshTopology(mesh)


def _not_member(rank: int, spec: MeshSpec) -> MeshSpecError:
    return MeshSpecError(
        f"rank {rank} is not one of the ranks of {spec.describe()}; only those ranks build this pipeline "
        "(a sub-world engine): the others skip its PipelineModule and deepspeed.initialize"
    )


class _MeshComm:
    """``deepspeed.comm`` as ``pipe/module.py`` sees it while a module on a :class:`MeshTopology` is built."""

    def __init__(self, comm: Any, mesh: DeepSpeedDeviceMesh) -> None:
        self._comm = comm
        self._mesh = mesh
        dims = tuple(mesh.mesh_dim_names) if mesh.spec.size > 1 else ()
        self._world = mesh.get_group(dims) if dims else None  # the mesh's ranks (members create it)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._comm, name)

    def new_group(self, ranks: Any = None, *args: Any, **kwargs: Any) -> Any:
        ranks = sorted(int(r) for r in ranks)
        if ranks == list(range(self._comm.get_world_size())) or ranks == sorted(self._mesh.spec.ranks):
            return self._world  # the module's "world": the mesh's ranks
        outside = [r for r in ranks if not self._mesh.layout.contains(r)]
        if outside:
            raise MeshSpecError(
                f"group {ranks} of a pipeline on {self._mesh.spec.describe()} has ranks {outside} outside it; "
                f"valid ranks are {list(self._mesh.spec.ranks)[:8]}"
            )
        # tied-weight groups: created by their members only (None elsewhere, where it is never used)
        return registry_for_world().get(ranks, asker=f"{self._mesh.spec.describe()} tied weights")

    def get_rank(self, group: Any = None) -> int:
        if group is not None and group is self._world:
            return self._comm.get_rank()  # DeepSpeed reads the world clone's rank as the global rank
        return self._comm.get_rank(group=group) if group is not None else self._comm.get_rank()

    def get_world_size(self, group: Any = None) -> int:
        if group is not None and group is self._world:
            return self._mesh.spec.size
        return self._comm.get_world_size(group=group) if group is not None else self._comm.get_world_size()


@contextlib.contextmanager
def _module_comm(module: Any, mesh: DeepSpeedDeviceMesh) -> Iterator[None]:
    original = module.dist
    module.dist = _MeshComm(original, mesh)
    try:
        yield
    finally:
        module.dist = original


def make_pipeline_module_init_wrapper(module: Any):
    """``PipelineModule.__init__`` wrapper: a :class:`MeshTopology` builds the module on its mesh."""

    def init_wrapper(wrapped, instance, args, kwargs):  # noqa: ARG001
        topology = kwargs.get("topology", args[2] if len(args) > 2 else None)
        if not isinstance(topology, MeshTopology):
            return wrapped(*args, **kwargs)
        mesh = topology.mesh
        if not mesh.is_member:
            raise _not_member(mesh.rank, mesh.spec)
        num_stages = kwargs.get("num_stages", args[1] if len(args) > 1 else None)
        if num_stages is not None and num_stages != topology.get_dim("pipe"):
            raise MeshSpecError(
                f"num_stages={num_stages} but the topology's mesh {mesh.spec.describe()} has "
                f"pp={topology.get_dim('pipe')}; drop num_stages or make them equal"
            )
        logger.debug("PipelineModule on %s", mesh.spec.describe())
        with _module_comm(module, mesh):
            return wrapped(*args, **kwargs)

    return init_wrapper
