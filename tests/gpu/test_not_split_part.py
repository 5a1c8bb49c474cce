"""tools/gpu_check.sh's ``not_split`` part on CPU, through the fake NCCL world (tests/fakenccl.py): the
world backend's ``comm_split_count()`` counts the world collectives the fake world records (each one an
``ncclCommSplit`` of the world's communicator on GPUs); without it (nccl2 has none) the part's other
signal, whether torch found a split source for the creation, decides alone. The part must tell a
member-only group from a split-created one on a world of one (one GPU), and report whether the group
came out bound."""

from __future__ import annotations

import contextlib
import inspect
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from fakenccl import nccl_world  # noqa: E402


@contextlib.contextmanager
def _one_gpu_world(monkeypatch, counter: bool = True):
    monkeypatch.delenv("MESH_GPU_DRY_RUN", raising=False)
    monkeypatch.setenv("LOCAL_RANK", "0")
    import nccl_checks

    c10d = torch.distributed.distributed_c10d
    real_new = c10d._new_group_with_tag

    def new_group_with_tag(*args, **kwargs):  # a CPU torch has no NCCL: the fake world's backend serves it
        call = inspect.signature(real_new).bind(*args, **kwargs)
        if call.arguments.get("backend") in ("nccl", torch.distributed.Backend.NCCL):
            call.arguments["backend"] = None
        return real_new(*call.args, **call.kwargs)

    monkeypatch.setattr(c10d, "_new_group_with_tag", new_group_with_tag)  # under the fake world's recorder
    with nccl_world(0, 1) as log:
        world = torch.distributed.distributed_c10d._get_default_group()
        backend_type = type(world._get_backend(torch.device("cuda")))
        if counter:
            monkeypatch.setattr(backend_type, "comm_split_count", lambda self: len(log.world), raising=False)
        elif hasattr(backend_type, "comm_split_count"):
            monkeypatch.delattr(backend_type, "comm_split_count")
        yield nccl_checks


@pytest.mark.parametrize("counter", [True, False], ids=["comm_split_count", "no counter (nccl2)"])
def test_a_member_only_mesh_is_not_a_world_split_and_the_control_split_is(monkeypatch, counter):
    with _one_gpu_world(monkeypatch, counter) as checks:
        out = checks.part_not_split(0, 1)
    assert out["member_only"]["split_source_found"] == 0 and out["member_only"]["path"] == "LOCAL"
    assert out["world_new_group_control"]["split_source_found"] == 1  # the signal works
    assert out["comm_split_count"] is counter
    assert out["member_only"]["world_splits_made"] == (0 if counter else None)
    assert out["split_control"]["world_splits_made"] == (1 if counter else None)
    assert out["member_only"]["sum"] == 1.0
    # ok only when the member-only group is bound to this rank's GPU as a split is
    assert out["ok"] is (out["member_only"]["bound_device_id"] == "cuda:0")


@pytest.mark.parametrize("counter", [True, False], ids=["comm_split_count", "no counter (nccl2)"])
def test_it_fails_when_a_member_only_creation_splits_the_bound_world(monkeypatch, counter):
    """The bug a world of one cannot otherwise show: the bound device not cleared, so torch splits the
    world's communicator for a member-only group (on >= 2 GPUs the non-members never join: a hang)."""
    from mesh_core import torch_compat

    @contextlib.contextmanager
    def still_bound():
        yield torch_compat.bound_device()

    with _one_gpu_world(monkeypatch, counter) as checks:
        monkeypatch.setattr(torch_compat, "unbound_default_group", still_bound)
        out = checks.part_not_split(0, 1)
    assert out["member_only"]["split_source_found"] == 1 and out["ok"] is False
    assert out["member_only"]["world_splits_made"] == (1 if counter else None)


@pytest.mark.parametrize("version", ["2.6.0+cu124", "2.7.0"])
def test_on_torch_where_deepspeed_does_not_bind_the_bound_parts_say_why(monkeypatch, version):
    with _one_gpu_world(monkeypatch) as checks:
        monkeypatch.setattr(torch, "__version__", version)
        world = torch.distributed.distributed_c10d._get_default_group()
        monkeypatch.setattr(world, "bound_device_id", None)
        for part in (checks.part_not_split, checks.part_probe, checks.part_split):
            out = part(0, 1)
            assert out["ok"] and "torch#153960" in out["skipped"] and version in out["skipped"]
