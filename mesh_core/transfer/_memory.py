"""Reading another process's memory on the same host (Linux cross-memory attach, ``process_vm_readv``).

The weight link's same-host path: a receiving rank copies the boxes it needs straight out of a
sending rank's host tensors into its own shards, in one copy (no socket, no packing: a strided box
is a list of contiguous runs on each side). Two processes can use it when they run on one kernel in
one pid namespace and the kernel lets the reader in (same user, ptrace rules, no seccomp filter
refusing the call): a reader finds out by reading a random token the other process holds at an
address it published (:func:`probe`), so whatever the reason for a refusal, the pair falls back to
messages. Under Yama's ``ptrace_scope`` 1 (Ubuntu's default: only a process's ancestors may read
it), a process that is to be read lets its user's other processes in (:func:`allow_readers`, as
Open MPI's cross-memory transport does); scopes 2 and 3 are left as they are (the probe fails).

- :class:`Endpoint`: what a process publishes (host, pid, where its token is);
- :func:`runs`: a box of a row-major shard as byte offsets of equal contiguous runs;
- :class:`Reads`: the reads of one rank, built once per plan, run with one system call per
  ``IOV_MAX`` runs.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import math
import os
import secrets
import sys
from dataclasses import dataclass
from typing import Mapping, Optional, Sequence

import torch

logger = logging.getLogger(__name__)
Box = tuple[tuple[int, int], ...]
IOV_MAX = 1024  # iovecs per process_vm_readv call (Linux UIO_MAXIOV)
TOKEN_BYTES = 16


class _Iovec(ctypes.Structure):
    _fields_ = [("iov_base", ctypes.c_void_p), ("iov_len", ctypes.c_size_t)]


def _libc():
    """The C library's symbols, already loaded in this process (None off Linux, or where an iovec is not
    two 64-bit words, the layout :class:`Reads` writes)."""
    if not sys.platform.startswith("linux") or ctypes.sizeof(_Iovec) != 16:
        return None
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


def _libc_readv(libc):
    fn = getattr(libc, "process_vm_readv", None) if libc is not None else None
    if fn is None:
        return None
    fn.restype = ctypes.c_ssize_t
    fn.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_ulong, ctypes.c_void_p, ctypes.c_ulong, ctypes.c_ulong]
    return fn


_LIBC = _libc()
_READV = _libc_readv(_LIBC)
_PR_SET_PTRACER = 0x59616D61  # prctl option (Yama)
_PR_SET_PTRACER_ANY = ctypes.c_ulong(-1)
_YAMA_SCOPE = "/proc/sys/kernel/yama/ptrace_scope"


def _yama_scope() -> Optional[int]:
    try:
        with open(_YAMA_SCOPE, encoding="ascii") as fh:
            return int(fh.read().strip())
    except (OSError, ValueError):
        return None


def _prctl(option: int, arg: ctypes.c_ulong) -> int:
    return _LIBC.prctl(ctypes.c_int(option), arg, ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0))


def allow_readers() -> bool:
    """Let this user's other processes read this process's memory where Yama's ``ptrace_scope`` is 1
    (where it is 0, or Yama is absent, they may already). Whether readers are allowed now."""
    if _READV is None:
        return False
    scope = _yama_scope()
    if scope == 1:
        if _prctl(_PR_SET_PTRACER, _PR_SET_PTRACER_ANY) != 0:
            logger.info(
                "prctl(PR_SET_PTRACER_ANY) refused (errno %d): same-host reads of this process will "
                "fall back to messages",
                ctypes.get_errno(),
            )
            return False
        logger.info(
            "Yama ptrace_scope 1: this process now lets its user's processes read its memory "
            "(the weight link's same-host reads)"
        )
        return True
    return scope in (None, 0)


def host_id() -> Optional[str]:
    """This process's kernel and pid namespace (``None`` where cross-memory attach is not available):
    two processes with equal ids name each other's pids alike."""
    if _READV is None:
        return None
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as fh:
            boot = fh.read().strip()
        return f"{boot}/{os.readlink('/proc/self/ns/pid')}"
    except OSError:
        return None


@dataclass(frozen=True)
class Endpoint:
    """What a process publishes so that processes of its host can read its memory."""

    host: str
    pid: int
    token_address: int
    token: str  # hex

    def fields(self) -> dict:
        return {"host": self.host, "pid": self.pid, "token_address": self.token_address, "token": self.token}

    @classmethod
    def from_fields(cls, fields: Mapping) -> "Endpoint":
        return cls(str(fields["host"]), int(fields["pid"]), int(fields["token_address"]), str(fields["token"]))


class Token:
    """A random token held in this process's memory, and the :class:`Endpoint` naming it (``None``
    where cross-memory attach is not available)."""

    def __init__(self) -> None:
        value = secrets.token_bytes(TOKEN_BYTES)
        self._buffer = ctypes.create_string_buffer(value, TOKEN_BYTES)
        host = host_id()
        self.endpoint = (
            Endpoint(host, os.getpid(), ctypes.addressof(self._buffer), value.hex()) if host is not None else None
        )


