"""``deepspeed.runtime.pipe.topology`` (0.19.8) on the mesh.

The topology classes keep DeepSpeed's names, attributes, return values and exceptions, but answer
per-rank queries in O(number of axes) instead of scanning the whole ``mapping`` (which still exists,
built on first access). :class:`PipelineParallelGrid` takes every process group from a
:class:`~mesh_core.DeepSpeedDeviceMesh` ('pipe' → ``pp``, 'data' → ``dp``, 'model' → ``tp``), so rank
sets it shares with other meshes (or that legacy created twice, e.g. the pipe groups and the
``ds_model`` groups when mp == 1) get one communicator.
"""

from __future__ import annotations

import logging
import math
from typing import Any, Optional

import torch.distributed as dist

import ds_mesh_advice
from mesh_core import DeepSpeedDeviceMesh, MeshSpec, MeshSpecError
from mesh_core.axis_names import AXIS_TO_DIM, DIM_TO_AXIS
from mesh_core.runtime_hooks import PipelineTopology

from .deprecation import legacy_entry
from .device import default_device_type

logger = logging.getLogger(__name__)


_TOPOLOGY = "deepspeed.runtime.pipe.topology"
_W_PROCESS_TOPOLOGY, _W_PIPE_DATA, _W_PIPE_MODEL_DATA = (
    legacy_entry(f"{_TOPOLOGY}.{name}", ds_mesh_advice.plain(f"{_TOPOLOGY}.{name}"))  # the one advice table
    for name in ("ProcessTopology", "PipeDataParallelTopology", "PipeModelDataParallelTopology")
)
_W_GRID = legacy_entry(f"{_TOPOLOGY}.PipelineParallelGrid", ds_mesh_advice.plain(f"{_TOPOLOGY}.PipelineParallelGrid"))


class ProcessTopology(PipelineTopology):
    """Named axes laid out row-major over ranks 0..N-1 (the last axis varies fastest).

    A subclass that skips ``super().__init__`` and sets ``axes`` / ``dims`` itself (as DeepSpeed's
    own ``__init__`` does) is served as in DeepSpeed (see :class:`~mesh_core.runtime_hooks.PipelineTopology`).
    """

    def __init__(self, axes: list[str], dims: list[int]) -> None:
        # TODOV1: legacy topology; use mesh_core.MeshSpec / MeshLayout
        _W_PROCESS_TOPOLOGY.warn()
        super().__init__(axes, dims)


def _layout_key(spec: MeshSpec) -> tuple[tuple[str, int], ...]:
    return tuple((n, s) for n, s in zip(spec.names, spec.sizes) if s > 1)


def _prime_factors(N: int) -> list[int]:
    """Prime factorisation of N in ascending order, with repeats."""
    if N <= 0:
        raise ValueError("Values must be strictly positive.")
    primes = []
    candidate = 2
    while N != 1:
        if N % candidate == 0:
            primes.append(candidate)
            N //= candidate
        else:
            candidate += 1
    return primes


class PipeDataParallelTopology(ProcessTopology):
    """Axes ``['pipe', 'data']``: data parallelism innermost."""

    def __init__(self, num_pp: int, num_dp: int) -> None:
        # TODOV1: legacy topology; use mesh_core.MeshSpec.build(W, pp=num_pp, dp=num_dp)
        _W_PIPE_DATA.warn()
        PipelineTopology.__init__(self, ["pipe", "data"], [num_pp, num_dp])


class PipeModelDataParallelTopology(ProcessTopology):
    """Axes ``['pipe', 'data', 'model']`` (note: the arguments are ordered pp, mp, dp)."""

    def __init__(self, num_pp: int, num_mp: int, num_dp: int) -> None:
        # TODOV1: legacy topology; use mesh_core.MeshSpec.build(W, pp=num_pp, dp=num_dp, tp=num_mp)
        _W_PIPE_MODEL_DATA.warn()
        PipelineTopology.__init__(self, ["pipe", "data", "model"], [num_pp, num_dp, num_mp])


def _quiet_topology(cls: type, *args: int) -> ProcessTopology:
    """A topology built internally (no deprecation warning for the user)."""
    topo = cls.__new__(cls)
    if cls is PipeModelDataParallelTopology:
        pp, mp, dp = args
        PipelineTopology.__init__(topo, ["pipe", "data", "model"], [pp, dp, mp])
    else:
        PipelineTopology.__init__(topo, ["pipe", "data"], list(args))
    return topo


