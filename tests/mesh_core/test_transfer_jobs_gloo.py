"""mesh_core.transfer._jobs between two jobs of spawned processes (a sending job of 2 ranks holding
whole tensors, a receiving job of 2 ranks split tp=2; no torch world in either, links made with
explicit ranks): bit for bit, each receiver fed by both senders; another model, another dtype, a
shard of the wrong size: the same error on every rank of both jobs, with no process group built and
no message; the next sync works and reuses the cached agreement; the same tensors synced again
(updated in place) are not read again and arrive bit for bit; an absent other job: an error within
the timeout. Three ways, each on a link of its own in one launch of the two jobs: same-host reads
where the kernel lets the receivers read the senders' memory (``transport="reads"``), every piece on
gloo (``"gloo"``), and reads allowed but every probe refused (the pairs fall back to gloo)."""

from __future__ import annotations

import json
import os
import socket
import time
from datetime import timedelta

import pytest
import torch

from spawn import run_ranks, wait_for_files

pytestmark = pytest.mark.multiprocess
SECRET = "test-secret"  # the links' shared secret
SENDERS, RECEIVERS = 2, 2
SHAPES = {"up": (64, 96), "down": (96, 64), "bias": (5,)}  # up/down big enough to be cut between the two senders


def _full(version: int) -> dict:
    gen = torch.Generator().manual_seed(version)
    return {n: torch.randn(s, generator=gen) for n, s in SHAPES.items()}


def _layouts():
    from mesh_core.transfer import ParamLayout

    return {
        "up": ParamLayout(SHAPES["up"], shard_dim=0),
        "down": ParamLayout(SHAPES["down"], shard_dim=1),
        "bias": ParamLayout(SHAPES["bias"]),
    }


TRANSPORTS = ("reads", "gloo", "refused")


def _worker(index: int, ports: tuple, out_dir: str) -> None:
    """Every transport in turn, each on a link of its own (one launch of the two jobs serves all)."""
    from mesh_core.transfer import _jobs as transfer_jobs

    sender = index < SENDERS
    counts: dict = {"built": [], "posted": [], "reads": [], "links": []}  # links: each store served until the end
    real_prepare, real_execute = transfer_jobs.WeightLink._prepare, transfer_jobs.execute
    transfer_jobs.WeightLink._prepare = lambda self, *a: counts["built"].append(1) or real_prepare(self, *a)
    transfer_jobs.execute = lambda *a, **k: counts["posted"].append(1) or real_execute(*a, **k)
    side = "_sender_side" if sender else "_receiver_side"
    real_side = getattr(transfer_jobs, side)
    setattr(transfer_jobs, side, lambda *a: counts["reads"].append(1) or real_side(*a))
    real_probe = transfer_jobs.probe
    out = {}
    for port, transport in zip(ports, TRANSPORTS):
        # "refused": e.g. another pid namespace, or a kernel refusing cross-memory attach
        transfer_jobs.probe = (lambda endpoint: False) if transport == "refused" else real_probe
        out[transport] = _cases(index, port, transport, counts, absent=transport == TRANSPORTS[-1])
    with open(os.path.join(out_dir, f"{index}.json"), "w") as fh:
        json.dump(out, fh)
    if index == 0:  # the stores' server outlives the others' last reads: each writes its file after them
        wait_for_files([os.path.join(out_dir, f"{i}.json") for i in range(SENDERS + RECEIVERS)])


