"""Subclasses of DeepSpeed's grid and topology, as frameworks write them, plain and under the shim.

Each shape is a small class of our own modelled on a public tree: a grid that skips
``super().__init__`` and builds its attributes and groups itself (CoLLiE's ``MultiParallelGrid``),
one that overrides the p2p pairs (a DAG pipeline's custom grid), one that replaces groups after
``super().__init__`` (and keeps an attribute of its own named ``mesh``), a topology with its axes
swapped (qlora-pipe's column-major topology) and a topology that sets ``axes`` / ``dims`` /
``mapping`` itself. Built on the real deepspeed 0.19.8 classes and on the classes the shim puts in
their place, on fake ranks of 4 and 8, every method and attribute answers the same.
"""

from __future__ import annotations

import contextlib
import io
from collections import namedtuple
from itertools import product

import pytest
import torch.distributed as dist
from megatron_mpu import DEEPSPEED_TEST, MegatronMPU
from test_compat_topology import GRID_ATTRS, GRID_GROUPS, GRID_METHODS, ranks_of

from fakepg import fake_world

pytestmark = [
    pytest.mark.deepspeed,
    pytest.mark.filterwarnings("ignore::compat.deprecation.LegacyAPIDeprecationWarning"),
    pytest.mark.torch_releases,
]


# --- the shapes (written against whatever classes the topology module holds) --------------------
def shapes(topology_module):
    """The subclass shapes over ``topology_module``'s classes (deepspeed's, or the shim's)."""
    Grid = topology_module.PipelineParallelGrid
    Topology = topology_module.ProcessTopology

    class SelfBuiltGrid(Grid):
        """Skips the base __init__: sets the legacy attributes and makes its own groups."""

        def __init__(self, topology):
            self.global_rank = dist.get_rank()
            self.world_size = dist.get_world_size()
            self._topo = topology
            self.data_parallel_size = max(self._topo.get_dim("data"), 1)
            self.pipe_parallel_size = max(self._topo.get_dim("pipe"), 1)
            self.model_parallel_size = max(self._topo.get_dim("model"), 1)
            self.slice_parallel_size = self.model_parallel_size
            assert self._is_grid_valid(), "Invalid Grid"
            self.stage_id = self.get_stage_id()
            self.data_parallel_id = self.get_data_parallel_id()
            model_ranks = sorted(topology.get_axis_list("data", self.data_parallel_id))
            self.ds_model_proc_group = _own_group(model_ranks)
            self.ds_model_world_size = len(model_ranks)
            self.ds_model_rank = model_ranks.index(self.global_rank)
            self.dp_group = _mine(topology.get_axis_comm_lists("data"))
            self.dp_proc_group = _own_group(self.dp_group)
            self.is_first_stage = self.stage_id == 0
            self.is_last_stage = self.stage_id == self.pipe_parallel_size - 1
            self.p2p_groups = self._build_p2p_groups()
            self.pp_group = _mine(topology.get_axis_comm_lists("pipe"))
            self.pp_proc_group = _own_group(self.pp_group)
            lists = topology.get_axis_comm_lists("model") or [[r] for r in range(self.world_size)]
            self.slice_group = _mine(lists)
            self.slice_proc_group = _own_group(self.slice_group)

    class ReversedRingGrid(Grid):
        """Overrides the p2p pairs (each stage sends to the previous one)."""

        def _build_p2p_groups(self):
            return [[b, a] for a, b in super()._build_p2p_groups()]

    class OwnGroupsGrid(Grid):
        """Replaces the data-parallel group after the base __init__ and keeps a `mesh` of its own."""

        def __init__(self, topology):
            super().__init__(topology=topology)
            self.dp_proc_group = _own_group(self.dp_group)
            self.mesh = "the subclass's own attribute"

        def get_model_parallel_world_size(self):
            return 100 + super().get_model_parallel_world_size()

    class ColumnMajorTopology(Topology):
        def __init__(self, num_pp, num_dp):
            super().__init__(axes=["data", "pipe"], dims=[num_dp, num_pp])

    class SelfBuiltTopology(Topology):
        """Skips the base __init__ and sets what DeepSpeed's sets (row-major mapping included)."""

        def __init__(self, axes, dims):
            self.axes = axes
            self.dims = dims
            self.ProcessCoord = namedtuple("ProcessCoord", axes)
            self.mapping = {self.ProcessCoord(*c): r for r, c in enumerate(product(*[range(d) for d in dims]))}

    class SequenceTopology(Topology):
        """A fourth axis no mesh dim expresses (pipe, data, model, sequence)."""

        def __init__(self, num_pp, num_mp, num_dp, num_sp=1):
            super().__init__(axes=["pipe", "data", "model", "sequence"], dims=[num_pp, num_dp, num_mp, num_sp])

    class ReversedTopology(Topology):
        """Overrides the rank math: ranks numbered from the other end (rank r is index W-1-r)."""

        def _flip(self, rank):
            return self.world_size() - 1 - rank

        def get_rank(self, **coord):
            return self._flip(super().get_rank(**coord))

        def get_coord(self, rank):
            return super().get_coord(self._flip(rank))

        def get_axis_comm_lists(self, axis):
            return [[self._flip(r) for r in ranks] for ranks in super().get_axis_comm_lists(axis)]

        def get_axis_list(self, axis, idx):
            return sorted(self._flip(r) for r in super().get_axis_list(axis, idx))

        def filter_match(self, **filter_kwargs):
            return sorted(self._flip(r) for r in super().filter_match(**filter_kwargs))

    return {
        "ReversedTopology": ReversedTopology,
        "SequenceTopology": SequenceTopology,
        "SelfBuiltGrid": SelfBuiltGrid,
        "ReversedRingGrid": ReversedRingGrid,
        "OwnGroupsGrid": OwnGroupsGrid,
        "ColumnMajorTopology": ColumnMajorTopology,
        "SelfBuiltTopology": SelfBuiltTopology,
    }