def default_topology(world_size: int) -> ProcessTopology:
    """DeepSpeed's default grid topology: W's prime factors dealt alternately to pp and dp."""
    num_pp = num_dp = 1
    for idx, prime in enumerate(_prime_factors(world_size)):
        if idx % 2 == 0:
            num_pp *= prime
        else:
            num_dp *= prime
    return _quiet_topology(PipeDataParallelTopology, num_pp, num_dp)


def topology_from_mesh(mesh: DeepSpeedDeviceMesh) -> ProcessTopology:
    """The legacy topology describing a mesh's pp/dp/tp layout."""
    spec = mesh.spec
    extra = [n for n, s in zip(spec.names, spec.sizes) if s > 1 and n not in DIM_TO_AXIS]
    if extra:
        raise MeshSpecError(
            f"{spec.describe()} has dim(s) {extra} that a pipeline grid cannot express; "
            f"a grid mesh may only have {sorted(DIM_TO_AXIS)} (and dims of size 1)"
        )
    if list(spec.ranks) != list(range(spec.world_size)):
        raise MeshSpecError(
            f"{spec.describe()} does not cover ranks 0..{spec.world_size - 1} in order; a pipeline grid "
            "needs a whole-world mesh with identity rank order"
        )
    names = [n for n in spec.names if n in DIM_TO_AXIS]
    if "tp" not in names:
        names.append("tp")
    axes = [DIM_TO_AXIS[n] for n in names]
    dims = [spec.dim_size(n) for n in names]
    if axes == ["pipe", "data", "model"] and dims[2] == 1:
        axes, dims = axes[:2], dims[:2]
    topo = ProcessTopology.__new__(ProcessTopology)
    PipelineTopology.__init__(topo, axes, dims)
    return topo


def extra_axes(topology: Any) -> list[str]:
    """Axes of ``topology`` beyond pipe / data / model whose size is above 1 (no mesh dim says them)."""
    return [a for a, d in zip(topology.get_axis_names(), topology.dims) if a not in AXIS_TO_DIM and d != 1]


# the topology methods DeepSpeed's grid asks for ranks (a mesh would not ask them)
_RANK_MATH = ("get_rank", "get_coord", "get_axis_comm_lists", "get_axis_list", "filter_match")


def beyond_the_mesh(topology: Any) -> list[str]:
    """What makes ``topology`` something a mesh cannot stand for ([] if nothing): axes beyond pipe /
    data / model of size above 1, rank methods a subclass overrides, a ``mapping`` of its own that is
    not row-major. DeepSpeed's grid on it asks the topology itself (so does this module's then)."""
    reasons = [f"axis {a!r}" for a in extra_axes(topology)]
    cls = type(topology)
    if isinstance(topology, PipelineTopology):
        reasons += [f"{cls.__name__}.{n}" for n in _RANK_MATH if getattr(cls, n) is not getattr(PipelineTopology, n)]
        own = topology.__dict__.get("mapping")
        if own is not None and "_strides" not in topology.__dict__ and own != _row_major_mapping(topology):
            reasons.append(f"{cls.__name__}.mapping")
    return reasons


def _row_major_mapping(topology: Any) -> dict:
    coord = topology.__dict__.get("ProcessCoord")
    ranks = range(math.prod(topology.dims))
    coords = [tuple(c) for c in (PipelineTopology.get_coord(topology, r) for r in ranks)]
    return {(coord(*c) if coord is not None else c): r for r, c in zip(ranks, coords)}


def mesh_spec_for(topology: ProcessTopology, world_size: int) -> MeshSpec:
    """The mesh spec of a legacy topology ('pipe' → pp, 'data' → dp, 'model' → tp)."""
    missing = [a for a in ("pipe", "data") if a not in topology.axes]
    if missing:
        raise MeshSpecError(
            f"topology axes {topology.axes} lack {missing}; PipelineParallelGrid needs 'pipe' and 'data' axes"
        )
    unknown = [a for a, d in zip(topology.axes, topology.dims) if a not in AXIS_TO_DIM and d != 1]
    if unknown:
        raise MeshSpecError(
            f"topology axis/axes {unknown} (dims {[topology.get_dim(a) for a in unknown]}) have no mesh dim; "
            f"valid axes are {sorted(AXIS_TO_DIM)} (other axes must have size 1)"
        )
    names = [AXIS_TO_DIM[a] for a in topology.axes if a in AXIS_TO_DIM]
    sizes = {AXIS_TO_DIM[a]: d for a, d in zip(topology.axes, topology.dims) if a in AXIS_TO_DIM}
    if math.prod(topology.dims) != world_size:
        raise MeshSpecError(
            f"topology axes {topology.axes} with dims {topology.dims} cover {math.prod(topology.dims)} ranks, "
            f"but world_size={world_size}; the dims must multiply to the world size (Invalid Grid)"
        )
    return MeshSpec.build(world_size, order=names, **sizes)


