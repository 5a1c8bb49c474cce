"""The reference walk that puts resumed groups where released ones were held, and the stand-in
a released group leaves (no processes: plain objects stand for groups)."""

from __future__ import annotations

from collections import namedtuple
from dataclasses import dataclass

import pytest
import torch

from mesh_core import MeshSpecError
from mesh_core.rebind import find_references, rebind_references
from mesh_core.step_aside import ReleasedCommunicator

pytestmark = pytest.mark.torch_releases


class Group:  # stands for a ProcessGroup: the walk matches by identity only
    pass


Pair = namedtuple("Pair", "group other")


@dataclass(frozen=True)
class Frozen:
    group: object


class Holder:  # a user's object: not entered unless the caller's descend says so
    def __init__(self, group):
        self.group = group


def _holder_module_object(group):
    obj = type("Optimizer", (), {"__module__": "deepspeed.runtime.zero.stage_1_and_2"})()
    obj.__dict__["dp_process_group"] = group
    return obj


def test_every_container_and_attribute_kind_is_rebound():
    old, new, other = Group(), Group(), Group()
    opt = _holder_module_object(old)
    param = torch.nn.Parameter(torch.zeros(2))
    param.ds_process_group = old
    root = {
        "list": [old, other],
        "tuple": (1, (old,)),
        "named": Pair(old, other),
        "set": {old},
        "keyed": {old: "x", "k": 1},
        "frozen": Frozen(old),
        "optimizer": opt,
        "param": param,
        "module": torch.nn.Linear(1, 1),
    }
    root["module"].extra = [old]
    root["cycle"] = root
    paths = rebind_references(
        [root], {id(old): (old, new)}, descend=lambda o: type(o).__module__ != __name__ or isinstance(o, Frozen)
    )
    assert root["list"] == [new, other]
    assert root["tuple"] == (1, (new,))
    assert root["named"] == Pair(new, other) and type(root["named"]) is Pair
    assert root["set"] == {new} and list(root["keyed"]) == [new, "k"]
    assert root["frozen"].group is new and opt.dp_process_group is new and param.ds_process_group is new
    assert root["module"].extra == [new]
    assert "dict['list'][0]" in paths and "dict['optimizer'].dp_process_group" in paths
    assert find_references([root], [old]) == []


def test_objects_outside_the_descend_rule_are_left_alone_and_found_only_where_reached():
    old, new = Group(), Group()
    user = Holder(old)  # a class of this test module: default_descend does not enter it
    root = [user, _holder_module_object(old)]
    rebind_references([root], {id(old): (old, new)})
    assert user.group is old and root[1].dp_process_group is new
    assert find_references([root], [old]) == []  # the walk does not see inside the user's object
    assert find_references([root], [old], descend=lambda o: True) == ["list[0].group"]


def test_nothing_to_rebind_touches_nothing():
    old = Group()
    root = [old]
    assert rebind_references([root], {}) == [] and root[0] is old


def test_a_released_communicator_names_its_ranks_and_the_remedy():
    standin = ReleasedCommunicator((0, 1), "MeshSpec(dp=2)")
    with pytest.raises(
        MeshSpecError, match=r"ranks \[0, 1\] of MeshSpec\(dp=2\) is released .*resume_communicators\(\)"
    ):
        standin.size()
    assert "resume_communicators()" in repr(standin)  # torch's own error quotes the repr
    assert not hasattr(standin, "__deepcopy__")  # copy / pickle probes see a plain object


def test_device_memory_is_what_the_backends_report_and_none_where_none_does():
    from mesh_core.step_aside import HeldCommunicator, MeshHoldings

    nccl = HeldCommunicator(("dp",), (0, 1), "nccl", "g", "alive", {"total": 6 << 20, "persist": 1 << 20})
    gloo = HeldCommunicator(("tp",), (0, 2), "gloo", "h", "alive", None)
    released = HeldCommunicator(("pp",), (0, 4), "", "", "released")
    assert MeshHoldings((nccl, gloo, released)).device_memory_bytes == 6 << 20
    assert MeshHoldings((gloo, released)).device_memory_bytes is None
    assert MeshHoldings((nccl, gloo, released)).alive == 2


