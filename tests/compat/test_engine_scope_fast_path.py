"""An engine entry point's fast path (compat.engine_scope.scoped_entry_point), one process on the
fake backend (rank 1 of 4).

An entry point that finds nothing to change (its engine's groups state current, its mesh the
default one and over the whole world, no other engine in scope) marks the state, and later entries
only check the mark and the default mesh. Every change of the groups state clears the mark, so an
entry after any such change still runs with its engine's state, and the change stands again after it.
"""

from __future__ import annotations

import pytest
import torch

import compat.groups as groups
from compat import engine_scope
from compat.engine_scope import ENGINE_STATE_ATTR, GroupsState, activate, capture, scope_mesh, scoped_entry_point
from mesh_core import DeepSpeedDeviceMesh
from mesh_core.roles.default import live_default_mesh, set_default_mesh, use_mesh

pytestmark = pytest.mark.torch_releases


class _Engine:
    """Stands in for an engine: ``step`` records what the legacy state looks like inside it."""

    def __init__(self, mesh: DeepSpeedDeviceMesh, mpu: object = None) -> None:
        self.__dict__[ENGINE_STATE_ATTR] = GroupsState(mesh, mpu, None)
        self.seen: list[tuple] = []

    def step(self) -> str:
        self.seen.append((groups.bound_mesh(), groups.mpu, groups.mesh_device, live_default_mesh(), scope_mesh()))
        return "stepped"


_Engine.step = scoped_entry_point(_Engine.step)  # as compat.install scopes DeepSpeedEngine.step


@pytest.fixture
def restore_groups(world):
    before = capture()
    try:
        yield
    finally:
        activate(before)
        set_default_mesh(None)


def _state(engine: _Engine) -> GroupsState:
    return engine.__dict__[ENGINE_STATE_ATTR]


def _settled(mesh: DeepSpeedDeviceMesh, mpu: object = None) -> _Engine:
    """An engine whose state is current and whose mesh is the default, after one entry."""
    engine = _Engine(mesh, mpu)
    activate(_state(engine))
    set_default_mesh(mesh)
    assert engine.step() == "stepped"
    return engine


def test_an_entry_with_nothing_to_change_marks_the_state(restore_groups):
    mesh = DeepSpeedDeviceMesh.build(dp=2, tp=2)
    engine = _settled(mesh)
    assert groups.STATE_MARK[0] is _state(engine)
    engine.step()
    # the fast path pushes no scope: for a whole-world mesh a scope changes nothing (None serves alike)
    assert engine.seen == [(mesh, None, None, mesh, mesh), (mesh, None, None, mesh, None)]


class _Mpu:
    pass


def _change_dsg_mpu(other):
    import deepspeed.utils.groups as dsg

    dsg.mpu = other  # through the shim's forwarding module class


CHANGES = {
    "compat.groups.mpu written": lambda other: setattr(groups, "mpu", _Mpu()),
    "compat.groups.mesh_device written": lambda other: setattr(groups, "mesh_device", other),
    "another mesh bound": lambda other: groups.bind_mesh(other),
    "the mesh unbound": lambda other: groups.bind_mesh(None),
    "a wrong grid set": lambda other: groups._set_wrong_grid(engine_scope.AmbiguousGrid(["a", "b"])),
    "groups released": lambda other: groups._release_process_group_references(),
    "another state activated": lambda other: activate(GroupsState(other, None, None)),
}


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_any_groups_change_clears_the_mark_and_the_next_entry_restores_the_engine_state(restore_groups, change):
    mesh, other = DeepSpeedDeviceMesh.build(dp=2, tp=2), DeepSpeedDeviceMesh.build(order=("tp", "dp"), tp=2, dp=2)
    engine = _settled(mesh)
    CHANGES[change](other)
    assert groups.STATE_MARK[0] is None
    changed = (groups.bound_mesh(), groups.mpu, groups.mesh_device, groups._WRONG_GRID)
    engine.step()
    assert engine.seen[-1][:4] == (mesh, None, None, mesh)
    assert (groups.bound_mesh(), groups.mpu, groups.mesh_device, groups._WRONG_GRID) == changed


@pytest.mark.deepspeed
def test_deepspeed_utils_groups_mpu_written_clears_the_mark(restore_groups, shim):
    mesh = DeepSpeedDeviceMesh.build(dp=4)
    engine = _settled(mesh)
    sentinel = _Mpu()
    _change_dsg_mpu(sentinel)
    assert groups.STATE_MARK[0] is None and groups.mpu is sentinel
    engine.step()
    assert engine.seen[-1][1] is None and groups.mpu is sentinel


