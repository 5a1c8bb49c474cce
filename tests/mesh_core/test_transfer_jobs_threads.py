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


@pytest.mark.parametrize("on_gpu", ["sender", "receiver"])
def test_a_tensor_on_an_accelerator_is_one_error_on_both_jobs_before_any_message(monkeypatch, on_gpu):
    """The side channel is gloo: a trainer (or rollout) whose tensors live on a GPU, modelled here by
    the device the checks read, is refused alike on both jobs, naming the tensor, its device and the
    remedy; no message is posted and the receiver's tensor is untouched."""
    from mesh_core import MeshSpecError, transfer, transfer_jobs

    gpu: set = set()
    real_device = transfer.tensor_device
    for module in (transfer, transfer_jobs):  # the checks, and the link's choice of remedy
        monkeypatch.setattr(module, "tensor_device", lambda t: torch.device("cuda:0") if id(t) in gpu else real_device(t))
    posted: list = []
    real_execute = transfer_jobs.execute
    monkeypatch.setattr(transfer_jobs, "execute", lambda *a, **k: posted.append(1) or real_execute(*a, **k))
    address = f"127.0.0.1:{_port()}"
    weight, target = torch.ones(4, 3), torch.zeros(4, 3)
    gpu.add(id(weight) if on_gpu == "sender" else id(target))
    links: list = []
    out: dict = {}

    def run(role: str) -> None:
        link = WeightLink(address, role, rank=0, world_size=1, timeout=timedelta(seconds=30))
        links.append(link)  # the sender's store outlives the receiver's last read
        try:
            out[role] = link.send({"w": weight}) if role == "sender" else link.receive({"w": target})
        except MeshSpecError as err:
            out[role] = str(err)

    threads = [threading.Thread(target=run, args=(role,)) for role in ("sender", "receiver")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    side = "source" if on_gpu == "sender" else "destination"
    assert out["sender"] == out["receiver"], out
    assert out["sender"].startswith("weight sync refused before any message was sent: ")
    assert f"{on_gpu} rank 0: {side} tensor 'w' is on cuda:0" in out["sender"]
    assert "the weight link moves host memory only" in out["sender"]
    assert not posted and torch.equal(target, torch.zeros(4, 3))