_GRID_MESH = "_ds_mesh_grid_mesh"


def grid_mesh(grid: Any) -> Optional[DeepSpeedDeviceMesh]:
    """The mesh ``PipelineParallelGrid.__init__`` built or was given; None for a grid without one
    (a subclass that skipped that ``__init__`` and set the legacy attributes itself, or DeepSpeed's
    own grid)."""
    mesh = getattr(grid, "__dict__", {}).get(_GRID_MESH)
    return mesh if isinstance(mesh, DeepSpeedDeviceMesh) else None


def _legacy_p2p_pairs(topology: Any, world_size: int, stages: int) -> list[list[int]]:
    """DeepSpeed's ``_build_p2p_groups`` on a topology: ``[rank, next stage's rank]`` per rank."""
    buddy = {}
    for ranks in topology.get_axis_comm_lists("pipe"):
        assert len(ranks) == stages
        for idx, rank in enumerate(ranks):
            buddy[rank] = ranks[(idx + 1) % stages]
    pairs = [[rank, buddy[rank]] for rank in range(world_size) if rank in buddy]
    assert len(pairs) == world_size
    return pairs


def _set_sizes(grid: "PipelineParallelGrid") -> None:
    """The grid's parallel sizes, read from its topology as DeepSpeed reads them."""
    topo = grid._topo
    grid.data_parallel_size = max(topo.get_dim("data"), 1)
    grid.pipe_parallel_size = max(topo.get_dim("pipe"), 1)
    grid.model_parallel_size = max(topo.get_dim("model"), 1)
    grid.slice_parallel_size = grid.model_parallel_size


def _set_stage_neighbours(grid: "PipelineParallelGrid") -> None:
    """First / last stage flags and the p2p pairs, from the grid's stage id."""
    grid.is_first_stage = grid.stage_id == 0
    grid.is_last_stage = grid.stage_id == (grid.pipe_parallel_size - 1)
    grid.p2p_groups = grid._build_p2p_groups()


