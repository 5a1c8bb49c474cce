"""The store rendezvous every pre-flight check uses: counts, flags, timeouts that name ranks, clean-up."""

from __future__ import annotations

from datetime import timedelta

import pytest
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

from fakepg import fake_world
from mesh_core import MeshSpecError
from mesh_core.rendezvous import Arrival, arrive, differing_fields, forget, ranks_text

pytestmark = pytest.mark.torch_releases


def _absent(arrived, missing):
    return f"arrived {arrived} missing {missing}"


def _other_arrives(store, prefix, rank, members, flag=False):
    """What ``arrive`` does on another member before this one (its half: append + count)."""
    store.append(f"{prefix}/who", f"{rank},")
    store.add(f"{prefix}/arrived", 1 + (len(members) + 1) * int(flag))


def test_the_last_arrival_completes_the_round_with_the_number_that_flagged():
    store = dist.HashStore()
    with fake_world(2, 4):
        members = [0, 1, 2, 3]
        for other, flag in ((0, True), (1, False), (3, True)):
            _other_arrives(store, "r", other, members, flag)
        arrival = arrive(store, "r", members, timedelta(seconds=5), _absent, flag=False)
        assert (arrival.flagged, arrival.last) == (2, True)
        assert store.get("r/state") == b"done:2"


def test_flags_and_marks_are_counted_apart_and_every_member_reads_both():
    """Two independent yes/no questions in one arrival (the weight link: "agree anew", "my tensors
    moved"), every member in its own thread: each reads the same two counts; one completed it."""
    import threading

    store = dist.HashStore()
    members = list(range(5))
    flags, marks = [True, False, True, True, False], [False, True, True, False, False]
    got: dict = {}

    def member(r: int) -> None:
        got[r] = arrive(store, "m", members, timedelta(seconds=10), _absent, flag=flags[r], mark=marks[r], rank=r)

    threads = [threading.Thread(target=member, args=(r,)) for r in members]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert {(a.flagged, a.marked) for a in got.values()} == {(3, 2)}
    assert sum(a.last for a in got.values()) == 1


def test_a_member_that_waits_in_vain_names_who_arrived_and_who_is_missing_and_a_late_one_learns_it():
    store = dist.HashStore()
    members = [1, 4, 5, 6]
    with fake_world(4, 8):
        _other_arrives(store, "r", 1, members)
        with pytest.raises(MeshSpecError, match=r"^arrived \[1, 4\] missing \[5, 6\]$"):
            arrive(store, "r", members, timedelta(seconds=0.2), _absent)
    assert store.get("r/state") == b"abandoned"
    with fake_world(5, 8):
        _other_arrives(store, "r", 6, members)  # 6 then 5: the last two come after the others gave up
        with pytest.raises(MeshSpecError, match=r"^arrived \[1, 4, 5, 6\] missing \[\]$"):
            arrive(store, "r", members, timedelta(seconds=5), _absent)


def test_forget_deletes_the_round_keys():
    store = dist.HashStore()
    with fake_world(0, 1):
        arrive(store, "r", [0], timedelta(seconds=5), _absent, flag=True)
        assert store.check(["r/who", "r/arrived", "r/state"])
        forget(store, "r")
        assert not any(store.check([f"r/{k}"]) for k in ("who", "arrived", "state"))


def test_transfer_agreement_keeps_the_store_bounded_over_many_rounds(monkeypatch):
    """Each round's last arrival deletes the round before's keys (the records too after a slow round)."""
    from mesh_core.transfer._agree import agree

    store = dist.HashStore()
    monkeypatch.setattr(c10d, "_get_default_store", lambda: store)
    record = {"meshes": ["a", "b"], "layouts": {}, "dtypes": {}, "problems": [], "flags": {}}
    with fake_world(0, 1):
        counts, merged = [], []
        monkeypatch.setattr(
            "mesh_core.transfer._agree.merge", lambda members, records: merged.append(records) or records
        )
        for i in range(12):
            changed = dict(record, meshes=["a", f"b{i // 4}"])  # a new record every 4 rounds: a slow round
            agreed, finish = agree([0], changed, key="k", timeout=timedelta(seconds=5))
            assert agreed == [changed]
            finish()
            counts.append(store.num_keys())
    assert len(merged) == 3  # rounds 0, 4, 8 published their records; the others reused the verdict
    assert counts == [7, 3, 3, 3] * 3, counts


def test_differing_fields_and_rank_runs():
    rows = [{"dims": "tp=2", "ranks": "0..3"}, {"dims": "tp=2", "ranks": "0..3"}, {"dims": "dp=2"}]
    assert differing_fields(rows, [0, 1, 5]) == [
        "dims: tp=2 on ranks 0..1; dp=2 on rank 5",
        "ranks: 0..3 on ranks 0..1; <missing> on rank 5",
    ]
    assert differing_fields(rows[:2], [0, 1]) == []
    assert differing_fields(rows, [0, 1, 5], show=repr, absent="<not given>")[1] == (
        "ranks: '0..3' on ranks 0..1; '<not given>' on rank 5"
    )
    assert ranks_text([0, 1, 2, 5, 7, 8], "rank") == "ranks 0..2,5,7..8"
    assert (
        ranks_text(range(4)) == "0..3" and ranks_text([3], "rank") == "rank 3" and ranks_text([], "rank") == "rank none"
    )


def test_with_the_store_timeout_a_waiter_reads_the_outcome_in_one_blocking_get_and_still_names_the_missing():
    store = dist.HashStore()
    store.set_timeout(timedelta(seconds=0.3))
    members = [0, 1, 2]
    with fake_world(1, 3):
        with pytest.raises(MeshSpecError, match=r"^arrived \[1\] missing \[0, 2\]$"):
            arrive(store, "r", members, store.timeout, _absent)
        assert store.get("r/state") == b"abandoned"
        _other_arrives(store, "s", 0, members, flag=True)
        store.set("s/state", "done:1")  # as the last arrival will have written it (rank 1 reads it, waiting)
        assert arrive(store, "s", members, store.timeout, _absent) == Arrival(1, False)


def test_give_up_cuts_the_wait_short_only_when_its_predicate_says_so():
    """``give_up=(wait, predicate)``: after ``wait`` the round is abandoned if the predicate, given the
    arrivals so far, is true; otherwise the member waits on to the timeout (and a round given up either
    way is abandoned for everyone)."""
    seen = []

    def never(arrived):
        seen.append(set(arrived))
        return False

    store = dist.HashStore()
    with fake_world(1, 2):
        with pytest.raises(MeshSpecError, match=r"arrived \[1\] missing \[0\]"):
            arrive(store, "a", [0, 1], timedelta(seconds=0.4), _absent, give_up=(timedelta(seconds=0.1), never))
        assert seen == [{1}] and store.get("a/state") == b"abandoned"
        with pytest.raises(MeshSpecError, match=r"arrived \[1\] missing \[0\]"):
            arrive(
                store,
                "b",
                [0, 1],
                timedelta(minutes=10),
                _absent,
                give_up=(timedelta(seconds=0.1), lambda arrived: arrived == {1}),
            )
        assert store.get("b/state") == b"abandoned"
