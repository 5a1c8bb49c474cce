"""A failed mesh check where the rank whose process holds the store raises first: it must keep the
store up (bounded) until the other ranks have read the verdict, or they fail with "the store went away"
and never learn which ranks are missing. Modelled with threads, one per rank, each with its own store
client of one real TCPStore; the holder's server is shut down the moment its error is raised, as
when its process exits."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

from mesh_core import AbsentRanksError, MeshSpec, absence, consistency, rendezvous
from mesh_core.consistency import mesh_fields

pytestmark = pytest.mark.torch_releases

TIMEOUT = timedelta(seconds=1)
SPEC = MeshSpec.build(4, tp=2)  # ranks 2..3 never come (they run without ds-mesh)


class _World:
    """Per-thread rank, store client and default group (announcements are per world)."""

    def __init__(self) -> None:
        self.local = threading.local()

    def install(self, monkeypatch) -> None:
        monkeypatch.setattr(dist, "get_rank", lambda group=None: self.local.rank)
        monkeypatch.setattr(c10d, "_get_default_store", lambda: self.local.store)
        monkeypatch.setattr(c10d, "_get_default_group", lambda: self.local.world)


class _Group:
    pass


def _run(monkeypatch, late_s: float, announce_late_rank_first: bool) -> dict:
    world = _World()
    world.install(monkeypatch)
    monkeypatch.setattr(consistency, "SKIPPED_BACKENDS", ())
    holder = {"store": dist.TCPStore("127.0.0.1", 0, None, True, timedelta(seconds=30), wait_for_workers=False)}
    port = holder["store"].port
    outcome: dict = {}

    def rank(r: int) -> None:
        world.local.rank, world.local.world = r, _Group()
        world.local.store = (
            holder["store"] if r == 0 else dist.TCPStore("127.0.0.1", port, None, False, timedelta(seconds=30))
        )
        try:
            if r == 1:
                if announce_late_rank_first:  # what the shim does when deepspeed.initialize starts
                    absence.announce(world.local.store, world.local.world, r)
                time.sleep(late_s)
            consistency._check_over_store(SPEC, mesh_fields(SPEC), TIMEOUT)
        except Exception as err:  # noqa: BLE001 (the test asserts which)
            outcome[r] = (err.with_traceback(None), time.monotonic())  # its frames hold the store
        finally:
            if r == 0:  # the holder's process ends with its error
                world.local.store = holder["store"] = None

    threads = [threading.Thread(target=rank, args=(r,)) for r in (0, 1)]
    start = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads), "a rank hung"
    return {r: (err, when - start) for r, (err, when) in outcome.items()}


@pytest.mark.parametrize("late_s", [0.0, 1.3])
def test_every_rank_that_runs_ds_mesh_learns_the_missing_ranks_before_the_store_goes(monkeypatch, late_s):
    """Rank 1 arrives with rank 0, or after rank 0 gave up (0.3 s after its timeout): both name ranks 2..3."""
    outcome = _run(monkeypatch, late_s, announce_late_rank_first=True)
    for r in (0, 1):
        err = outcome[r][0]
        assert isinstance(err, AbsentRanksError), (r, repr(err))
        assert err.quiet == [2, 3] and "ranks 2..3 built no mesh at all" in str(err), (r, str(err))
    # rank 0 gave up before rank 1 came (then rank 1 is missing too in its verdict), or with it
    assert outcome[0][0].missing == ([1, 2, 3] if late_s else [2, 3]) and outcome[1][0].missing == [2, 3]
    assert outcome[0][1] < TIMEOUT.total_seconds() + late_s + rendezvous.LEAVE_WAIT_S  # bounded


def test_a_rank_nobody_knew_of_is_not_waited_for_beyond_the_arrivals(monkeypatch):
    """Without the announcement the holder cannot know rank 1 is coming: it leaves once every arrived
    rank has the verdict (at once here), and rank 1 gets the typed store-gone error."""
    outcome = _run(monkeypatch, 1.3, announce_late_rank_first=False)
    assert outcome[0][0].missing == [1, 2, 3] and outcome[0][1] < TIMEOUT.total_seconds() + 1.0
    assert isinstance(outcome[1][0], AbsentRanksError), repr(outcome[1][0])
    assert outcome[1][0].missing is None and "the store went away" in str(outcome[1][0])