def test_another_default_mesh_takes_the_full_path(restore_groups):
    mesh, other = DeepSpeedDeviceMesh.build(dp=4), DeepSpeedDeviceMesh.build(tp=4)
    engine = _settled(mesh)
    with use_mesh(other):
        engine.step()
        assert live_default_mesh() is other
    assert engine.seen[-1][3:] == (mesh, mesh)


def test_a_sub_world_engine_never_marks_and_is_in_scope_inside(restore_groups):
    mesh = DeepSpeedDeviceMesh.build(ranks=[0, 1], dp=2)
    engine = _settled(mesh)
    engine.step()
    assert groups.STATE_MARK[0] is None
    assert [seen[4] for seen in engine.seen] == [mesh, mesh]


def test_an_entry_inside_another_engine_never_marks(restore_groups):
    inner_mesh, outer_mesh = DeepSpeedDeviceMesh.build(dp=4), DeepSpeedDeviceMesh.build(ranks=[0, 1], dp=2)
    inner = _Engine(inner_mesh)
    activate(_state(inner))
    set_default_mesh(inner_mesh)
    groups.STATE_MARK[0] = None
    engine_scope._scope_meshes.append(outer_mesh)  # as inside outer's step
    try:
        inner.step()
    finally:
        engine_scope._scope_meshes.pop()
    assert groups.STATE_MARK[0] is None
    assert inner.seen[-1][4] is inner_mesh  # the whole-world engine masks the sub-world one


def test_an_engine_without_state_is_no_fast_path(restore_groups):
    engine = _Engine(DeepSpeedDeviceMesh.build(dp=4))
    engine.__dict__[ENGINE_STATE_ATTR] = None
    groups.STATE_MARK[0] = None
    engine.step()
    assert engine.seen[-1][4] is None  # an engine built without the shim: no scope (it masks outer ones)


@pytest.mark.deepspeed
def test_a_deepspeed_engine_takes_the_fast_path_from_its_second_step(world, shim):
    import deepspeed

    engine = deepspeed.initialize(
        model=torch.nn.Linear(4, 4),
        config={
            "train_micro_batch_size_per_gpu": 1,
            "steps_per_print": 10**6,
            "optimizer": {"type": "Adam", "params": {"torch_adam": True}},
        },
    )[0]
    try:
        engine(torch.randn(1, 4))
        assert groups.STATE_MARK[0] is getattr(engine, ENGINE_STATE_ATTR)
        assert groups.bound_mesh() is engine.mesh_device
    finally:
        engine.destroy()
    assert groups.STATE_MARK[0] is None


class _Signatures:
    """Methods of every parameter kind an engine entry point may have."""

    def defaults(self, loss, retain_graph=False, scale_wrt_gas=True):
        return loss, retain_graph, scale_wrt_gas

    def varargs(self, *inputs, **kwargs):
        return inputs, kwargs

    def kinds(self, x, /, y=2, *rest, z, w=4, **extra):
        return x, y, rest, z, w, extra

    def reserved(self, original, state=1):  # names the entry point itself uses: passed on as *args
        return original, state


def test_an_entry_point_keeps_the_methods_parameters_and_passes_every_argument_on():
    import inspect

    wrapped = {
        name: scoped_entry_point(vars(_Signatures)[name], f"_Signatures.{name}")
        for name in ("defaults", "varargs", "kinds", "reserved")
    }
    engine = _Signatures()
    for name, entry in wrapped.items():
        original = getattr(engine, name)
        assert inspect.signature(entry) == inspect.signature(vars(_Signatures)[name])
        bound = entry.__get__(engine)
        for args, kwargs in {
            "defaults": [((1,), {}), ((1, True), {"scale_wrt_gas": False}), ((), {"loss": 3})],
            "varargs": [((), {}), ((1, 2), {"k": 3})],
            "kinds": [((1,), {"z": 3}), ((1, 5, 6, 7), {"z": 3, "w": 0, "q": 9})],
            "reserved": [((1,), {}), ((), {"original": 1, "state": 2})],
        }[name]:
            assert bound(*args, **kwargs) == original(*args, **kwargs)
    for args, kwargs in (((1,), {}), ((), {"x": 1, "z": 3})):  # a wrong call fails as the method's own does
        with pytest.raises(TypeError) as theirs:
            engine.kinds(*args, **kwargs)
        with pytest.raises(TypeError) as ours:
            wrapped["kinds"].__get__(engine)(*args, **kwargs)
        assert str(ours.value) == str(theirs.value) and "_Signatures.kinds()" in str(ours.value)
