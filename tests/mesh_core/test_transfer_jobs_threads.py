"""mesh_core.transfer_jobs with the sending job's engine-like modules (an AutoTP tp=2 layer read
from DeepSpeed's per-parameter metadata, a whole replicated bias) and a 1-rank receiving job, each
rank a thread of this process (gloo runs in threads): bit for bit; twice with the cached plan."""
from __future__ import annotations

import socket
import threading
from datetime import timedelta

import pytest
import torch

from mesh_core import MeshSpec
from mesh_core.transfer_engines import AUTOTP_META
from mesh_core.transfer_jobs import WeightLink

pytestmark = pytest.mark.torch_releases

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
        self.weight = torch.nn.Parameter(FULL_WEIGHT[4 * tp:4 * tp + 4] + version)
        setattr(self.weight, AUTOTP_META, {"partition_dim": 0, "partition_sizes": [4, 4], "logical_shape": (8, 3)})
        self.bias = torch.nn.Parameter(FULL_BIAS + version)


def test_autotp_shards_and_replicas_reach_a_whole_receiver_bit_for_bit():
    address = f"127.0.0.1:{_port()}"
    spec = MeshSpec.build(2, tp=2)
    results: dict = {}
    errors: list = []

    def sender(rank: int) -> None:
        try:
            link = WeightLink(address, "sender", rank=rank, world_size=2, timeout=timedelta(seconds=30))
            results[("sender", rank)] = [link.send(_TensorParallel(rank, v), spec=spec) for v in (1, 2)]
        except Exception as err:  # noqa: BLE001 (reported below)
            errors.append(err)

    def receiver() -> None:
        try:
            link = WeightLink(address, "receiver", rank=0, world_size=1, timeout=timedelta(seconds=30))
            got = []
            for _ in (1, 2):
                tensors = {"weight": torch.zeros(8, 3), "bias": torch.zeros(3)}
                stats = link.receive(tensors)
                got.append((stats, {n: t.clone() for n, t in tensors.items()}))
            results["receiver"] = got
        except Exception as err:  # noqa: BLE001
            errors.append(err)

    threads = [threading.Thread(target=sender, args=(0,)), threading.Thread(target=sender, args=(1,)),
               threading.Thread(target=receiver)]
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
        link = links[role] = WeightLink(address, role, rank=0, world_size=1, timeout=timedelta(seconds=30))
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
    from mesh_core import transfer, transfer_buckets, transfer_jobs

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
    assert all(torch.equal(got, torch.arange(256 * 256, dtype=torch.float32).view(256, 256) + step)
               for got, step in zip(seen, (0, 1)))
    assert out["receiver"][0].agreed_again and not out["receiver"][1].agreed_again
    staged = links[on_gpu]._cache["pool"]
    other = links["receiver" if on_gpu == "sender" else "sender"]._cache["pool"]
    assert staged.nbytes >= weight.numel() * 4  # a host buffer carried the accelerator's region
    assert other.nbytes == 0  # the host side's tensor travelled itself, with no buffer


def test_a_meta_tensor_is_one_error_on_both_jobs_before_any_message(monkeypatch):
    """A tensor with no data (``meta``) is refused alike on both jobs, naming the tensor and its
    device; no message is posted and the receiver's tensor is untouched."""
    from mesh_core import transfer_jobs

    posted: list = []
    real_execute = transfer_jobs.execute
    monkeypatch.setattr(transfer_jobs, "execute", lambda *a, **k: posted.append(1) or real_execute(*a, **k))
    target = torch.zeros(4, 3)
    out, _ = _sync_in_threads(f"127.0.0.1:{_port()}", lambda step: {"w": torch.empty(4, 3, device="meta")},
                              lambda step: {"w": target})
    assert out["sender"] == out["receiver"], out
    assert out["sender"][0].startswith("weight sync refused before any message was sent: ")
    assert "sender rank 0: source tensor 'w' is on meta (no data to send or receive)" in out["sender"][0]
    assert not posted and torch.equal(target, torch.zeros(4, 3))
