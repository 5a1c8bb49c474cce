"""The weight link under hostile input (docs/transfer.md, "Security"), each rank a thread of this
process: the store listens only where told; a link needs the shared secret; a record or table
rewritten without the secret, malformed, or naming boxes outside its tensors is one MeshSpecError
on both jobs' ranks before any byte lands, the receiver's tensors (and the memory behind them)
untouched, and the next honest round bit for bit; no ptrace grant unless asked for (Yama modelled)."""

from __future__ import annotations

import json
import socket
import threading
from datetime import timedelta

import pytest
import torch

from mesh_core import MeshSpecError
from mesh_core.transfer import WeightLink, _jobs, _memory

# not in the torch-release subset: tests/test_torch_releases_marker.py says why

SECRET = "test-secret"
FULL = torch.arange(16 * 8, dtype=torch.float32).view(16, 8)


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _link(address: str, role: str, **kwargs) -> WeightLink:
    kwargs.setdefault("secret", SECRET)
    return WeightLink(address, role, rank=0, world_size=1, timeout=timedelta(seconds=20), **kwargs)


def _rounds(
    sender_tamper=None, receiver_secret: str = SECRET, syncs: int = 2, moved: bool = False, tamper_round: int = 0
):
    """One sender and one receiver thread, ``syncs`` rounds each (an error recorded, then the next
    round); the sender's store values of round ``tamper_round`` passed through ``sender_tamper(key, payload,
    sign) -> stored value``. The receiver's shard lives inside a larger buffer whose rest is a
    canary. ``moved``: the sender passes new tensors (same record) each round."""
    address = f"127.0.0.1:{_port()}"
    out: dict = {"sender": [], "receiver": []}
    canary = torch.full((40, 8), -7.0)
    shard = canary[8:24]  # the 16 x 8 tensor the rollout gives; 8 rows of canary either side

    def sender() -> None:
        link = _link(address, "sender")
        honest = link._sign
        tensors = {"w": FULL.clone()}
        for step in range(syncs):
            if sender_tamper is not None and step == tamper_round:
                link._sign = lambda key, payload: sender_tamper(key, payload, honest)
            else:
                link._sign = honest
            if moved:
                tensors = {"w": FULL + step}
            else:
                tensors["w"].copy_(FULL + step)
            try:
                out["sender"].append(link.send(tensors))
            except MeshSpecError as err:
                out["sender"].append(str(err))

    def receiver() -> None:
        link = _link(address, "receiver", secret=receiver_secret)
        for step in range(syncs):
            before = canary.clone()
            try:
                link.receive({"w": shard})
                out["receiver"].append(torch.equal(shard, FULL + step))
            except MeshSpecError as err:
                out["receiver"].append(str(err))
                out.setdefault("untouched", []).append(torch.equal(canary, before))
            out.setdefault("canary", []).append(bool((canary[:8] == -7).all() and (canary[24:] == -7).all()))

    threads = [threading.Thread(target=sender), threading.Thread(target=receiver)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads)
    return out


def _rewrite(field_edit, resign: bool, kind: str = "/record/0"):
    """A tamper that edits the sender's ``kind`` value (JSON) and stores it signed again (an insider
    holding the secret, or a bug) or with the honest signature (someone without the secret)."""

    def tamper(key, payload, sign):
        if not key.endswith(kind):
            return sign(key, payload)
        edited = field_edit(json.loads(payload))
        text = edited if isinstance(edited, str) else json.dumps(edited)
        return sign(key, text) if resign else sign(key, payload)[:64] + text

    return tamper


def _widen(rec):
    rec["params"]["w"]["holds"][0][0][0] = [0, 17]  # one row past the tensor
    return rec


def _misshape(rec):
    rec["params"]["w"]["holds"][0][0] = [[0, 16]]  # a 1-d box for a 2-d tensor
    return rec


def _redirect(rec):
    rec["addresses"] = {key: (at or 0) + 4096 for key, at in rec["addresses"].items()}
    rec["addresses"]["w\x1f7"] = 4096  # and one for a holding it does not announce
    return rec


def _swap_endpoint(rec):
    rec["memory"] = dict(rec["memory"] or {"host": "h", "token_address": 1, "token": "00"}, pid=1)
    return rec