def _mine(rank_lists):
    return next(r for r in rank_lists if dist.get_rank() in r)


_OWN_GROUPS: dict = {}


def _own_group(ranks):
    """A group the subclass makes itself (torch's new_group, as CoLLiE gets Megatron's)."""
    group = dist.new_group(ranks=ranks)
    _OWN_GROUPS[id(group)] = group
    return group


def grid_view(grid):
    view = {name: getattr(grid, name)() for name in GRID_METHODS}
    view.update({name: getattr(grid, name, "<absent>") for name in GRID_ATTRS if name != "mesh"})
    view.update({name: ranks_of(getattr(grid, name)()) for name in GRID_GROUPS})
    view["own groups"] = sorted(name for name in GRID_GROUPS if id(getattr(grid, name)()) in _OWN_GROUPS)
    view["topology"] = (grid.topology().axes, grid.topology().dims)
    view["stage_to_global"] = [grid.stage_to_global(s) for s in range(grid.pipe_parallel_size)]
    return view


def topology_view(topo):
    world = 1
    for d in topo.dims:
        world *= d
    return {
        "coords": [tuple(topo.get_coord(r)) for r in range(world)],
        "ranks": [topo.get_rank(**c._asdict()) for c in (topo.get_coord(r) for r in range(world))],
        "comm": {a: topo.get_axis_comm_lists(a) for a in topo.get_axis_names()},
        "filter": topo.filter_match(pipe=0),
        "axis_list": topo.get_axis_list("pipe", 0),
        "repr": [topo.get_rank_repr(r) for r in range(world)],
        "world_size": topo.world_size(),
        "dims": [topo.get_dim(a) for a in topo.get_axis_names()] + [topo.get_dim("nope")],
    }