# --- release / resume of a real mesh on torch's fake backend (rank 1 of 4) ---------------------------
class _Holder:  # a caller's object keeping a group (passed as a holder: a root is always entered)
    def __init__(self, group):
        self.group = group


def _ranks(group):
    import torch.distributed as dist

    return dist.get_process_group_ranks(group)


def test_destroyed_groups_come_back_with_the_same_ranks_where_they_were_held():
    from fakepg import fake_world
    from mesh_core import DeepSpeedDeviceMesh
    from mesh_core.step_aside import holds, release_communicators, resume_communicators

    with fake_world(1, 4):
        mesh = DeepSpeedDeviceMesh.build(dp=2, tp=2, flatten=[("dp", "tp")])
        tp, dp = mesh.get_group("tp"), mesh.get_group("dp")
        holder = _Holder((tp, [dp]))
        before = holds(mesh)
        record = release_communicators(mesh, holders=[holder])
        assert {c.state for c in holds(mesh).communicators} == {"released"} and holds(mesh).alive == 0
        assert all(
            isinstance(g, ReleasedCommunicator) for g in (holder.group[0], holder.group[1][0], mesh.get_group("tp"))
        )
        assert sorted(record.still_referenced()) == [(0, 1), (1, 3)]  # this test's own tp, dp variables
        del tp, dp
        assert record.still_referenced() == []
        with pytest.raises(MeshSpecError, match="release"):
            release_communicators(mesh)  # twice: refused
        resume_communicators(mesh, holders=[holder])
        after = holds(mesh)
        assert [(c.uses, c.ranks, c.state) for c in after.communicators] == [
            (c.uses, c.ranks, c.state) for c in before.communicators
        ]
        assert [c.group_name[:-2] for c in after.communicators] == [c.group_name[:-2] for c in before.communicators]
        assert holder.group[0] is mesh.get_group("tp") and _ranks(holder.group[0]) == mesh.get_group_ranks("tp") == [
            0,
            1,
        ]
        assert holder.group[1][0] is mesh.get_group("dp") and _ranks(mesh.get_group("dp")) == mesh.get_group_ranks(
            "dp"
        ) == [1, 3]
        assert mesh["tp"].get_group() is mesh.get_group("tp")  # the torch DeviceMesh is rebuilt
        assert resume_communicators(mesh) == []  # not released: nothing to do
        mesh.destroy()


def test_a_backend_that_suspends_keeps_its_groups(monkeypatch):
    from fakepg import fake_world
    from mesh_core import DeepSpeedDeviceMesh, step_aside

    calls = []

    class Suspending:
        def __init__(self, group):
            self.group = group

        def suspend(self):
            calls.append(("suspend", _ranks(self.group)))

        def resume(self):
            calls.append(("resume", _ranks(self.group)))

    monkeypatch.setattr(step_aside, "_suspendable", Suspending)
    with fake_world(1, 4):
        mesh = DeepSpeedDeviceMesh.build(dp=2, tp=2)
        tp = mesh.get_group("tp")
        record = step_aside.release_communicators(mesh)
        assert set(record.mode.values()) == {"suspend"} and mesh.get_group("tp") is tp
        assert [c.state for c in step_aside.holds(mesh).communicators] == ["suspended", "suspended"]
        assert step_aside.resume_communicators(mesh) == []
        assert mesh.get_group("tp") is tp and step_aside.holds(mesh).alive == 2
        order = [c[1] for c in calls[:2]]  # the mesh's creation order, the same on resume
        assert calls == [("suspend", order[0]), ("suspend", order[1]), ("resume", order[0]), ("resume", order[1])]
        assert sorted(order) == [[0, 1], [1, 3]]
        mesh.destroy()
