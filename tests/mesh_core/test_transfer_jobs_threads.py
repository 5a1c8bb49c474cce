"""mesh_core.transfer._jobs with the sending job's engine-like modules (an AutoTP tp=2 layer read
from DeepSpeed's per-parameter metadata, a whole replicated bias) and a 1-rank receiving job, each
rank a thread of this process (gloo runs in threads): bit for bit; twice with the cached plan."""

from __future__ import annotations

import socket
import threading
from datetime import timedelta

import pytest
import torch

from mesh_core import MeshSpec
from mesh_core.transfer import WeightLink
from mesh_core.transfer._engines import AUTOTP_META

# not in the torch-release subset: tests/test_torch_releases_marker.py says why

SECRET = "test-secret"  # the links' shared secret
FULL_WEIGHT = torch.arange(8 * 3, dtype=torch.float32).view(8, 3)
FULL_BIAS = torch.tensor([0.5, -1.0, 2.0])


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _TensorParallel(torch.nn.Module):
    """Rank ``tp``'s AutoTP shard of an 8 x 3 weight split by rows, and a replicated bias."""

    def __init__(self, tp: int, version: int) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(FULL_WEIGHT[4 * tp : 4 * tp + 4] + version)
        setattr(self.weight, AUTOTP_META, {"partition_dim": 0, "partition_sizes": [4, 4], "logical_shape": (8, 3)})
        self.bias = torch.nn.Parameter(FULL_BIAS + version)