CASES = {
    # name -> (world, build(classes, module) -> grid or topology)
    "SelfBuiltGrid pp2 dp2": (4, lambda c, m: c["SelfBuiltGrid"](m.PipeDataParallelTopology(num_pp=2, num_dp=2))),
    "SelfBuiltGrid pp2 mp2 dp2": (
        8,
        lambda c, m: c["SelfBuiltGrid"](m.PipeModelDataParallelTopology(num_pp=2, num_mp=2, num_dp=2)),
    ),
    "SelfBuiltGrid pp4 dp2": (8, lambda c, m: c["SelfBuiltGrid"](m.PipeDataParallelTopology(num_pp=4, num_dp=2))),
    "ReversedRingGrid pp4": (4, lambda c, m: c["ReversedRingGrid"](topology=m.PipeDataParallelTopology(4, 1))),
    "ReversedRingGrid pp2 mp2 dp2": (
        8,
        lambda c, m: c["ReversedRingGrid"](topology=m.PipeModelDataParallelTopology(2, 2, 2)),
    ),
    "OwnGroupsGrid pp2 dp2": (4, lambda c, m: c["OwnGroupsGrid"](m.PipeDataParallelTopology(2, 2))),
    "OwnGroupsGrid pp2 dp4": (8, lambda c, m: c["OwnGroupsGrid"](m.PipeDataParallelTopology(2, 4))),
    "grid on ColumnMajorTopology pp2 dp2": (
        4,
        lambda c, m: m.PipelineParallelGrid(topology=c["ColumnMajorTopology"](2, 2)),
    ),
    "grid on ColumnMajorTopology pp4 dp2": (
        8,
        lambda c, m: m.PipelineParallelGrid(topology=c["ColumnMajorTopology"](4, 2)),
    ),
    "SelfBuiltGrid on SelfBuiltTopology pp2 dp2 model2": (
        8,
        lambda c, m: c["SelfBuiltGrid"](c["SelfBuiltTopology"](["pipe", "data", "model"], [2, 2, 2])),
    ),
    "grid on SequenceTopology pp2 sp2": (
        4,
        lambda c, m: m.PipelineParallelGrid(topology=c["SequenceTopology"](2, 1, 1, 2)),
    ),
    "grid on SequenceTopology pp2 dp2 sp2": (
        8,
        lambda c, m: m.PipelineParallelGrid(topology=c["SequenceTopology"](2, 1, 2, 2)),
    ),
    "grid on SequenceTopology pp2 mp2 sp2": (
        8,
        lambda c, m: m.PipelineParallelGrid(topology=c["SequenceTopology"](2, 2, 1, 2)),
    ),
    "grid on SequenceTopology pp2 dp4 sp1": (
        8,
        lambda c, m: m.PipelineParallelGrid(topology=c["SequenceTopology"](2, 1, 4)),
    ),
    "grid on ReversedTopology pp2 dp2": (
        4,
        lambda c, m: m.PipelineParallelGrid(topology=c["ReversedTopology"](["pipe", "data"], [2, 2])),
    ),
    "grid on ReversedTopology pp2 dp2 model2": (
        8,
        lambda c, m: m.PipelineParallelGrid(topology=c["ReversedTopology"](["pipe", "data", "model"], [2, 2, 2])),
    ),
    "grid on SelfBuiltTopology pp2 dp2": (
        4,
        lambda c, m: m.PipelineParallelGrid(topology=c["SelfBuiltTopology"](["pipe", "data"], [2, 2])),
    ),
}


def _build(case, rank, *, shim_installed):
    import deepspeed.runtime.pipe.topology as module

    world, build = CASES[case]
    _OWN_GROUPS.clear()
    with fake_world(rank, world, deepspeed_comm=True), contextlib.redirect_stdout(io.StringIO()):
        classes = shapes(module)
        if shim_installed:
            from compat import topology as compat_topology

            assert module.PipelineParallelGrid is compat_topology.PipelineParallelGrid
        obj = build(classes, module)
        topo = obj.topology() if hasattr(obj, "topology") else obj
        return {"grid": grid_view(obj), "topology": topology_view(topo)}


@pytest.mark.parametrize("case", sorted(CASES))
def test_subclass_shapes_answer_as_in_deepspeed(case):
    import importlib

    import deepspeed  # noqa: F401

    installer = importlib.import_module("compat.install")
    world = CASES[case][0]
    for rank in sorted({0, 1, world - 1}):
        legacy = _build(case, rank, shim_installed=False)
        installer.install()
        try:
            shimmed = _build(case, rank, shim_installed=True)
        finally:
            installer.uninstall()
        assert shimmed == legacy, (case, rank)


def test_a_self_built_grid_keeps_its_own_groups_and_has_no_mesh(shim):
    """Under the shim a CoLLiE-style grid keeps every group it made and answers from its topology."""
    import deepspeed.runtime.pipe.topology as module

    _OWN_GROUPS.clear()
    with fake_world(5, 8, deepspeed_comm=True), contextlib.redirect_stdout(io.StringIO()):
        grid = shapes(module)["SelfBuiltGrid"](module.PipeModelDataParallelTopology(num_pp=2, num_mp=2, num_dp=2))
        assert not hasattr(grid, "mesh")
        for name in GRID_GROUPS:
            assert id(getattr(grid, name)()) in _OWN_GROUPS, name
        assert (grid.get_stage_id(), grid.get_data_parallel_id(), grid.get_slice_parallel_rank()) == (1, 0, 1)
        assert grid.p2p_groups[5] == [5, 1] and grid.stage_to_global(0) == 1


