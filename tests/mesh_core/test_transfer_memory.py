"""mesh_core.transfer._memory: a box's runs in a row-major shard (property-checked against torch's
own indexing), reads of this process's and another process's memory through them (strided on
either side, more runs than one system call takes), the probe, and a process that ended."""

from __future__ import annotations

import ctypes
import errno
import multiprocessing
import os

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mesh_core.transfer import _memory as transfer_memory
from mesh_core.transfer._memory import Endpoint, Read, Reads, Token, probe, runs

pytestmark = pytest.mark.torch_releases

needs_reads = pytest.mark.skipif(
    not transfer_memory.available(),
    reason="this kernel does not let a process read its own memory through process_vm_readv here",
)


def _index(box, shard):
    return tuple(slice(lo - slo, hi - slo) for (lo, hi), (slo, _) in zip(box, shard))


@st.composite
def _box_in_shard(draw):
    ndim = draw(st.integers(1, 4))
    shape = [draw(st.integers(1, 6)) for _ in range(ndim)]
    shard, box = [], []
    for size in shape:
        lo = draw(st.integers(0, size - 1))
        hi = draw(st.integers(lo + 1, size))
        blo = draw(st.integers(lo, hi - 1))
        bhi = draw(st.integers(blo + 1, hi))
        shard.append((lo, hi))
        box.append((blo, bhi))
    return tuple(shard), tuple(box)


@settings(max_examples=300, deadline=None)
@given(_box_in_shard(), st.sampled_from([torch.float32, torch.bfloat16, torch.int64]))
def test_runs_are_the_box_of_the_shard_in_row_major_order(case, dtype):
    shard, box = case
    tensor = (
        torch.arange(torch.Size([hi - lo for lo, hi in shard]).numel()).to(dtype).view([hi - lo for lo, hi in shard])
    )
    itemsize = tensor.element_size()
    offsets, run = runs(box, shard, itemsize)
    assert run % itemsize == 0 and offsets.dtype == torch.int64
    raw = tensor.reshape(-1).view(torch.uint8)
    gathered = torch.cat([raw[o : o + run] for o in offsets.tolist()])
    assert torch.equal(gathered, tensor[_index(box, shard)].contiguous().reshape(-1).view(torch.uint8))
    # as few runs as the layout allows: each run ends where the next one cannot continue it
    assert all(b - a > run for a, b in zip(offsets.tolist(), offsets.tolist()[1:]))


@needs_reads
def test_reads_of_this_process_land_strided_boxes_bit_for_bit():
    """A block of columns of a source shard (3000 runs: more than one call takes) into a row-split
    target, and a block of rows into a column-split target: through the same :class:`Reads`."""
    full = torch.randn(3000, 8)
    source = full.clone()  # the sender holds it whole
    left = torch.zeros(3000, 4)  # columns 0..3
    top = torch.zeros(1000, 8)  # rows 0..999
    whole = ((0, 3000), (0, 8))
    reads = Reads(
        [
            Read(os.getpid(), "left", ((0, 3000), (0, 4)), whole, ((0, 3000), (0, 4)), source.data_ptr(), 4),
            Read(os.getpid(), "top", ((0, 1000), (0, 8)), whole, ((0, 1000), (0, 8)), source.data_ptr(), 4),
        ]
    )
    assert reads.nbytes == (3000 * 4 + 1000 * 8) * 4
    done = Reads.run(reads.bind({"left": left, "top": top}))
    assert done == reads.nbytes
    assert torch.equal(left, full[:, :4]) and torch.equal(top, full[:1000])


def _hold(queue, done) -> None:
    tensor = torch.arange(64, dtype=torch.float32) * 3
    token = Token()
    queue.put((token.endpoint.fields(), tensor.data_ptr()))
    done.wait(60)


@needs_reads
def test_another_process_is_probed_read_and_an_ended_one_is_an_error():
    ctx = multiprocessing.get_context("spawn")
    queue, done = ctx.Queue(), ctx.Event()
    child = ctx.Process(target=_hold, args=(queue, done))
    child.start()
    try:
        fields, address = queue.get(timeout=60)
        other = Endpoint.from_fields(fields)
        assert probe(other)
        assert not probe(Endpoint(other.host, other.pid, other.token_address, "00" * 16))  # another token
        assert not probe(Endpoint("another-host", other.pid, other.token_address, other.token))
        target = torch.zeros(2, 8)
        reads = Reads([Read(other.pid, "t", ((2, 4), (0, 8)), ((0, 8), (0, 8)), ((2, 4), (0, 8)), address, 4)])
        Reads.run(reads.bind({"t": target}))
        assert torch.equal(target, (torch.arange(64, dtype=torch.float32) * 3).view(8, 8)[2:4])
    finally:
        done.set()
        child.join(60)
    with pytest.raises(OSError, match=f"reading process {other.pid}'s memory"):
        Reads.run(reads.bind({"t": target}))
    assert not probe(other)


@pytest.mark.parametrize(
    "scope, calls, allowed", [(None, 0, True), (0, 0, True), (1, 1, True), (2, 0, False), (3, 0, False)]
)
def test_a_process_to_be_read_lets_its_user_in_only_where_yama_scope_1_keeps_it_out(monkeypatch, scope, calls, allowed):
    """Yama's ptrace_scope 1 (Ubuntu's default) lets only ancestors read a process: the process to be
    read sets PR_SET_PTRACER_ANY then; 0 / no Yama needs nothing; 2 and 3 are not overridden."""
    if transfer_memory._READV is None:
        pytest.skip("no process_vm_readv here")
    made = []
    monkeypatch.setattr(transfer_memory, "_yama_scope", lambda: scope)
    monkeypatch.setattr(transfer_memory, "_prctl", lambda option, arg: made.append((option, arg.value)) or 0)
    assert transfer_memory.allow_readers() is allowed
    assert made == [(0x59616D61, ctypes.c_ulong(-1).value)] * calls


def test_a_refused_prctl_leaves_the_pair_to_messages(monkeypatch):
    if transfer_memory._READV is None:
        pytest.skip("no process_vm_readv here")
    monkeypatch.setattr(transfer_memory, "_yama_scope", lambda: 1)
    monkeypatch.setattr(transfer_memory, "_prctl", lambda option, arg: -1)
    assert transfer_memory.allow_readers() is False


def test_the_real_prctl_is_accepted_by_this_kernel():
    """The call itself, made for real (a no-op for reads where Yama is absent): the kernel knows the
    option where Yama is built in, and answers EINVAL otherwise; either way nothing else changes."""
    if transfer_memory._READV is None:
        pytest.skip("no process_vm_readv here")
    ctypes.set_errno(0)
    rc = transfer_memory._prctl(transfer_memory._PR_SET_PTRACER, transfer_memory._PR_SET_PTRACER_ANY)
    assert rc == 0 or ctypes.get_errno() == errno.EINVAL
