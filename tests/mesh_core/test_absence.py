"""Ranks that never joined a mesh (one process, torch's fake backend, a HashStore as the default
store): the typed error, which missing ranks built no mesh at all, hints from a layer above, and a
store that went away while a rank waited."""

from __future__ import annotations

import logging
from datetime import timedelta

import pytest
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

import mesh_core.consistency as consistency
from fakepg import fake_world
from mesh_core import AbsentRanksError, MeshSpec, MeshSpecError, absence
from mesh_core.consistency import mesh_fields

pytestmark = pytest.mark.torch_releases

SHORT = timedelta(seconds=0.2)


@pytest.fixture
def store(monkeypatch):
    store = dist.HashStore()
    monkeypatch.setattr(c10d, "_get_default_store", lambda: store)
    return store


def _check(spec):
    consistency._check_over_store(spec, mesh_fields(spec), SHORT)


def test_a_missing_rank_that_built_meshes_before_is_not_called_quiet(store):
    store.append(absence.BUILDERS_KEY, "3,")  # rank 3 checked a mesh earlier in this world
    with fake_world(1, 4):
        with pytest.raises(AbsentRanksError) as caught:
            _check(MeshSpec.build(4, tp=2))
    err = caught.value
    assert (err.arrived, err.missing, err.quiet) == ([1], [0, 2, 3], [0, 2])
    assert "missing: ranks 0,2..3; of those, ranks 0,2 built no mesh at all in this world" in str(err)
    assert err.rank == 1 and err.timeout == SHORT and err.mesh == MeshSpec.build(4, tp=2).describe()
    assert isinstance(err, MeshSpecError) and isinstance(err, ValueError)


def test_hints_of_a_layer_above_end_the_message_and_a_failing_hint_is_left_out(store, caplog):
    def hint(error):
        return f"HINT: {error.quiet} never built a mesh"

    def broken(error):
        raise RuntimeError("boom")

    absence.add_hint(broken)
    absence.add_hint(hint)
    absence.add_hint(hint)  # once, however often added
    try:
        with fake_world(0, 2), caplog.at_level(logging.ERROR, logger="mesh_core.absence"):
            with pytest.raises(AbsentRanksError) as caught:
                _check(MeshSpec.build(2, tp=2))
    finally:
        absence.remove_hint(hint)
        absence.remove_hint(broken)
    assert caught.value.hints == ["HINT: [1] never built a mesh"]
    assert str(caught.value).endswith("in the same order. HINT: [1] never built a mesh")
    assert "boom" in caplog.text
    with fake_world(0, 2):  # removed: no hint any more
        with pytest.raises(AbsentRanksError) as caught:
            _check(MeshSpec.build(2, tp=2))
    assert caught.value.hints == [] and "HINT" not in str(caught.value)


class _GoneAfterWait:
    """A store whose process ends while this rank waits: every call after the wait fails."""

    def __init__(self, store):
        self.store, self.gone = store, False
        self.timeout = store.timeout

    def __getattr__(self, name):
        def call(*args, **kwargs):
            if self.gone:
                raise dist.DistNetworkError("Connection reset by peer")
            if name in ("get", "wait") and "state" in str(args[0]):
                self.gone = True
                raise dist.DistStoreError("wait timeout")
            return getattr(self.store, name)(*args, **kwargs)

        return call


def test_a_store_that_went_away_gives_the_typed_error_not_a_raw_network_error(monkeypatch):
    gone = _GoneAfterWait(dist.HashStore())
    monkeypatch.setattr(c10d, "_get_default_store", lambda: gone)
    with fake_world(1, 2):
        with pytest.raises(AbsentRanksError, match="the store went away") as caught:
            _check(MeshSpec.build(2, tp=2))
    assert caught.value.missing is None and caught.value.quiet is None
    assert isinstance(caught.value.__cause__, dist.DistNetworkError)


def test_members_of_a_failed_round_count_themselves_out_before_raising():
    """Each member of a failed round counts itself out under ``left`` (the member holding the store
    waits for the others' count before raising, so it does not end the store under them)."""
    from mesh_core.rendezvous import arrive

    store = dist.HashStore()
    store.append("r/who", "0,")  # rank 0 arrived, gave up and counted itself out already
    store.add("r/arrived", 1)
    store.add("r/left", 1)
    with fake_world(1, 3):
        with pytest.raises(MeshSpecError, match=r"^\[0, 1\] \[2\]$"):
            arrive(store, "r", [0, 1, 2], SHORT, lambda arrived, missing: f"{arrived} {missing}")
    assert store.add("r/left", 0) == 2


@pytest.fixture
def quiet_bound():
    """Set a shorter wait for ranks that announced nothing (as the shim does); unset after the test."""
    yield absence.set_quiet_bound
    absence.set_quiet_bound(None)


def test_a_quiet_bound_gives_up_on_a_rank_that_announced_nothing_before_the_timeout(store, quiet_bound):
    """Rank 0 never announced itself (it runs no mesh code): the check gives up after the quiet bound,
    not the 10-minute timeout, and says which wait ran out."""
    bound = timedelta(seconds=0.2)
    quiet_bound(lambda: bound)
    with fake_world(1, 2):
        with pytest.raises(AbsentRanksError) as caught:
            spec = MeshSpec.build(2, tp=2)
            consistency._check_over_store(spec, mesh_fields(spec), timedelta(minutes=10))
    err = caught.value
    assert (err.missing, err.quiet, err.timeout) == ([0], [0], bound)
    assert (
        "started checking it within 0:00:00.200000 (arrived: rank 1; missing: rank 0; rank 0 built no mesh at "
        "all in this world); the missing rank builds a different mesh (or none), or has started no mesh within "
        "0:00:00.200000"
    ) in str(err)
    assert "up to the process-group timeout, 0:10:00" in str(err)


def test_a_quiet_bound_still_waits_the_timeout_for_a_rank_that_announced_itself(store, quiet_bound):
    """Rank 0 said it builds meshes (a shim rank, merely late): the bound does not apply to it."""
    quiet_bound(lambda: timedelta(seconds=0.1))
    store.append(absence.BUILDERS_KEY, "0,")
    with fake_world(1, 2):
        with pytest.raises(AbsentRanksError) as caught:
            spec = MeshSpec.build(2, tp=2)
            consistency._check_over_store(spec, mesh_fields(spec), timedelta(seconds=0.5))
    err = caught.value
    assert (err.missing, err.quiet, err.timeout) == ([0], [], timedelta(seconds=0.5))
    assert "the missing rank builds a different mesh (or none), or is later than the process-group timeout" in str(err)


def test_a_quiet_bound_of_none_or_longer_than_the_timeout_leaves_the_timeout(store, quiet_bound):
    for bound in (lambda: None, lambda: timedelta(hours=1)):
        quiet_bound(bound)
        with fake_world(1, 2):
            with pytest.raises(AbsentRanksError) as caught:
                _check(MeshSpec.build(2, tp=2))
        assert caught.value.timeout == SHORT and "later than the process-group timeout" in str(caught.value)


def test_a_store_that_went_away_under_a_quiet_bound_names_both_waits(monkeypatch, quiet_bound):
    gone = _GoneAfterWait(dist.HashStore())
    monkeypatch.setattr(c10d, "_get_default_store", lambda: gone)
    quiet_bound(lambda: timedelta(seconds=0.1))
    with fake_world(1, 2):
        with pytest.raises(AbsentRanksError, match="the store went away") as caught:
            _check(MeshSpec.build(2, tp=2))
    assert "within 0:00:00.100000 (ranks that had built no mesh) or 0:00:00.200000 (the others)" in str(caught.value)
