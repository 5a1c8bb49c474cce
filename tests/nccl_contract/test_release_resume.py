"""release_communicators / resume_communicators on an NCCL world (the fake one): suspend is chosen
from what the backend object can do, a backend that refuses leaves no half-released mesh, and what
would break a release half-way is refused before anything is released."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch._C._distributed_c10d import Backend

from fakenccl import run_ranks

pytestmark = pytest.mark.torch_releases


def _cuda(rank):
    return torch.ones(1, device=torch.device("cuda", rank))


@pytest.fixture
def new_nccl(monkeypatch):
    """What the suspend decision reads on a GPU: CUDA present, NCCL 2.29.7 loaded, an NCCL backend."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda.nccl, "version", lambda: (2, 29, 7))
    monkeypatch.setattr(dist.ProcessGroup, "_get_backend_name", lambda self: "nccl")


def _release_and_resume(rank):
    from mesh_core import DeepSpeedDeviceMesh
    from mesh_core.step_aside import release_communicators, resume_communicators

    mesh = DeepSpeedDeviceMesh.build(ranks=[0, 1], tp=2, verify=False)
    record = release_communicators(mesh)
    modes = sorted(set(record.mode.values()))
    resume_communicators(mesh)
    dist.all_reduce(_cuda(rank), group=mesh.get_group("tp"))
    mesh.destroy()
    return modes


def test_a_backend_without_suspend_takes_the_destroy_path(new_nccl, monkeypatch):
    """torch 2.6–2.10: NCCL 2.29.7 installed under a torch whose backends have no suspend()."""
    monkeypatch.delattr(Backend, "suspend", raising=False)  # torch 2.6-2.10 have none
    monkeypatch.delattr(Backend, "resume", raising=False)
    logs = run_ranks(_release_and_resume, 4, ranks=[0, 1])
    assert [log.result for log in logs] == [["destroy"], ["destroy"]]


def test_a_backend_that_refuses_suspend_is_destroyed_instead(new_nccl, monkeypatch):
    def refuse(self):
        raise RuntimeError("ncclInvalidUsage: not supported")

    monkeypatch.setattr(Backend, "suspend", refuse, raising=False)
    logs = run_ranks(_release_and_resume, 4, ranks=[0, 1])
    assert [log.result for log in logs] == [["destroy"], ["destroy"]]


@pytest.mark.parametrize("hazard", ["capture", "split_share"])
def test_a_release_that_would_break_half_way_is_refused_before_anything_is_released(new_nccl, monkeypatch, hazard):
    from mesh_core import DeepSpeedDeviceMesh, MeshSpecError
    from mesh_core.step_aside import holds, release_communicators

    suspended = []
    monkeypatch.setattr(Backend, "suspend", lambda self: suspended.append(self), raising=False)
    monkeypatch.setattr(Backend, "resume", lambda self: None, raising=False)
    if hazard == "capture":
        monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
        monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
        monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
        monkeypatch.setattr(torch.cuda, "mem_get_info", lambda *a: (0, 0))
    else:
        monkeypatch.setenv("NCCL_COMM_SPLIT_SHARE_RESOURCES", "1")

    def scenario(rank):
        mesh = DeepSpeedDeviceMesh.build(ranks=[0, 1], tp=2, verify=False)
        with pytest.raises(MeshSpecError, match="CUDA-graph capture" if hazard == "capture" else "SHARE_RESOURCES=1"):
            release_communicators(mesh)
        states = [c.state for c in holds(mesh).communicators]
        dist.all_reduce(_cuda(rank), group=mesh.get_group("tp"))  # still usable
        mesh.destroy()
        return states

    logs = run_ranks(scenario, 4, ranks=[0, 1])
    assert [log.result for log in logs] == [["alive"], ["alive"]] and suspended == []


def test_a_device_mesh_and_a_dtensor_built_before_a_release_work_after_resume_on_the_destroy_path():
    """The torch DeviceMesh that DTensors (and FSDP2) were built on resolves its groups by name; the
    destroy path re-creates them under the next generation's name, and the old names resolve to them."""
    if torch.__version__ < "2.13":  # run on 2.13 and 2.15; on 2.6 the old DeviceMesh's get_group finds no group
        pytest.skip(f"a DeviceMesh held across a release is renewed from torch 2.13 on (torch {torch.__version__})")
    from torch.distributed.tensor import DTensor, Replicate, Shard

    from fakepg import fake_world
    from mesh_core import DeepSpeedDeviceMesh
    from mesh_core.step_aside import release_communicators, resume_communicators

    with fake_world(0, 4):
        mesh = DeepSpeedDeviceMesh.build(dp=2, tp=2, verify=False)
        held = mesh["tp"]  # what a DTensor / FSDP2 module keeps
        tensor = DTensor.from_local(torch.ones(2, 2), held, [Shard(0)])
        before = held.get_group().group_name
        record = release_communicators(mesh, holders=[held])
        assert set(record.mode.values()) == {"destroy"}
        resume_communicators(mesh, holders=[held])
        group = held.get_group()
        assert group is mesh.get_group("tp") and group.group_name != before
        assert tensor.redistribute(held, [Replicate()]).to_local().shape == (4, 2)
        assert mesh["tp"].get_group() is group
        mesh.destroy()