def test_the_engine_mesh_of_a_self_built_grid_uses_the_grids_own_groups(shim):
    """What ``deepspeed.initialize`` makes of a PipelineModule whose grid built itself: a mesh that
    hands out the grid's very groups (legacy's engine used them through ``mpu=grid``)."""
    import deepspeed.runtime.pipe.topology as module

    from compat import initialize as ci
    from compat import topology as ct

    _OWN_GROUPS.clear()
    with fake_world(5, 8, deepspeed_comm=True), contextlib.redirect_stdout(io.StringIO()):
        topo = module.PipeModelDataParallelTopology(num_pp=2, num_mp=2, num_dp=2)
        grid = shapes(module)["SelfBuiltGrid"](topo)
        assert ct.grid_mesh(grid) is None
        mesh, engine_mpu = ci._engine_mesh(ct.mesh_spec_for(topo, 8), grid=grid, mpu=None, given=None, pipeline=True)
        assert engine_mpu is None
        assert mesh.get_group("dp") is grid.get_data_parallel_group()
        assert mesh.get_group("pp") is grid.get_pipe_parallel_group()
        assert mesh.get_group("tp") is grid.get_slice_parallel_group()
        # a grid the shim built keeps serving its own mesh, whatever a subclass calls `mesh`
        own = shapes(module)["OwnGroupsGrid"](module.PipeDataParallelTopology(2, 4))
        assert own.mesh == "the subclass's own attribute" and ct.grid_mesh(own) is not None
        engine_mesh, _ = ci._engine_mesh(
            ct.mesh_spec_for(own.topology(), 8), grid=own, mpu=None, given=None, pipeline=True
        )
        assert engine_mesh is ct.grid_mesh(own)


# --- engine subclasses --------------------------------------------------------------------------
def _tiny_config():
    return {
        "train_micro_batch_size_per_gpu": 1,
        "optimizer": {"type": "Adam", "params": {"torch_adam": True}},
        "steps_per_print": 10**6,
    }


def _parity_mpu(world):
    """A Megatron-style mpu: tp=2 consecutive, dp strided (made with torch's new_group), DeepSpeed's
    test-mpu getters."""
    rank = dist.get_rank()
    dp_ranks = list(range(rank % 2, world, 2))
    tp_ranks = [rank - rank % 2, rank - rank % 2 + 1]
    groups = {"dp": _own_group(dp_ranks), "tp": _own_group(tp_ranks)}
    return MegatronMPU(
        groups, {"dp": dp_ranks, "tp": tp_ranks}, names=DEEPSPEED_TEST, getters=("group", "world_size", "rank")
    )


def engine_shapes(engine_module):
    Engine = engine_module.DeepSpeedEngine

    class OwnDataGroupEngine(Engine):
        """Overrides _configure_distributed_model: its own data-parallel group wins."""

        def _configure_distributed_model(self, model):
            super()._configure_distributed_model(model)
            self.own_dp = _own_group(list(range(dist.get_world_size())))
            self.data_parallel_group = self.own_dp

    class CountingEngine(Engine):
        """Overrides forward and step around the base ones (CoLLiE's engine shape)."""

        def forward(self, *args, **kwargs):
            self.forwards = getattr(self, "forwards", 0) + 1
            return super().forward(*args, **kwargs)

        def step(self, *args, **kwargs):
            self.steps = getattr(self, "steps", 0) + 1
            return super().step(*args, **kwargs)

    return {"OwnDataGroupEngine": OwnDataGroupEngine, "CountingEngine": CountingEngine}


def _mpu_dp(mpu, otherwise):
    """The dp group of the test's own mpu; ``otherwise`` for any other object (or none)."""
    return mpu.groups["dp"] if isinstance(mpu, MegatronMPU) else otherwise


