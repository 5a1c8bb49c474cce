"""Thread safety of group naming, registry bookkeeping and the consistency check (one process)."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

import mesh_core.consistency as consistency
import mesh_core.registry as registry_mod
from fakepg import fake_world
from mesh_core import MeshSpec, MeshSpecError
from mesh_core.consistency import ConcurrentCheckError, mesh_fields

pytestmark = pytest.mark.torch_releases

JOIN_S = 30


def test_naming_hook_answers_only_its_thread_and_is_removed_after_an_error():
    torch_namer = c10d._process_group_name
    inside, release, seen = threading.Event(), threading.Event(), {}

    def creating():
        with registry_mod._named("mine"):
            seen["own"] = c10d._process_group_name([0, 1], True)
            inside.set()
            release.wait(JOIN_S)

    thread = threading.Thread(target=creating, daemon=True)
    thread.start()
    assert inside.wait(JOIN_S)
    # torch's own name, computed first: from torch 2.14 its namer advances the counter that salts it
    expected = c10d._hash_ranks_to_str([0, 1])
    seen["other"] = c10d._process_group_name([0, 1], True)  # while the hook is installed
    release.set()
    thread.join(JOIN_S)
    assert seen["own"] == "mine"
    assert seen["other"] == expected  # torch's own name in another thread
    assert c10d._process_group_name is torch_namer
    with pytest.raises(ValueError):
        with registry_mod._named("failing"):
            raise ValueError("creation failed")
    assert c10d._process_group_name is torch_namer


def test_a_rank_set_two_threads_request_at_once_is_created_once(monkeypatch):
    started, release, calls = threading.Event(), threading.Event(), []
    real = registry_mod.new_member_group

    def slow_create(ranks, name, backend=None):
        calls.append(name)
        started.set()
        release.wait(JOIN_S)  # the second thread asks while this creation is in flight
        return real(ranks, name, backend)

    monkeypatch.setattr(registry_mod, "new_member_group", slow_create)
    with fake_world(0, 4):
        registry = registry_mod.registry_for_world()
        got = {}
        first = threading.Thread(target=lambda: got.setdefault("a", registry.get([0, 1], asker="a")), daemon=True)
        first.start()
        assert started.wait(JOIN_S)
        pending = registry._pending[registry.key([0, 1])]  # the first thread's creation in flight
        waiting = threading.Event()
        pending_wait = pending.wait

        def wait(timeout=None):
            waiting.set()
            return pending_wait(timeout)

        pending.wait = wait
        second = threading.Thread(target=lambda: got.setdefault("b", registry.get([0, 1], asker="b")), daemon=True)
        second.start()
        assert waiting.wait(JOIN_S)  # the second thread waits on the first one's creation
        release.set()
        first.join(JOIN_S)
        second.join(JOIN_S)
        assert got["a"] is got["b"] is not None
        assert len(calls) == 1 and (registry.created, registry.reused) == (1, 1)
        assert registry.release([registry.key([0, 1])] * 2) == 1


def test_two_threads_checking_one_rank_set_at_once_raise(monkeypatch):
    store = dist.HashStore()
    monkeypatch.setattr(c10d, "_get_default_store", lambda: store)
    spec = MeshSpec.build(8, ranks=[1, 2], tp=2)
    outcome = {}

    def waiting():  # rank 2 never comes: this check waits until its timeout
        try:
            consistency._check_over_store(spec, mesh_fields(spec), timedelta(seconds=3))
        except MeshSpecError as err:
            outcome["waiting"] = str(err)

    with fake_world(1, 8):
        thread = threading.Thread(target=waiting, daemon=True)
        thread.start()
        deadline = time.monotonic() + JOIN_S
        while not consistency._IN_FLIGHT and time.monotonic() < deadline:
            time.sleep(0.01)
        with pytest.raises(ConcurrentCheckError, match="two threads of rank 1 build meshes over the ranks of"):
            consistency._check_over_store(spec, mesh_fields(spec), timedelta(seconds=3))
        thread.join(JOIN_S)
    assert "missing: rank 2" in outcome["waiting"]
    assert not consistency._IN_FLIGHT