@pytest.mark.parametrize(
    "edit, resign, words",
    [
        (_redirect, False, "is not signed with this link's secret"),
        (_swap_endpoint, False, "is not signed with this link's secret"),
        (_widen, False, "is not signed with this link's secret"),
        (_widen, True, "leaves the shape (16, 8) in dim 0"),
        (_misshape, True, "is not 2 (start, stop) pairs"),
        (_redirect, True, "an address is announced for 'w #7', which it does not hold"),
        (lambda rec: '{"side": "sender", ', True, "the record of sender rank 0 is malformed"),
        (lambda rec: ["a list"], True, "not a sender's record"),
    ],
)
def test_a_bad_record_is_one_error_on_both_jobs_and_the_next_round_syncs(edit, resign, words):
    out = _rounds(_rewrite(edit, resign))
    assert isinstance(out["sender"][0], str) and words in out["sender"][0], out
    assert out["receiver"][0] == out["sender"][0], out  # the same error, before any byte moved
    assert out["untouched"] == [True] and all(out["canary"])
    assert out["receiver"][1] is True and not isinstance(out["sender"][1], str)


def test_a_receiver_without_the_secret_gets_nothing_and_an_honest_one_syncs_next():
    out = _rounds(receiver_secret="guessed", syncs=1)
    assert "is not signed with this link's secret" in out["sender"][0], out
    assert "is not signed with this link's secret" in out["receiver"][0], out
    assert out["untouched"] == [True]


def test_a_link_needs_a_secret(monkeypatch):
    monkeypatch.delenv(_jobs.SECRET_ENV, raising=False)
    with pytest.raises(
        MeshSpecError, match="a weight link needs a secret both jobs share: pass secret= or set DS_MESH_LINK_SECRET"
    ):
        WeightLink(f"127.0.0.1:{_port()}", "receiver", rank=0, world_size=1, secret="")
    monkeypatch.setenv(_jobs.SECRET_ENV, SECRET)
    link = WeightLink(f"127.0.0.1:{_port()}", "sender", rank=0, world_size=1)
    assert link._key == SECRET.encode()


@pytest.mark.skipif(not _memory.available(), reason="no same-host reads on this kernel (no moved-tensor table)")
def test_a_redirected_moved_table_is_refused_and_the_next_round_syncs():
    def table(moved):
        rank, addresses = moved
        return [rank, dict(addresses, **{"w\x1f3": 4096})]  # a holding rank 0 never announced

    out = _rounds(_rewrite(table, True, kind="/moved"), syncs=3, moved=True, tamper_round=1)
    assert out["receiver"][0] is True and out["receiver"][2] is True, out  # round 2: agreed anew, read
    assert "names holding 3 of 'w' of rank 0, which that rank did not announce" in out["receiver"][1], out
    assert "failed in the data phase on 1 of the ranks" in out["sender"][1], out
    assert out["untouched"] == [True] and all(out["canary"])


def _local_addresses() -> list[str]:
    """This host's addresses other than loopback (the interface a default route would use)."""
    found = set()
    for target in ("10.255.255.255", "192.0.2.1"):
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.connect((target, 9))
                found.add(s.getsockname()[0])
        except OSError:
            pass
    return sorted(a for a in found if not a.startswith("127."))


def test_the_store_listens_only_where_told():
    """Given 127.0.0.1 the link's store takes connections on loopback only (torch's own TCPStore
    server listens on every interface)."""
    others = _local_addresses()
    if not others:
        pytest.skip("this host has no address but loopback")
    if torch.__version__ < "2.7":  # its libuv store takes no listen fd: the link says so and listens everywhere
        pytest.skip(f"torch {torch.__version__}'s store cannot listen on one address")
    port = _port()
    link = _link(f"127.0.0.1:{port}", "sender")
    with socket.create_connection(("127.0.0.1", port), timeout=5):
        pass
    for address in others:
        with pytest.raises(OSError):
            socket.create_connection((address, port), timeout=5).close()
    assert link.store is not None


@pytest.mark.parametrize("transport, grants", [("auto", 0), ("gloo", 0), ("reads", 1)])
def test_no_ptrace_grant_unless_reads_are_asked_for(monkeypatch, transport, grants):
    """Yama ptrace_scope 1 modelled: a sending link calls prctl(PR_SET_PTRACER_ANY) only with
    transport="reads"; by default its process's ptrace state is left as it was."""
    if _memory._READV is None:
        pytest.skip("no cross-memory attach here: no grant is ever made")
    made = []
    monkeypatch.setattr(_memory, "_yama_scope", lambda: 1)
    monkeypatch.setattr(_memory, "_prctl", lambda option, arg: made.append((option, arg.value)) or 0)
    _link(f"127.0.0.1:{_port()}", "sender", transport=transport)
    assert made == [(_memory._PR_SET_PTRACER, _memory._PR_SET_PTRACER_ANY.value)] * grants