def _engine_view(engine, groups):
    import torch

    x = torch.ones(2, 4)
    loss = engine(x).sum()
    engine.backward(loss)
    engine.step()
    return {
        "dp": ranks_of(engine.data_parallel_group),
        "seq_dp": ranks_of(engine.seq_data_parallel_group),
        "dp_is_own": engine.data_parallel_group is getattr(engine, "own_dp", None)
        or engine.data_parallel_group is _mpu_dp(engine.mpu, None),
        "dp_world_size": engine.dp_world_size,
        "mp_world_size": engine.mp_world_size,
        "groups_dp": ranks_of(groups._get_data_parallel_group()),
        "groups_dp_is_mpus": groups._get_data_parallel_group() is _mpu_dp(groups.mpu, object()),
        "calls": (getattr(engine, "forwards", None), getattr(engine, "steps", None)),
        "param": [p.detach().clone().tolist() for p in engine.module.parameters()],
    }


def _build_engines(rank, world, *, shim_installed, monkeypatch):
    """A deepspeed.initialize engine, then the subclass shapes built directly (as CoLLiE's initialize)."""
    import deepspeed
    import deepspeed.runtime.engine as engine_module
    import torch
    from deepspeed.runtime.config import DeepSpeedConfig
    from deepspeed.utils import groups

    for name, value in (("LOCAL_RANK", rank), ("RANK", rank), ("WORLD_SIZE", world)):
        monkeypatch.setenv(name, str(value))
    _OWN_GROUPS.clear()
    views = {}
    with fake_world(rank, world, deepspeed_comm=True), contextlib.redirect_stdout(io.StringIO()):
        torch.manual_seed(0)
        first, *_ = deepspeed.initialize(model=torch.nn.Linear(4, 4), config=_tiny_config())
        assert hasattr(first, "mesh_device") == shim_installed or first.mesh_device is None
        classes = engine_shapes(engine_module)
        for name, mpu in (("OwnDataGroupEngine", None), ("CountingEngine", None), ("CountingEngine", "mpu")):
            torch.manual_seed(0)
            model = torch.nn.Linear(4, 4)
            the_mpu = _parity_mpu(world) if mpu else None
            engine = classes[name](
                args=None,
                model=model,
                model_parameters=model.parameters(),
                mpu=the_mpu,
                config=_tiny_config(),
                config_class=DeepSpeedConfig(_tiny_config(), the_mpu),
            )
            views[f"{name} mpu={mpu}"] = _engine_view(engine, groups)
        groups.mpu = None
    return views


@pytest.mark.parametrize("rank,world", [(1, 4), (6, 8)])
def test_engine_subclasses_built_directly_answer_as_in_deepspeed(rank, world, monkeypatch):
    import importlib

    import deepspeed  # noqa: F401

    installer = importlib.import_module("compat.install")
    installer.uninstall()
    legacy = _build_engines(rank, world, shim_installed=False, monkeypatch=monkeypatch)
    installer.install()
    try:
        shimmed = _build_engines(rank, world, shim_installed=True, monkeypatch=monkeypatch)
    finally:
        installer.uninstall()
    assert shimmed == legacy
    assert legacy["OwnDataGroupEngine mpu=None"]["dp_is_own"]
    assert legacy["CountingEngine mpu=mpu"]["groups_dp_is_mpus"] and legacy["CountingEngine mpu=mpu"]["dp_is_own"]
    assert legacy["CountingEngine mpu=None"]["calls"] == (1, 1)


def test_the_engine_layout_of_a_topology_with_a_sequence_axis():
    """A 'sequence' axis of size 1 says nothing to the engine's layout; of size 2 no mesh dim says
    it (deepspeed.initialize then leaves that engine to DeepSpeed: self_built_grid_train.py, mode *_seq)."""
    import deepspeed.runtime.pipe.topology as module

    from compat import topology as ct
    from compat.engine_spec import topology_sizes
    from mesh_core import MeshSpecError

    Sequence = shapes(module)["SequenceTopology"]
    assert topology_sizes(Sequence(2, 1, 4)) == {"pp": 2, "dp": 4, "tp": 1}
    assert ct.extra_axes(Sequence(2, 1, 4)) == [] and ct.extra_axes(Sequence(2, 1, 1, 2)) == ["sequence"]
    with pytest.raises(MeshSpecError, match="sequence"):
        topology_sizes(Sequence(2, 1, 1, 2))