def _cases(index: int, port: int, transport: str, counts: dict, absent: bool) -> dict:
    from mesh_core import MeshSpec, MeshSpecError
    from mesh_core.transfer import _jobs as transfer_jobs
    from mesh_core.transfer import own_box

    sender = index < SENDERS
    rank = index if sender else index - SENDERS
    built, posted, reads = counts["built"], counts["posted"], counts["reads"]
    link = transfer_jobs.WeightLink(
        f"127.0.0.1:{port}",
        "sender" if sender else "receiver",
        rank=rank,
        world_size=SENDERS if sender else RECEIVERS,
        secret=SECRET,
        timeout=timedelta(seconds=20),
        launch="job-1",
        transport="gloo" if transport == "gloo" else "reads",
    )
    counts["links"].append(link)
    spec = MeshSpec.build(RECEIVERS, tp=2)
    layouts = _layouts()
    boxes = {n: own_box(spec, layouts[n], rank, n, "destination") for n in SHAPES}
    out: dict = {}

    held: dict = {}

    def case(name, version, *, edit=None, extra=None, dtype=torch.float32, same_memory=False):
        full = _full(version)
        if same_memory:  # the tensors of the previous same_memory case, updated in place
            if not held:
                held.update(full if sender else {n: torch.zeros([hi - lo for lo, hi in boxes[n]]) for n in SHAPES})
            elif sender:
                for n in SHAPES:
                    held[n].copy_(full[n])
            tensors = held
        elif sender:
            tensors = dict(full, **(extra or {}))
        else:
            tensors = {n: torch.zeros([hi - lo for lo, hi in boxes[n]], dtype=dtype) for n in SHAPES}
            if edit:
                tensors = edit(tensors)
        before = len(built), len(posted), len(reads)
        start = time.monotonic()
        try:
            stats = link.send(tensors) if sender else link.receive(tensors, layouts=layouts, spec=spec)
            res = {
                "ok": True,
                "again": stats.agreed_again,
                "received": stats.received_bytes,
                "sent": stats.sent_bytes,
                "read": stats.read_bytes,
            }
            if not sender:
                res["equal"] = all(
                    torch.equal(tensors[n], full[n][tuple(slice(lo, hi) for lo, hi in boxes[n])]) for n in SHAPES
                )
        except MeshSpecError as err:
            res = {"ok": False, "error": str(err)}
        res.update(
            seconds=time.monotonic() - start,
            built=len(built) - before[0],
            posted=len(posted) - before[1],
            reads=len(reads) - before[2],
        )
        out[name] = res

    case("first", 1)
    case("second", 2)
    case("another_model", 3, extra={"extra.weight": torch.ones(3)})
    case("another_dtype", 4, dtype=torch.int32)
    case("wrong_shard", 5, edit=lambda t: dict(t, up=torch.zeros(33, 96)) if rank == 1 else t)
    case("after_errors", 6)
    case("cached", 7)
    case("same_memory_first", 8, same_memory=True)
    case("same_memory_again", 9, same_memory=True)
    if sender and absent:  # the receiving job is gone: the senders' next sync ends within the timeout
        link.timeout = timedelta(seconds=3)
        case("absent", 10)
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def all_outs(tmp_path_factory):
    """One launch of both jobs (4 processes) running the cases once per transport."""
    out_dir = str(tmp_path_factory.mktemp("jobs"))
    run_ranks(
        _worker,
        (tuple(_free_port() for _ in TRANSPORTS), out_dir),
        world=SENDERS + RECEIVERS,
        timeout_s=360,
        hang="weight link cases",
    )
    res = []
    for i in range(SENDERS + RECEIVERS):
        with open(os.path.join(out_dir, f"{i}.json")) as fh:
            res.append(json.load(fh))
    return res


@pytest.fixture(params=TRANSPORTS)
def transport(request):
    return request.param


@pytest.fixture
def outs(all_outs, transport):
    return [o[transport] for o in all_outs]


def test_receivers_get_their_shards_bit_for_bit_from_both_senders(outs):
    for case in ("first", "second", "after_errors", "cached"):
        assert all(o[case]["ok"] for o in outs), [o[case] for o in outs]
        assert all(o[case]["equal"] for o in outs[SENDERS:])
    # each sender sends a share: the 64x96 and 96x64 shards are cut between the two replicas
    total = sum(o["first"]["sent"] for o in outs[:SENDERS])
    assert total == sum(o["first"]["received"] for o in outs[SENDERS:]) >= 4 * (64 * 96 + 96 * 64 + 5)
    assert all(0.4 * total < o["first"]["sent"] < 0.6 * total for o in outs[:SENDERS])


def test_same_host_receivers_read_every_piece_where_the_kernel_lets_them(outs, transport):
    """Under "reads" (and a kernel that allows it) every piece is read from the senders' memory, the
    Megatron column blocks of 'down' included, for new tensors each sync as for the same ones; the
    senders count what was read from them. Otherwise nothing is read."""
    from spawn import reads_across_processes

    reads = transport == "reads" and reads_across_processes()
    for case in ("first", "second", "after_errors", "cached", "same_memory_first", "same_memory_again"):
        assert all(o[case]["ok"] for o in outs) and all(o[case]["equal"] for o in outs[SENDERS:])
        received = [o[case]["received"] for o in outs[SENDERS:]]
        read = [o[case]["read"] for o in outs[SENDERS:]]
        assert read == (received if reads else [0, 0]), (case, read, received)
        assert sum(o[case]["read"] for o in outs[:SENDERS]) == sum(read)