class PipelineParallelGrid:
    """DeepSpeed's pipeline grid: the same attributes, methods and group memberships, on a mesh.

    ``PipelineParallelGrid(topology=None, process_group=None, *, mesh=None)``: with ``mesh`` the
    groups come from that mesh (a topology, if also given, must describe it); otherwise a mesh is
    built from the topology (default: DeepSpeed's prime-factor pp × dp split). Construction is
    collective: every rank must build the same grid. ``process_group`` is ignored, as in DeepSpeed
    (the grid always spans the world). ``grid.mesh`` is the mesh.

    Beyond DeepSpeed 0.19.8 the grid also has ``get_tensor_model_parallel_group`` and
    ``get_pipeline_model_parallel_group`` (0.19.8 lacks them, so ``checkpointing.configure(grid)``
    crashed); every other probe-visible method is the same.

    Subclasses are served as DeepSpeed served them: a subclass that skips ``super().__init__`` and
    sets the legacy attributes itself (``_topo``, ``global_rank``, its own process groups, ...)
    has no mesh, and the methods it did not override answer from those attributes with DeepSpeed's
    own rules; what a subclass sets or overrides wins over what this class computes. A topology
    a mesh cannot stand for (:func:`beyond_the_mesh`: a ``'sequence'`` axis, overridden rank
    methods, a mapping of its own) gets DeepSpeed's grid without a mesh, asking the topology as
    DeepSpeed did (the same groups, each created once through the world's registry).
    """

    def __init__(
        self,
        topology: Optional[ProcessTopology] = None,
        process_group: Any = None,
        *,
        mesh: Optional[DeepSpeedDeviceMesh] = None,
    ) -> None:
        # TODOV1: legacy pipeline grid; use engine.mesh_device / DeepSpeedDeviceMesh
        _W_GRID.warn()
        self.global_rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        # a topology built on a (sub-world) mesh (compat.mesh_topology) brings its mesh
        own_mesh = getattr(topology, "mesh", None) if topology is not None else None
        if mesh is None and isinstance(own_mesh, DeepSpeedDeviceMesh):
            mesh = own_mesh
        on_own_mesh = mesh is not None and own_mesh is mesh
        if on_own_mesh:
            self._topo = topology
        elif mesh is not None:
            mesh_topo = topology_from_mesh(mesh)
            if topology is not None and _layout_key(mesh_spec_for(topology, self.world_size)) != _layout_key(mesh.spec):
                raise MeshSpecError(
                    f"topology axes {topology.axes} with dims {topology.dims} do not describe {mesh.spec.describe()}"
                )
            self._topo = topology if topology is not None else mesh_topo
        elif topology is not None:
            self._topo = topology
            if beyond_the_mesh(topology):
                self._build_without_mesh()  # axes or rank math no mesh expresses: DeepSpeed's own grid
                return
        else:
            self._topo = default_topology(self.world_size)
        # validates before any group exists (a mesh topology is its mesh's spec)
        spec = mesh.spec if on_own_mesh else mesh_spec_for(self._topo, self.world_size)
        if topology is not None:
            logger.debug("Using topology: %s", topology)
        if process_group is not None:
            logger.debug("PipelineParallelGrid ignores process_group (as DeepSpeed does); using the world")

        _set_sizes(self)
        self.mesh = mesh if mesh is not None else DeepSpeedDeviceMesh(spec, device_type=default_device_type())
        self.__dict__[_GRID_MESH] = self.mesh  # the grid's own, whatever a subclass later calls `mesh`

        self.stage_id = self.get_stage_id()
        self.data_parallel_id = self.get_data_parallel_id()

        # ds_model: every rank with this data index (pipe x model), for overflow checks and norms
        self.ds_model_proc_group = self.mesh.get_group(("pp", "tp"))
        self.ds_model_rank = self.mesh.get_local_rank(("pp", "tp"))
        self.ds_model_world_size = self.mesh.size(("pp", "tp"))

        self.dp_groups = self.mesh.get_all_group_ranks("dp")
        self.dp_group = self.mesh.get_group_ranks("dp")
        self.dp_proc_group = self.mesh.get_group("dp")

        _set_stage_neighbours(self)

        self.pipe_groups = self.mesh.get_all_group_ranks("pp")
        self.pp_group = self.mesh.get_group_ranks("pp")
        self.pp_proc_group = self.mesh.get_group("pp")

        # with mp == 1 DeepSpeed builds W singleton slice groups and no model_groups / mp_group
        self.slice_group = self.mesh.get_group_ranks("tp")
        self.slice_proc_group = self.mesh.get_group("tp")
        if self.model_parallel_size > 1:
            self.mp_group: list[int] = []  # never filled in DeepSpeed either
            self.model_groups = self.mesh.get_all_group_ranks("tp")

    def _build_without_mesh(self) -> None:
        """DeepSpeed's grid over a topology a mesh cannot stand for (:func:`beyond_the_mesh`): the
        same attributes and memberships, no mesh; each rank set's group comes from the world's
        registry (one communicator per rank set, created by its members)."""
        from mesh_core.runtime_hooks import registry_for_world

        topo, rank = self._topo, self.global_rank
        _set_sizes(self)
        if not self._is_grid_valid():
            raise MeshSpecError(
                f"topology axes {topo.axes} with dims {topo.dims} cover {math.prod(topo.dims)} ranks, but "
                f"world_size={self.world_size}; the dims must multiply to the world size (Invalid Grid)"
            )
        missing = [a for a in ("pipe", "data") if a not in topo.get_axis_names()]
        if missing:
            raise MeshSpecError(
                f"topology axes {topo.axes} lack {missing}; PipelineParallelGrid needs 'pipe' and 'data' axes"
            )
        registry = registry_for_world()

        def mine(rank_lists: list[list[int]]) -> tuple[Any, list[int]]:
            group, _ = registry.partition(rank_lists, asker="PipelineParallelGrid")
            return group, next(list(r) for r in rank_lists if rank in r)

        self.stage_id = self.get_stage_id()
        self.data_parallel_id = self.get_data_parallel_id()
        model_lists = [sorted(topo.get_axis_list(axis="data", idx=d)) for d in range(self.data_parallel_size)]
        self.ds_model_proc_group, model_ranks = mine(model_lists)
        self.ds_model_world_size = len(model_ranks)
        self.ds_model_rank = model_ranks.index(rank)
        self.dp_groups = topo.get_axis_comm_lists("data")
        self.dp_proc_group, self.dp_group = mine(self.dp_groups)
        _set_stage_neighbours(self)
        self.pipe_groups = topo.get_axis_comm_lists("pipe")
        self.pp_proc_group, self.pp_group = mine(self.pipe_groups)
        if self.model_parallel_size == 1:
            self.slice_proc_group, self.slice_group = mine([[r] for r in range(self.world_size)])
        else:
            self.mp_group = []
            self.model_groups = topo.get_axis_comm_lists("model")
            self.slice_proc_group, self.slice_group = mine(self.model_groups)

    def get_stage_id(self) -> int:
        mesh = grid_mesh(self)
        if mesh is None:  # a subclass that built itself: DeepSpeed's rule on its own topology
            return self._topo.get_coord(rank=self.global_rank).pipe
        return mesh.layout.coordinate(self.global_rank).get("pp", 0)

    def get_data_parallel_id(self) -> int:
        mesh = grid_mesh(self)
        if mesh is None:
            return self._topo.get_coord(rank=self.global_rank).data
        return mesh.layout.coordinate(self.global_rank).get("dp", 0)

    def _build_p2p_groups(self) -> list[list[int]]:
        """``[rank, next stage]`` for every rank (wrapping), index = rank; rank lists only."""
        mesh = grid_mesh(self)
        if mesh is None:
            return _legacy_p2p_pairs(self._topo, self.world_size, self.pipe_parallel_size)
        return mesh.layout.p2p_pairs()

    def _is_grid_valid(self) -> bool:
        mesh = grid_mesh(self)
        size = dist.get_world_size() if mesh is None else mesh.spec.size
        return math.prod(self._topo.get_dim(ax) for ax in self._topo.get_axis_names()) == size

    def stage_to_global(self, stage_id: int, **kwargs: int) -> int:
        """Rank of this rank's coordinate with ``pipe=stage_id`` (and other axes from ``kwargs``)."""
        me = self._topo.get_coord(self.global_rank)
        return self._topo.get_rank(**me._replace(pipe=stage_id, **kwargs)._asdict())

    def topology(self) -> ProcessTopology:
        return self._topo

    # MPU functions for DeepSpeed integration
    def get_global_rank(self) -> int:
        return self.global_rank

    def get_pipe_parallel_rank(self) -> int:
        return self.get_stage_id()

    def get_pipeline_model_parallel_rank(self) -> int:
        return self.get_pipe_parallel_rank()

    def get_pipe_parallel_world_size(self) -> int:
        return self.pipe_parallel_size

    def get_pipeline_model_parallel_world_size(self) -> int:
        return self.get_pipe_parallel_world_size()

    def get_pipe_parallel_group(self) -> Any:
        return self.pp_proc_group

    def get_pipeline_model_parallel_group(self) -> Any:
        """The pipe group (Megatron spelling; missing from DeepSpeed 0.19.8's grid)."""
        return self.pp_proc_group

    def get_data_parallel_rank(self) -> int:
        return self.data_parallel_id

    def get_data_parallel_world_size(self) -> int:
        return self.data_parallel_size

    def get_data_parallel_group(self) -> Any:
        return self.dp_proc_group

    def get_data_parallel_group_ranks(self) -> list[int]:
        return self.dp_group

    # "model parallel" on the grid is pipe x model (DeepSpeed's overflow / norm group)
    def get_model_parallel_rank(self) -> int:
        return self.ds_model_rank

    def get_model_parallel_world_size(self) -> int:
        return self.ds_model_world_size

    def get_model_parallel_group(self) -> Any:
        return self.ds_model_proc_group

    # Megatron-style tensor slicing
    def get_slice_parallel_rank(self) -> int:
        if "model" in self._topo.get_axis_names():
            return self._topo.get_coord(self.global_rank).model
        return 0

    def get_tensor_model_parallel_rank(self) -> int:
        return self.get_slice_parallel_rank()

    def get_slice_parallel_world_size(self) -> int:
        return self.slice_parallel_size

    def get_tensor_model_parallel_world_size(self) -> int:
        return self.get_slice_parallel_world_size()

    def get_slice_parallel_group(self) -> Any:
        return self.slice_proc_group

    def get_tensor_model_parallel_group(self) -> Any:
        """The slice (tensor) group (missing from DeepSpeed 0.19.8's grid)."""
        return self.slice_proc_group