def test_autotp_shards_and_replicas_reach_a_whole_receiver_bit_for_bit():
    address = f"127.0.0.1:{_port()}"
    spec = MeshSpec.build(2, tp=2)
    results: dict = {}
    errors: list = []

    def sender(rank: int) -> None:
        try:
            link = WeightLink(address, "sender", rank=rank, world_size=2, secret=SECRET, timeout=timedelta(seconds=30))
            results[("sender", rank)] = [link.send(_TensorParallel(rank, v), spec=spec) for v in (1, 2)]
        except Exception as err:  # noqa: BLE001 (reported below)
            errors.append(err)

    def receiver() -> None:
        try:
            link = WeightLink(address, "receiver", rank=0, world_size=1, secret=SECRET, timeout=timedelta(seconds=30))
            got = []
            for _ in (1, 2):
                tensors = {"weight": torch.zeros(8, 3), "bias": torch.zeros(3)}
                stats = link.receive(tensors)
                got.append((stats, {n: t.clone() for n, t in tensors.items()}))
            results["receiver"] = got
        except Exception as err:  # noqa: BLE001
            errors.append(err)

    threads = [
        threading.Thread(target=sender, args=(0,)),
        threading.Thread(target=sender, args=(1,)),
        threading.Thread(target=receiver),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    for version, (stats, tensors) in zip((1, 2), results["receiver"]):
        assert torch.equal(tensors["weight"], FULL_WEIGHT + version)
        assert torch.equal(tensors["bias"], FULL_BIAS + version)
        assert stats.bytes == (24 + 3) * 4
    assert results["receiver"][0][0].agreed_again and not results["receiver"][1][0].agreed_again
    # each tp rank sends its own rows; the replicated bias is sent by one of the two
    sent = [results[("sender", r)][0].sent_bytes for r in (0, 1)]
    assert min(sent) >= 4 * 3 * 4 and sum(sent) >= (24 + 3) * 4


def _sync_in_threads(address: str, send_model, receive_model, syncs: int = 1) -> tuple[dict, dict]:
    """One sending and one receiving rank, each a thread; what each sync returned (or its error's
    text) by role, and each role's link."""
    from mesh_core import MeshSpecError

    links: dict = {}
    out: dict = {}

    def run(role: str) -> None:
        link = links[role] = WeightLink(
            address, role, rank=0, world_size=1, secret=SECRET, timeout=timedelta(seconds=30)
        )
        out[role] = []
        try:
            for step in range(syncs):
                if role == "sender":
                    out[role].append(link.send(send_model(step)))
                else:
                    out[role].append(link.receive(receive_model(step)))
        except MeshSpecError as err:
            out[role].append(str(err))

    threads = [threading.Thread(target=run, args=(role,)) for role in ("sender", "receiver")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    return out, links


def _on_an_accelerator(monkeypatch, storages: set) -> None:
    """Tensors whose memory is in ``storages`` say they are on cuda:0 to every check and to the data
    phase's choice between sending a region itself and staging it (views of them included)."""
    from mesh_core.transfer import _buckets as transfer_buckets
    from mesh_core.transfer import _in_job as transfer
    from mesh_core.transfer import _jobs as transfer_jobs

    real_device = transfer.tensor_device

    def device(t: torch.Tensor) -> torch.device:
        return torch.device("cuda:0") if t.untyped_storage().data_ptr() in storages else real_device(t)

    for module in (transfer, transfer_jobs, transfer_buckets):
        monkeypatch.setattr(module, "tensor_device", device)


@pytest.mark.parametrize("on_gpu", ["sender", "receiver"])
def test_a_tensor_on_an_accelerator_travels_through_host_buffers_bit_for_bit(monkeypatch, on_gpu):
    """The side channel is gloo, which moves host memory: a trainer (or rollout) whose tensors live on
    a GPU, modelled here by the device every check and the data phase read, is not refused; its
    regions are staged through the link's host buffers, while the other job's tensor, on the host,
    is sent from / received into its own memory (a box of 256 KiB travels alone). Twice: the second
    sync reuses the cached plan and regions, and is bit for bit again."""
    weight = torch.arange(256 * 256, dtype=torch.float32).view(256, 256)
    target = torch.zeros(256, 256)
    _on_an_accelerator(monkeypatch, {(weight if on_gpu == "sender" else target).untyped_storage().data_ptr()})
    seen = []

    def send_model(step: int) -> dict:
        weight.add_(step)  # updated in place, as a training step does
        return {"w": weight}

    def receive_model(step: int) -> dict:
        if step:
            seen.append(target.clone())
        return {"w": target}

    out, links = _sync_in_threads(f"127.0.0.1:{_port()}", send_model, receive_model, syncs=2)
    assert all(not isinstance(r, str) for r in out["sender"] + out["receiver"]), out
    seen.append(target.clone())
    assert all(
        torch.equal(got, torch.arange(256 * 256, dtype=torch.float32).view(256, 256) + step)
        for got, step in zip(seen, (0, 1))
    )
    assert out["receiver"][0].agreed_again and not out["receiver"][1].agreed_again
    staged = links[on_gpu]._cache["pool"]
    other = links["receiver" if on_gpu == "sender" else "sender"]._cache["pool"]
    assert staged.nbytes >= weight.numel() * 4  # a host buffer carried the accelerator's region
    assert other.nbytes == 0  # the host side's tensor travelled itself, with no buffer


def test_a_meta_tensor_is_one_error_on_both_jobs_before_any_message(monkeypatch):
    """A tensor with no data (``meta``) is refused alike on both jobs, naming the tensor and its
    device; no message is posted and the receiver's tensor is untouched."""
    from mesh_core.transfer import _jobs as transfer_jobs

    posted: list = []
    real_execute = transfer_jobs.execute
    monkeypatch.setattr(transfer_jobs, "execute", lambda *a, **k: posted.append(1) or real_execute(*a, **k))
    target = torch.zeros(4, 3)
    out, _ = _sync_in_threads(
        f"127.0.0.1:{_port()}", lambda step: {"w": torch.empty(4, 3, device="meta")}, lambda step: {"w": target}
    )
    assert out["sender"] == out["receiver"], out
    assert out["sender"][0].startswith("weight sync refused before any message was sent: ")
    assert "sender rank 0: source tensor 'w' is on meta (no data to send or receive)" in out["sender"][0]
    assert not posted and torch.equal(target, torch.zeros(4, 3))


def _pair(address: str, sender_steps, receiver_steps, timeout: float = 30) -> dict:
    """A sending and a receiving rank, each a thread running its steps (``step(link)``) in turn; what
    each returned or the text of its MeshSpecError, by role."""
    from mesh_core import MeshSpecError

    out: dict = {"sender": [], "receiver": [], "links": {}}

    def run(role: str, steps) -> None:
        link = out["links"][role] = WeightLink(
            address, role, rank=0, world_size=1, secret=SECRET, timeout=timedelta(seconds=timeout)
        )
        for step in steps:
            try:
                out[role].append(step(link))
            except MeshSpecError as err:
                out[role].append(str(err))

    threads = [
        threading.Thread(target=run, args=("sender", sender_steps)),
        threading.Thread(target=run, args=("receiver", receiver_steps)),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads)
    return out


def test_the_trainers_version_travels_with_each_sync_and_finished_rounds_leave_the_store():
    """send(version=step) reaches every receive() (default: the round); the store holds as many keys
    after 8 syncs as after 3 (each finished round's keys deleted)."""
    weights = {"w": torch.zeros(4, 4)}
    keys: list = []

    def send(version):
        def step(link):
            weights["w"].fill_(float(version or 0))
            stats = link.send(weights, version=version)
            keys.append(link.store.num_keys())
            return stats

        return step

    def receive(link):
        w = torch.zeros(4, 4)
        stats = link.receive({"w": w})
        return stats.version, float(w[0, 0])

    versions = [1000, 1001, None, 1003, 1004, 1005, 1006, 1007]
    out = _pair(f"127.0.0.1:{_port()}", [send(v) for v in versions], [receive] * len(versions))
    assert out["receiver"] == [(v if v is not None else 2, float(v or 0)) for v in versions], out
    assert [s.version for s in out["sender"]] == [v if v is not None else 2 for v in versions]
    assert keys[2] == keys[-1], keys  # bounded: a round's keys go once every rank is past it
    with pytest.raises(Exception, match="version=1.5; expected an int"):
        out["links"]["sender"].send(weights, version=1.5)


def test_a_receiver_gone_in_the_data_phase_is_not_called_a_sync_without_messages(monkeypatch):
    """A rollout rank that ends after the agreement (killed mid-sync): the trainer's error says the
    data phase had begun, not that no message was sent."""
    from mesh_core.transfer import _jobs

    real_close = _jobs.WeightLink._close_round

    def close(self, prefix, *args, **kwargs):
        if self.role == "receiver":
            raise SystemExit  # this rank ends here: it never arrives at the round's close
        return real_close(self, prefix, *args, **kwargs)

    monkeypatch.setattr(_jobs.WeightLink, "_close_round", close)

    def receive(link):
        try:
            link.receive({"w": torch.zeros(4)})
        except SystemExit:
            return "ended"

    out = _pair(f"127.0.0.1:{_port()}", [lambda link: link.send({"w": torch.ones(4)})], [receive], timeout=3)
    assert out["receiver"] == ["ended"]
    error = out["sender"][0]
    assert "weight sync 0 failed in the data phase" in error and "missing: receiver rank 0" in error, error
    assert "the data phase had begun" in error and "no message was sent" not in error, error


def test_every_rollout_engine_gets_every_sync_from_one_send():
    """One sending rank feeding two receiving jobs on one address (jobs=2): a 1-rank job holding
    whole tensors and a 2-rank tp=2 job; each of the 4 send()s reaches both, bit for bit, with the
    trainer's version (before: two jobs on one address alternated rounds)."""
    from mesh_core.transfer import ParamLayout

    address = f"127.0.0.1:{_port()}"
    full = torch.arange(8 * 6, dtype=torch.float32).view(8, 6)
    layouts = {"w": ParamLayout((8, 6), shard_dim=0)}
    spec = MeshSpec.build(2, tp=2)
    versions = [10, 11, 12, 13]
    got: dict = {}
    errors: list = []

    def sender() -> None:
        try:
            link = WeightLink(
                address, "sender", rank=0, world_size=1, secret=SECRET, timeout=timedelta(seconds=30), jobs=2
            )
            weights = {"w": full.clone()}
            for v in versions:
                weights["w"].copy_(full + v)
                got.setdefault("sender", []).append(link.send(weights, version=v).bytes)
        except Exception as err:  # noqa: BLE001 (reported below)
            errors.append(err)

    def receiver(job: str, rank: int, size: int) -> None:
        try:
            link = WeightLink(
                address,
                "receiver",
                rank=rank,
                world_size=size,
                secret=SECRET,
                timeout=timedelta(seconds=30),
                launch=job,
            )
            for _ in versions:
                shard = torch.zeros(8 // size, 6)
                stats = link.receive(
                    {"w": shard}, layouts=layouts if size > 1 else None, spec=spec if size > 1 else None
                )
                rows = slice(rank * 8 // size, (rank + 1) * 8 // size)
                got.setdefault((job, rank), []).append((stats.version, torch.equal(shard, full[rows] + stats.version)))
        except Exception as err:  # noqa: BLE001
            errors.append(err)

    threads = [
        threading.Thread(target=sender),
        threading.Thread(target=receiver, args=("A", 0, 1)),
        threading.Thread(target=receiver, args=("B", 0, 2)),
        threading.Thread(target=receiver, args=("B", 1, 2)),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    for who in (("A", 0), ("B", 0), ("B", 1)):
        assert got[who] == [(v, True) for v in versions], (who, got[who])
    assert got["sender"] == [2 * 8 * 6 * 4] * len(versions)  # one round carries both jobs' bytes


def test_a_round_waits_for_every_rollout_engine_or_is_one_clear_error():
    """jobs=2 and one engine comes: one error on the trainer naming how many came, one on the engine
    (its weights untouched). The trainer's timeout leaves the engine time to claim on a busy machine."""
    address = f"127.0.0.1:{_port()}"
    result: dict = {}
    held: list = []  # the sender's link (its store) outlives the receiver's last store operation

    def sender() -> None:
        link = WeightLink(address, "sender", rank=0, world_size=1, secret=SECRET, timeout=timedelta(seconds=8), jobs=2)
        held.append(link)
        try:
            link.send({"w": torch.ones(4)})
        except Exception as err:  # noqa: BLE001
            result["sender"] = str(err)

    def receiver() -> None:
        link = WeightLink(address, "receiver", rank=0, world_size=1, secret=SECRET, timeout=timedelta(seconds=30))
        w = torch.zeros(4)
        try:
            link.receive({"w": w})
        except Exception as err:  # noqa: BLE001
            result["receiver"] = (str(err), torch.equal(w, torch.zeros(4)))

    threads = [threading.Thread(target=sender), threading.Thread(target=receiver)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert "weight sync 0: only 1 of the 2 receiving jobs joined within 0:00:08" in result["sender"], result
    assert "the sending job gave up waiting for its 2 receiving jobs" in result["receiver"][0], result
    assert result["receiver"][1]


def test_a_trainer_relaunched_with_another_world_size_is_one_error_then_agreed_anew():
    """A 4-rank sending job syncs, ends; the receiver's next receive() is the library's error (not
    torch's network error); a relaunch of 2 ranks on the same address: the next receive() connects
    again, agrees anew and gets the new job's weights bit for bit."""
    import gc

    address = f"127.0.0.1:{_port()}"
    full = torch.arange(8 * 4, dtype=torch.float32).view(8, 4)
    spec4, spec2 = MeshSpec.build(4, tp=4), MeshSpec.build(2, tp=2)
    from mesh_core.transfer import ParamLayout

    layouts = {"w": ParamLayout((8, 4), shard_dim=0)}
    old_gone, receiver_failed = threading.Event(), threading.Event()
    got: list = []
    errors: list = []
    old_links: list = []

    def sender(rank: int, size: int, spec, offset: float) -> None:
        try:
            link = WeightLink(
                address, "sender", rank=rank, world_size=size, secret=SECRET, timeout=timedelta(seconds=30)
            )
            rows = slice(rank * 8 // size, (rank + 1) * 8 // size)
            link.send({"w": full[rows] + offset}, layouts=layouts, spec=spec)
            if size == 4:
                old_links.append(link)
        except Exception as err:  # noqa: BLE001 (reported below)
            errors.append(err)

    def receiver() -> None:
        link = WeightLink(address, "receiver", rank=0, world_size=1, secret=SECRET, timeout=timedelta(seconds=30))
        for step in range(3):
            if step == 1:
                old_gone.wait(60)
            w = torch.zeros(8, 4)
            try:
                stats = link.receive({"w": w})
                got.append((torch.equal(w, full + (1 if step == 0 else 2)), stats.agreed_again))
            except Exception as err:  # noqa: BLE001
                got.append(f"{type(err).__name__}: {err}")
            if step == 1:
                receiver_failed.set()

    r = threading.Thread(target=receiver)
    r.start()
    first = [threading.Thread(target=sender, args=(k, 4, spec4, 1.0)) for k in range(4)]
    for t in first:
        t.start()
    for t in first:
        t.join(timeout=60)
    for link in old_links:  # the job ends: its links and rank 0's store server go away
        link.close()
    old_links.clear()
    del link
    gc.collect()
    old_gone.set()
    receiver_failed.wait(60)
    second = [threading.Thread(target=sender, args=(k, 2, spec2, 2.0)) for k in range(2)]
    for t in second:
        t.start()
    for t in second + [r]:
        t.join(timeout=90)
    assert not errors, errors
    assert got[0] == (True, True), got
    assert got[1].startswith("MeshSpecError: weight sync") and "went away" in got[1], got
    assert got[2] == (True, True), got