def test_the_agreement_and_plan_are_reused_until_something_changes(outs):
    assert all(o["first"]["again"] and o["first"]["built"] == 1 for o in outs)
    assert all(not o["second"]["again"] and o["second"]["built"] == 0 for o in outs)
    assert all(o["after_errors"]["again"] and not o["cached"]["again"] for o in outs)


def test_the_same_tensors_synced_again_are_not_read_again(outs):
    for case in ("same_memory_first", "same_memory_again"):
        assert all(o[case]["ok"] and not o[case]["again"] and o[case]["built"] == 0 for o in outs), [
            o[case] for o in outs
        ]
        assert all(o[case]["equal"] for o in outs[SENDERS:])
    assert all(o["same_memory_first"]["reads"] == 1 and o["same_memory_again"]["reads"] == 0 for o in outs)


@pytest.mark.parametrize(
    "case, words",
    [
        ("another_model", "the two jobs hold different models: parameters only the sender has: ['extra.weight']"),
        ("another_dtype", "'up': sent as float32, received into int32"),
        (
            "wrong_shard",
            "receiver rank 1: destination tensor 'up' has shape (33, 96); its layout (64, 96) needs (32, 96) here",
        ),
    ],
)
def test_a_disagreement_is_one_error_on_every_rank_of_both_jobs_before_any_message(outs, case, words):
    errors = {o[case].get("error") for o in outs}
    assert len(errors) == 1 and words in errors.pop(), [o[case] for o in outs]
    assert all(o[case]["built"] == 0 and o[case]["posted"] == 0 for o in outs)  # no channel, no message


def test_an_absent_receiving_job_is_an_error_on_every_sender_within_the_timeout(all_outs):
    for o in (o[TRANSPORTS[-1]] for o in all_outs[:SENDERS]):
        assert not o["absent"]["ok"] and "no receiving job joined within 0:00:03" in o["absent"]["error"]
        assert o["absent"]["seconds"] < 3 + 5


def _two_links_worker(index: int, ports: tuple, out_dir: str) -> None:
    """Index 0: a sending rank serving two links (no world). 1, 2: a receiving job of two ranks with a
    gloo world, making a link to each address, one after the other; its rank 1 comes late, after
    its rank 0 made both (the launch ids of the two links must not be read for each other)."""
    from datetime import timedelta

    import torch.distributed as dist

    from mesh_core.transfer import WeightLink

    out = {}
    if index == 0:
        links = [
            WeightLink(f"127.0.0.1:{p}", "sender", rank=0, world_size=1, secret=SECRET, timeout=timedelta(seconds=20))
            for p in ports[:2]
        ]
        for i, link in enumerate(links):
            link.send({"w": torch.full((4,), float(i + 1))})
        # the stores' server outlives the receivers' last reads (each writes its file after them)
        wait_for_files([os.path.join(out_dir, f"two{i}.json") for i in (1, 2)])
    else:
        rank = index - 1
        store = dist.TCPStore("127.0.0.1", ports[2], 2, rank == 0, timeout=timedelta(seconds=30))
        dist.init_process_group("gloo", store=store, rank=rank, world_size=2)
        made = os.path.join(out_dir, "rank0_made_both_links")
        if rank == 1:
            wait_for_files([made])  # comes late: after its rank 0 made both links
        links = [
            WeightLink(f"127.0.0.1:{p}", "receiver", secret=SECRET, timeout=timedelta(seconds=20)) for p in ports[:2]
        ]
        if rank == 0:
            open(made, "w").close()
        got = []
        for link in links:
            w = torch.zeros(4)
            link.receive({"w": w})
            got.append(w.tolist())
        out = {"got": got}
        dist.barrier()
        dist.destroy_process_group()
    with open(os.path.join(out_dir, f"two{index}.json"), "w") as fh:
        json.dump(out, fh)


def test_a_receiving_job_makes_two_links_one_after_the_other(tmp_path):
    """Each link's ranks share one launch id (drawn by rank 0 under a key of its own per link), so a
    late rank does not take the other link's id and leave its job's claim to another launch."""
    run_ranks(
        _two_links_worker,
        ((_free_port(), _free_port(), _free_port()), str(tmp_path)),
        world=3,
        timeout_s=120,
        hang="two links of one receiving job",
    )
    for index in (1, 2):
        with open(tmp_path / f"two{index}.json") as fh:
            assert json.load(fh)["got"] == [[1.0] * 4, [2.0] * 4]