def probe(other: Endpoint) -> bool:
    """Whether this process can read ``other``'s memory: same host id, and its token read back equal."""
    if _READV is None or other.host != host_id():
        return False
    out = ctypes.create_string_buffer(TOKEN_BYTES)
    local = _Iovec(ctypes.addressof(out), TOKEN_BYTES)
    remote = _Iovec(other.token_address, TOKEN_BYTES)
    done = _READV(other.pid, ctypes.addressof(local), 1, ctypes.addressof(remote), 1, 0)
    return done == TOKEN_BYTES and out.raw == bytes.fromhex(other.token)


def available() -> bool:
    """Whether this process can read memory through cross-memory attach (its own, as a probe)."""
    token = Token()  # held while it is read
    return token.endpoint is not None and probe(token.endpoint)


def runs(box: Box, shard: Box, itemsize: int) -> tuple[torch.Tensor, int]:
    """``box`` (full-tensor coordinates) inside a contiguous row-major tensor holding ``shard``:
    the byte offsets (int64) of its contiguous runs in row-major order of the box, and their length."""
    extents = [hi - lo for lo, hi in box]
    whole = [hi - lo for lo, hi in shard]
    strides = [math.prod(whole[d + 1 :]) for d in range(len(whole))]
    first = [lo - slo for (lo, _), (slo, _) in zip(box, shard)]
    inner = len(box)
    while inner > 0 and extents[inner - 1] == whole[inner - 1]:
        inner -= 1  # the dims from ``inner`` on are whole: one run spans them
    if inner <= 1:  # at most the outermost dim is partial: one run
        start = sum(f * s for f, s in zip(first, strides))
        return torch.tensor([start * itemsize], dtype=torch.int64), math.prod(extents) * itemsize
    run = math.prod(extents[inner - 1 :]) * itemsize
    offsets = torch.tensor([first[inner - 1] * strides[inner - 1]], dtype=torch.int64)
    for d in range(inner - 2, -1, -1):  # outer dims, innermost first: each a grid over what is inside it
        steps = (torch.arange(extents[d], dtype=torch.int64) + first[d]) * strides[d]
        offsets = (steps[:, None] + offsets[None, :]).reshape(-1)
    return offsets * itemsize, run


def _refine(offsets: torch.Tensor, run: int, piece: int) -> torch.Tensor:
    """Runs of ``run`` bytes cut into runs of ``piece`` bytes (``piece`` divides ``run``)."""
    if run == piece:
        return offsets
    return (offsets[:, None] + torch.arange(0, run, piece, dtype=torch.int64)[None, :]).reshape(-1)


@dataclass(frozen=True)
class Read:
    """One box to read: from the other process's contiguous tensor at ``remote_address`` holding
    ``src_box``, into this process's shard ``target`` holding ``dst_box``."""

    pid: int
    target: str
    box: Box
    src_box: Box
    dst_box: Box
    remote_address: int
    itemsize: int


class Reads:
    """This rank's reads of one plan, grouped by the process read from. The remote runs are computed
    once; the local ones once per set of target tensors (:meth:`bind`)."""

    def __init__(self, reads: Sequence[Read]) -> None:
        self._by_pid: dict[int, list[tuple[Read, torch.Tensor, torch.Tensor, int]]] = {}
        self.nbytes = 0
        for r in reads:
            src, src_run = runs(r.box, r.src_box, r.itemsize)
            dst, dst_run = runs(r.box, r.dst_box, r.itemsize)
            piece = min(src_run, dst_run)  # both are suffix products of the box's extents: one divides the other
            remote = _refine(src, src_run, piece) + r.remote_address
            self._by_pid.setdefault(r.pid, []).append((r, remote, _refine(dst, dst_run, piece), piece))
            self.nbytes += math.prod(hi - lo for lo, hi in r.box) * r.itemsize

    def bind(self, targets: Mapping[str, torch.Tensor]) -> list[tuple[int, torch.Tensor, torch.Tensor, int]]:
        """The system calls over ``targets`` (contiguous host tensors by name): (pid, local iovecs,
        remote iovecs, bytes), at most ``IOV_MAX`` int64 ``[address, length]`` rows each."""
        out = []
        for pid, items in self._by_pid.items():
            local, remote = [], []
            for r, remote_offsets, local_offsets, piece in items:
                base = targets[r.target].data_ptr()
                lengths = torch.full_like(local_offsets, piece)
                local.append(torch.stack([local_offsets + base, lengths], dim=1))
                remote.append(torch.stack([remote_offsets, lengths], dim=1))
            loc_all, rem_all = torch.cat(local), torch.cat(remote)
            for start in range(0, loc_all.shape[0], IOV_MAX):
                loc = loc_all[start : start + IOV_MAX].contiguous()
                out.append((pid, loc, rem_all[start : start + IOV_MAX].contiguous(), int(loc[:, 1].sum())))
        return out

    @staticmethod
    def run(bound: Sequence[tuple[int, torch.Tensor, torch.Tensor, int]]) -> int:
        """Make the calls :meth:`bind` gave; the bytes read. ``OSError`` when a process cannot be read
        (it ended, its memory is gone) or a read comes back short."""
        total = 0
        for pid, loc, rem, want in bound:
            done = _READV(pid, loc.data_ptr(), loc.shape[0], rem.data_ptr(), rem.shape[0], 0)
            if done < 0:
                code = ctypes.get_errno()
                raise OSError(code, f"reading process {pid}'s memory: {os.strerror(code)}")
            if done != want:
                raise OSError(errno.EFAULT, f"reading process {pid}'s memory: {done} of {want} bytes read")
            total += done
        return total
