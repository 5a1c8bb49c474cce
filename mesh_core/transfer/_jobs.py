"""Weight sync between two separately launched jobs (RL: a trainer job → a rollout job).

Both jobs are given one rendezvous address (``host:port``). Rank 0 of the sending job serves a
``torch.distributed.TCPStore`` there; every rank of both jobs connects to it. The weights travel on
a side channel: a gloo process group of its own over a ``PrefixStore`` of that store, with the
sender ranks first (bridge ranks ``0..S-1``) and the receiver ranks after them (``S..S+R-1``). It is
not registered with ``torch.distributed``: neither job's world, groups or default store is used
(the receiving job's default store is read once, at connect, to give its ranks one launch id).
Tensors on an accelerator (a trainer's GPU weights, a rollout's GPU shards) travel through host
buffers, a bucket at a time (page-locked for CUDA). Where a receiving rank shares a host with a
sending rank and the kernel lets it read that process's memory (found by a probe at the
agreement), it reads its boxes straight from the sender's host tensors instead
(:mod:`mesh_core.transfer._memory`; ``transport="gloo"`` turns this off).

Every :meth:`WeightLink.send` (each rank of the sending job) is one *round*, met by one
:meth:`WeightLink.receive` (each rank of the receiving job):

1. sender rank 0 opens round ``n``; each receiving job claims one of its ``jobs`` slots (atomically:
   a slot is claimed by one launch of a receiving job, or given up by the senders after ``timeout``);
2. one agreement through the store (:mod:`mesh_core.transfer._jobs_plan`): every rank's record of
   what it holds or needs (names, shapes, dtypes, devices, boxes) and its own problems; any problem
   or disagreement is the same :class:`~mesh_core.MeshSpecError` on every rank of both jobs, before
   any message. When no rank's record changed since the previous round, the cached verdict, plan,
   buckets and process group are reused (O(1) store operations per rank); a rank given the same
   tensors as last time (an equal fingerprint: memory, shapes, strides, dtypes, devices, ZeRO-3 and
   AutoTP attributes, layouts) does not read its side again and reuses each bucket's regions;
3. the data: each receiver rank gets its own shard, straight from the sender ranks holding it (ZeRO-3
   partitions are sent from the partitions, with no gather; replicas each send a part), in packed
   buckets (:mod:`mesh_core.transfer._buckets`), or read from a same-host sender's memory (one copy,
   strided boxes as runs); a sender given other tensors with the same record (new memory) tells
   its readers where they are at the agreement's arrival, without a new agreement;
4. one closing arrival: a rank that failed in the data phase (its peer died) flags it, so every rank
   of both jobs raises; a receiver's error says its weights are partially written. A sender stays
   in it until every reader is done, so its tensors are not changed while they are read.

Every wait is bounded by ``timeout``. A receiving job that ended is replaced by launching it again:
its ranks claim the next round and the process group is built anew.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import logging
import math
import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Callable, Mapping, Optional

import torch
import torch.distributed as dist

from .. import torch_compat
from ..rendezvous import ROUND_KEYS, arrive, forget
from ..spec import MeshSpec, MeshSpecError
from ._agree import dtype_name, dtype_of
from ._buckets import DEFAULT_BUCKET_BYTES, DEFAULT_WINDOW, BufferPool, box_numel, execute, schedule
from ._devices import WorldDevices, device_problems, device_text, tensor_device
from ._engines import AUTOTP_META, EngineSide
from ._in_job import ParamLayout, check_tensors, own_box
from ._jobs_plan import (
    Verdict,
    describe_missing,
    flat_boxes,
    holding_addresses,
    index_of,
    key_of,
    name_of,
    plan_sync,
    receiver_param,
    record,
    record_problem,
    same_host_pairs,
    sender_param,
    split_reads,
    sync_bytes,
    verdict,
    who,
)
from ._memory import Endpoint, Read, Reads, Token, allow_readers, probe

logger = logging.getLogger(__name__)

PREFIX = "mesh_core/weight_link"
ROLES = ("sender", "receiver")
TRANSPORTS = ("auto", "reads", "gloo")
SECRET_ENV = "DS_MESH_LINK_SECRET"  # the secret both jobs share, where ``secret=`` is not given
_SIGNATURE = 64  # hex characters of an HMAC-SHA256, before each store value it authenticates
DEFAULT_TIMEOUT = timedelta(seconds=60)


@dataclass
class SyncStats:
    """What one sync did on this rank."""

    round: int
    seconds: float
    bytes: int  # bytes the whole sync delivers to the receiving job
    sent_bytes: int
    received_bytes: int
    messages: int
    agreed_again: bool  # records were exchanged (first round, a change, a new receiving job)
    data_seconds: float = 0.0  # of ``seconds``: the data phase on this rank (messages, packing, placing)
    read_bytes: int = 0  # of the sent / received bytes: read straight from a sender's memory (same host)
    version: Optional[int] = None  # the weights' version the sending job gave send() (default: the round)


class _Reading:
    """This rank's side of a sync, read when needed: what it holds or needs, its tensors, its problems."""

    def __init__(self, side: Callable[[], tuple[dict, dict, list[str]]]) -> None:
        self._side = side
        self.done = False
        self.params: dict = {}
        self.tensors: Any = None
        self.problems: list[str] = []

    def read(self) -> None:
        if not self.done:
            self.params, self.tensors, self.problems = self._side()
            self.done = True


class _Late(Exception):
    """This receiver reached a round the senders had already given up."""


class WeightLink:
    """One rank's end of a weight sync between two jobs (see the module docstring).

    ``role`` is ``"sender"`` on every rank of the sending job (its rank 0 serves the store at
    ``address``), ``"receiver"`` on every rank of the receiving job. ``rank`` / ``world_size``
    default to this job's ``torch.distributed`` world (1 process when none). ``timeout`` bounds
    every wait. Only ``gloo`` is supported as the side channel's backend: tensors on an accelerator
    (a trainer's GPU weights, a rollout's GPU shards) travel through host buffers. ``launch``:
    an id the receiving job's ranks share, one per launch (default: drawn by its rank 0 and shared
    through the job's default store; needed when several receiving ranks have no world).
    ``transport``: ``"auto"`` (default): a receiving rank on the same host as a sending rank reads
    the boxes it needs straight from that rank's host tensors (Linux cross-memory attach, one copy;
    :mod:`mesh_core.transfer._memory`) where the kernel lets it, and every other piece travels on
    gloo; ``"gloo"``: every piece travels on gloo. A pair uses reads only when both ends allow them.
    ``"auto"`` grants nothing: where Yama's ``ptrace_scope`` is 1 the kernel refuses the reads and
    the pieces travel on gloo; ``"reads"`` asks for them explicitly: a sending rank then lets its
    user's processes attach to it (``prctl(PR_SET_PTRACER_ANY)``, for the process's lifetime).
    ``jobs`` (a sending link's): how many receiving jobs each :meth:`send` feeds (several rollout
    engines, each launched on its own, on one address): every one of them gets every sync, in one
    round whose data grow with the bytes they receive; a round waits for all ``jobs`` of them (or
    is one error after ``timeout``). They must hold the same parameters (names, shapes, dtypes);
    their layouts may differ.
    ``secret``: a secret both jobs share (default: the ``DS_MESH_LINK_SECRET`` environment
    variable; one of the two is required): every record of the agreement is authenticated with it
    (HMAC-SHA256), so a process without it cannot take part. The store listens only on ``address``'s
    host (``127.0.0.1``: loopback only). See docs/transfer.md, "Security".
    """

    def __init__(
        self,
        address: str,
        role: str,
        *,
        rank: Optional[int] = None,
        world_size: Optional[int] = None,
        timeout: timedelta = DEFAULT_TIMEOUT,
        bucket_bytes: int = DEFAULT_BUCKET_BYTES,
        window: int = DEFAULT_WINDOW,
        backend: str = "gloo",
        launch: Optional[str] = None,
        transport: str = "auto",
        secret: Optional[str] = None,
        jobs: int = 1,
    ) -> None:
        if role not in ROLES:
            raise MeshSpecError(f"role={role!r}; valid roles are {list(ROLES)}")
        if transport not in TRANSPORTS:
            raise MeshSpecError(f"transport={transport!r}; valid transports are {list(TRANSPORTS)}")
        if not isinstance(jobs, int) or isinstance(jobs, bool) or jobs < 1 or (jobs != 1 and role != "sender"):
            raise MeshSpecError(
                f"jobs={jobs!r}; a sending link feeds jobs >= 1 receiving jobs (an int; a "
                "receiving link learns it from the senders)"
            )
        if backend != "gloo":
            raise MeshSpecError(
                f"backend={backend!r}: a weight link's side channel is gloo only (accelerator tensors "
                "travel through host buffers)"
            )
        secret = secret if secret is not None else os.environ.get(SECRET_ENV)
        if not secret:
            raise MeshSpecError(
                f"a weight link needs a secret both jobs share: pass secret= or set {SECRET_ENV} "
                "(the same value in both jobs; e.g. python -c 'import secrets; "
                "print(secrets.token_hex(16))')"
            )
        self._key = secret.encode() if isinstance(secret, str) else bytes(secret)
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit():
            raise MeshSpecError(f"address={address!r}; expected 'host:port'")
        initialised = dist.is_available() and dist.is_initialized()
        self.rank = rank if rank is not None else (dist.get_rank() if initialised else 0)
        self.job_size = world_size if world_size is not None else (dist.get_world_size() if initialised else 1)
        if not 0 <= self.rank < self.job_size:
            raise MeshSpecError(f"rank={self.rank} is out of range for world_size={self.job_size}")
        self.role, self.address, self.timeout = role, address, timeout
        self.bucket_bytes, self.window, self.backend, self.transport = bucket_bytes, window, backend, transport
        # what a same-host peer reads to learn it can read this process (None: no reads on this rank)
        self._token = Token() if transport != "gloo" else None  # held: its memory is what peers read
        if transport == "reads" and role == "sender":  # the user asked for a ptrace grant (Yama scope 1)
            allow_readers()
        self._endpoint: Optional[Endpoint] = self._token.endpoint if self._token is not None else None
        self.store = _open_store(host, int(port), role == "sender" and self.rank == 0, timeout)
        self._launch = launch or (
            _launch_id(address, self.rank, self.job_size, initialised) if role == "receiver" else ""
        )
        self._round = None if role == "receiver" else 0
        self._members = 0  # sender rank 0: how many ranks the last round it forgot had
        self._clean: Optional[int] = None  # sender rank 0: its last round, when cached and nothing moved
        self.jobs = jobs  # receiving jobs each send() feeds
        self._slot = 0  # a receiving job's claim slot in its last round
        self._lost = False  # a receiver whose store went away: it connects again at its next receive()
        self._version: Optional[int] = None  # a sender's version for the round it sends
        self._cache: Optional[dict] = None  # digest, buckets, pool, process group, sizes, fingerprint, tensors, views
        self.partial = False  # a receiver whose last sync failed in the data phase

    # -- public -----------------------------------------------------------------------------------

    def send(
        self,
        model: Any,
        *,
        layouts: Optional[Mapping[str, ParamLayout]] = None,
        spec: Optional[MeshSpec] = None,
        version: Optional[int] = None,
    ) -> SyncStats:
        """Send this rank's share of ``model``'s parameters (a DeepSpeed engine, a module or tensors by name).

        Layouts are read from the engine (ZeRO-3 partitions, AutoTP shards; whole tensors otherwise);
        ``layouts`` gives hand-written tensor-parallel ones over ``spec`` (default: the engine's mesh).
        ``version``: the weights' version (the trainer's step, say; rank 0's is the one sent), which
        each receiver's :class:`SyncStats` reports; default: the round's number (restarts at 0 with a
        relaunched sending job)."""
        if self.role != "sender":
            raise MeshSpecError("send() is for the sending job's ranks; this link was made with role='receiver'")
        if version is not None and (not isinstance(version, int) or isinstance(version, bool)):
            raise MeshSpecError(f"version={version!r}; expected an int (the trainer's step, say) or None")
        self._version = version
        return self._sync(
            _fingerprint(model, layouts, spec), lambda: _sender_side(model, layouts, spec, self.rank, self.job_size)
        )

    def receive(
        self, model: Any, *, layouts: Optional[Mapping[str, ParamLayout]] = None, spec: Optional[MeshSpec] = None
    ) -> SyncStats:
        """Write the sender's weights into this rank's shard of ``model`` (a module or tensors by name), in place.

        ``layouts`` (by name) says how the parameters are split over ``spec`` (this job's mesh;
        default: every rank holds whole tensors)."""
        if self.role != "receiver":
            raise MeshSpecError("receive() is for the receiving job's ranks; this link was made with role='sender'")
        return self._sync(
            _fingerprint(model, layouts, spec),
            lambda: _receiver_side(model, layouts, spec, self.rank, self.job_size, self._endpoint is not None),
        )

    def pair_bytes(self) -> dict[tuple[int, int], int]:
        """Bytes the agreed plan moves per (sender rank, receiver rank) of the two jobs (empty before a sync)."""
        return dict(self._cache["pairs"]) if self._cache is not None else {}

    def close(self) -> None:
        """Drop the side channel (its process group and buffers)."""
        self._cache = None

    # -- the round ---------------------------------------------------------------------------------

    def _sync(self, fingerprint: tuple, side: Callable[[], tuple[dict, dict, list[str]]]) -> SyncStats:
        start = time.perf_counter()
        if self._lost:  # the sending job's store went away (it ended, or was relaunched): connect again
            host, _, port = self.address.rpartition(":")
            self.store = _open_store(host, int(port), False, self.timeout)
            self._lost, self._round, self._cache = False, None, None
        if self.store.timeout != self.timeout:  # the store's own waits are the link's
            self.store.set_timeout(self.timeout)
        sending = self.role == "sender"
        cache = self._cache
        mine = _Reading(side)  # read only when the fingerprint changed (or for a new agreement)
        if sending:
            n = self._round  # taken first: a rank whose input is refused stays in step with the others
            self._round += 1
            if cache is None or cache["fingerprint"] != fingerprint:
                mine.read()  # bad input raises here, before any store operation
            self._announce(n, n if self._version is None else self._version)
            senders, jobs = self._await_claim(n)
            offset = 0
        else:
            try:
                n, senders, jobs, offset = self._claim()  # before reading the tensors: the senders wait less
            except (RuntimeError, dist.DistError) as err:
                self._lost = True
                raise MeshSpecError(
                    f"weight sync: the link's store at {self.address} went away (the sending job "
                    "ended, or was relaunched); this rank's weights are untouched; the next "
                    "receive() connects again and agrees anew"
                ) from err
            if cache is None or cache["fingerprint"] != fingerprint:
                mine.read()
        receivers = sum(jobs)
        me = self.rank if sending else senders + offset + self.rank
        members = list(range(senders + receivers))
        where = f"{PREFIX}/{n}"
        stale = (
            cache is None
            or cache["sizes"] != (senders, jobs)
            or (mine.done and (bool(mine.problems) or self._digest(mine) != cache["digest"]))
        )
        # a sender given other tensors with the same record, read by a same-host receiver: where they are
        # now is told to the readers (a tensor that became readable or unreadable changes the plan)
        moved = False
        if sending and not stale and mine.done and cache["read_from_me"]:
            addresses = self._addresses(mine)
            if _readable_keys(addresses) != _readable_keys(cache["addresses"]):
                stale = True
            elif addresses != cache["addresses"]:
                moved = True
                table = self._sign(f"{where}/moved", json.dumps([me, addresses]))
                self._store_op(n, lambda: self.store.append(f"{where}/moved", table + "\n"))
        arrival = self._arrive(f"{where}/agree", members, senders, n, me, flag=stale, mark=moved)
        again = arrival.flagged > 0
        version = n if self._version is None else self._version
        if moved and not again:
            cache["addresses"] = addresses
        if not again and arrival.marked and not sending and cache["read_pieces"]:
            try:
                self._moved(cache, where, n)
            except MeshSpecError as err:  # the senders hear of it at the closing arrival
                self._close_round(f"{where}/done", members, senders, n, me, err, data=False)
                raise
        if again:
            self._cache = cache = None
            mine.read()
            rec = self._record(mine)
            signed = self._sign(f"{where}/record/{me}", json.dumps(rec))
            self._store_op(n, lambda: self.store.set(f"{where}/record/{me}", signed))
            self._arrive(f"{where}/published", members, senders, n, me)
            records = self._records(n, where, members, senders, me, rec)
            agreed = verdict(records, senders, jobs)  # the same error on every rank, before any message
            readable = self._reachable(records, senders, members, n, me, where)
            cache = self._cache = self._prepare(agreed, records, readable, self._digest(mine), me, where, jobs)
        assert cache is not None
        if mine.done:  # these tensors from now on (an unchanged record: the same plan)
            cache.update(fingerprint=fingerprint, tensors=mine.tensors, views={}, bound_reads=None)
        failure: Optional[BaseException] = None
        run = None
        data_start = time.perf_counter()
        try:
            if not sending:  # sender rank 0 wrote it before it arrived at the agreement
                version = self._received_version(n, f"{where}/version")
            run = self._data(cache, me)
        except Exception as err:  # a peer died or its channel broke: every rank hears of it below
            failure = err
        data_seconds = time.perf_counter() - data_start
        if sending and self.rank == 0:  # every rank of both jobs is past the previous round; while the
            self._forget(n - 1, len(members))  # receivers still read or place, before the closing arrival
            self._clean = n if failure is None and not again and not arrival.marked else None
        self._close_round(f"{where}/done", members, senders, n, me, failure)
        self.partial = False
        read = cache["read_from_me"] if sending else cache["reads"].nbytes
        return SyncStats(
            n,
            time.perf_counter() - start,
            cache["bytes"],
            run.sent_bytes + read * sending,
            run.received_bytes + read * (not sending),
            run.messages,
            again,
            data_seconds,
            read,
            version,
        )

    def _store_op(self, n: int, op: Callable[[], Any]) -> Any:
        """A store operation of the agreement; the store gone (the sending job's rank 0 ended) is one clear error."""
        try:
            return op()
        except (RuntimeError, dist.DistError) as err:
            self._lost = self.role == "receiver"
            raise MeshSpecError(
                f"weight sync {n}: the link's store at {self.address} went away (the sending job's "
                f"rank 0 ended) during the agreement; no message was sent"
            ) from err

    def _mac(self, key: str, payload: str) -> str:
        return hmac.new(self._key, key.encode() + b"\0" + payload.encode(), hashlib.sha256).hexdigest()

    def _sign(self, key: str, payload: str) -> str:
        """``payload`` authenticated for ``key`` (a value copied to another key or round is refused)."""
        return self._mac(key, payload) + payload

    def _open(self, n: int, key: str, value: bytes, what: str) -> Any:
        """The JSON value stored under ``key`` by a rank holding this link's secret, else one clear error."""
        text = value.decode(errors="replace")
        payload = text[_SIGNATURE:]
        if not hmac.compare_digest(text[:_SIGNATURE], self._mac(key, payload)):
            raise MeshSpecError(
                f"weight sync {n}: {what} at the link's store is not signed with this link's secret "
                "(a process without it joined the link, or the store was written by another); no "
                "message was sent"
            )
        try:
            return json.loads(payload)
        except ValueError as err:
            raise MeshSpecError(f"weight sync {n}: {what} is malformed ({err}); no message was sent") from None

    def _records(self, n: int, where: str, members: list[int], senders: int, me: int, rec: dict) -> list[dict]:
        """Every rank's record, authenticated and well-formed, this rank's own as it wrote it."""
        keys = [f"{where}/record/{b}" for b in members]
        values = self._store_op(n, lambda: self.store.multi_get(keys))
        records = [self._open(n, k, v, f"the record of {who(b, senders)}") for b, k, v in zip(members, keys, values)]
        for b, r in enumerate(records):
            problem = record_problem(r, "sender" if b < senders else "receiver")
            if problem:
                raise MeshSpecError(
                    f"weight sync {n}: the record of {who(b, senders)} is malformed: {problem}; no message was sent"
                )
        if records[me] != json.loads(json.dumps(rec)):
            raise MeshSpecError(
                f"weight sync {n}: this rank's own record was rewritten in the link's store; no message was sent"
            )
        return records

    def _record(self, mine: "_Reading", *, addresses: bool = True) -> dict:
        memory = self._endpoint.fields() if self._endpoint is not None else None
        return record(
            self.role,
            self.job_size,
            mine.params,
            mine.problems,
            self.backend,
            memory,
            self._addresses(mine) if addresses else None,
        )

    def _digest(self, mine: "_Reading") -> str:
        """Of what a cached agreement depends on: the record without the addresses (moved tensors are
        announced on their own)."""
        rec = self._record(mine, addresses=False)
        return hashlib.sha256(json.dumps(rec, sort_keys=True).encode()).hexdigest()

    def _addresses(self, mine: "_Reading") -> dict[str, Optional[int]]:
        """A sender's holdings' addresses by key, for same-host readers (none without an endpoint)."""
        if self.role != "sender" or self._endpoint is None:
            return {}
        return {key: _host_address(tensor) for key, tensor in mine.tensors.items()}

    def _moved(self, cache: dict, where: str, n: int) -> None:
        """Receiver: some senders were given other tensors with the same record: read from their new
        addresses (on any failure the cache is dropped, so the next round agrees anew)."""
        try:
            text = self._store_op(n, lambda: self.store.get(f"{where}/moved")).decode(errors="replace")
            for line in filter(None, text.split("\n")):
                moved = self._open(n, f"{where}/moved", line.encode(), "a sender's table of moved tensors")
                rank, table = moved if isinstance(moved, list) and len(moved) == 2 else (None, None)
                if not isinstance(table, dict):
                    raise MeshSpecError(
                        f"weight sync {n}: a sender's table of moved tensors is malformed; no message was sent"
                    )
                for key, at in table.items():
                    where_held = (name_of(key), rank, index_of(key)) if isinstance(key, str) else None
                    if where_held not in cache["address"] or not (at is None or isinstance(at, int)):
                        named = f"holding {where_held[2]} of {where_held[0]!r}" if where_held else repr(key)
                        raise MeshSpecError(
                            f"weight sync {n}: a sender's table of moved tensors names {named} of "
                            f"rank {rank!r}, which that rank did not announce; no message was sent"
                        )
                    cache["address"][where_held] = at
            cache["reads"] = _reads(cache["read_pieces"], cache["address"], cache["pids"], cache["itemsize"])
            cache["bound_reads"] = None
        except BaseException:
            self._cache = None
            raise

    def _received_version(self, n: int, key: str) -> int:
        version = self._open(n, key, self._store_op(n, lambda: self.store.get(key)), "the weights' version")
        if not isinstance(version, int) or isinstance(version, bool):
            raise MeshSpecError(f"weight sync {n}: the weights' version {version!r} is not an int")
        return version

    def _forget(self, n: int, members: int) -> None:
        """Sender rank 0: delete round ``n``'s keys (a round given up included), so the store stays
        bounded; after a cached round without moved tensors, only the keys such a round writes."""
        if n < 0:
            return
        where = f"{PREFIX}/{n}"
        keys = [f"{PREFIX}/open/{n}", f"{where}/version"] + [f"{where}/claim/{slot}" for slot in range(self.jobs)]
        phases: tuple[str, ...] = ("agree", "done")
        if self._clean != n:
            keys.append(f"{where}/moved")
            keys += [f"{where}/{kind}/{b}" for kind in ("record", "reach") for b in range(max(members, self._members))]
            phases += ("published", "reached")
        try:
            for key in keys:
                self.store.delete_key(key)
            for phase in phases:
                forget(self.store, f"{where}/{phase}", ("who", "arrived", "state") if self._clean == n else ROUND_KEYS)
        except (RuntimeError, dist.DistError):  # the store is gone: the round's own error says so
            pass
        self._members = members

    def _announce(self, n: int, version: int) -> None:
        """Sender: rank 0 opens round ``n`` with the weights' ``version`` (one store operation)."""
        if self.rank == 0:  # only rank 0 writes "opened": a plain count a receiving job reads with add(0)
            key = f"{PREFIX}/{n}/version"
            self.store.multi_set(
                [f"{PREFIX}/open/{n}", f"{PREFIX}/opened", key],
                [f"{self.job_size}:{self.jobs}", str(n + 1), self._sign(key, json.dumps(version))],
            )

    def _await_claim(self, n: int) -> tuple[int, tuple[int, ...]]:
        """Sender: wait for every receiving job (``jobs`` of them) to claim a slot of round ``n``;
        (senders, each receiving job's size by slot)."""
        sizes = []
        for slot in range(self.jobs):
            claim = f"{PREFIX}/{n}/claim/{slot}"
            try:
                value = self.store.get(claim).decode()  # waits up to the store's timeout (the link's)
            except (RuntimeError, dist.DistError):
                value = self.store.compare_set(claim, "", "abandoned").decode()  # or a claim that came just now
            if value == "abandoned":
                for rest in range(slot + 1, self.jobs):  # a job coming later finds the round given up
                    self.store.compare_set(f"{PREFIX}/{n}/claim/{rest}", "", "abandoned")
                joined = "no receiving job" if not slot else f"only {slot} of the {self.jobs} receiving jobs"
                raise MeshSpecError(
                    f"weight sync {n}: {joined} joined within {self.timeout} (is it running, "
                    f"and given the address {self.address}?); the sending job's weights are untouched"
                )
            sizes.append(int(value.partition(":")[0]))
        return self.job_size, tuple(sizes)

    def _claimed(self, n: int, jobs: int, slot: int, deadline: float) -> tuple[tuple[int, ...], int]:
        """Receiver: every receiving job's size by slot once all slots of round ``n`` are claimed, and
        this job's first bridge rank after the senders'."""
        if jobs == 1:
            return (self.job_size,), 0
        keys = [f"{PREFIX}/{n}/claim/{j}" for j in range(jobs)]
        try:
            self.store.wait(keys, timedelta(seconds=max(deadline - time.monotonic(), 0.001)))
            values = [v.decode() for v in self.store.multi_get(keys)]
        except (RuntimeError, dist.DistError) as err:
            raise MeshSpecError(
                f"weight sync {n}: not every one of the {jobs} receiving jobs joined within "
                f"{self.timeout}; this rank's weights are untouched"
            ) from err
        if "abandoned" in values:
            raise MeshSpecError(
                f"weight sync {n}: the sending job gave up waiting for its {jobs} receiving jobs "
                f"({self.timeout}); this rank's weights are untouched"
            )
        sizes = tuple(int(v.partition(":")[0]) for v in values)
        return sizes, sum(sizes[:slot])

    def _claim(self) -> tuple[int, int, tuple[int, ...], int]:
        """Receiver: claim a slot of the next round the senders open (skipping rounds given up or
        claimed by as many receiving jobs as the senders feed); (round, senders, job sizes, offset)."""
        deadline = time.monotonic() + self.timeout.total_seconds()
        n = self._round if self._round is not None else max(0, self.store.add(f"{PREFIX}/opened", 0) - 1)
        mine = f"{self.job_size}:{self._launch}"
        if self._cache is not None:  # synced last round: claim the next one before it opens (one store operation)
            senders, sizes = self._cache["sizes"]
            if self.store.compare_set(f"{PREFIX}/{n}/claim/{self._slot}", "", mine).decode() == mine:
                self._round = n + 1
                return (n, senders) + self._claimed(n, len(sizes), self._slot, deadline)
        while True:
            left = deadline - time.monotonic()
            try:
                if left <= 0:
                    raise RuntimeError("timeout")
                self.store.wait([f"{PREFIX}/open/{n}"], timedelta(seconds=left))
            except (RuntimeError, dist.DistError) as err:
                self._lost = True  # (or its store went away): connect again at the next receive()
                raise MeshSpecError(
                    f"weight sync: no sending job opened a sync within {self.timeout} at "
                    f"{self.address}; this rank's weights are untouched"
                ) from err
            senders, _, jobs = self.store.get(f"{PREFIX}/open/{n}").decode().partition(":")
            for slot in range(int(jobs)):
                if self.store.compare_set(f"{PREFIX}/{n}/claim/{slot}", "", mine).decode() == mine:
                    self._round, self._slot = n + 1, slot
                    return (n, int(senders)) + self._claimed(n, int(jobs), slot, deadline)
            n += 1

    def _arrive(
        self, prefix: str, members: list[int], senders: int, n: int, me: int, *, flag: bool = False, mark: bool = False
    ):
        def absent(arrived, missing):
            if missing is None:
                self._lost = self.role == "receiver"
                return MeshSpecError(
                    f"weight sync {n}: the link's store at {self.address} went away (the sending job's rank 0 ended)"
                )
            if not missing:
                return (
                    _Late(n)
                    if self.role == "receiver"
                    else MeshSpecError(
                        f"weight sync {n}: this rank came after the others gave up waiting ({self.timeout})"
                    )
                )
            after = (
                "the data phase had begun (a rank ended during it)"
                if prefix.endswith("/done")
                else "no message was sent"
            )
            return MeshSpecError(
                f"weight sync {n}: only {len(arrived)} of the {len(members)} ranks of both jobs "
                f"arrived within {self.timeout}; missing: {describe_missing(missing, senders)} (ended, or "
                f"not calling send()/receive()); {after}"
            )

        try:
            return arrive(self.store, prefix, members, self.timeout, absent, flag=flag, rank=me, mark=mark)
        except _Late:
            raise MeshSpecError(
                f"weight sync {n}: this receiving rank came after the sending job gave up waiting "
                f"({self.timeout}); its weights are untouched"
            ) from None

    def _reachable(
        self, records: list[dict], senders: int, members: list[int], n: int, me: int, where: str
    ) -> set[tuple[int, int]]:
        """The (sender, receiver) bridge-rank pairs where the receiver can read the sender's memory: each
        receiver probes the senders on its host, and all ranks learn the answers (no store operation when
        no pair shares a host)."""
        near = same_host_pairs(records, senders)
        if not near:
            return set()
        if me in near:
            can = [s for s in near[me] if probe(Endpoint.from_fields(records[s]["memory"]))]
            signed = self._sign(f"{where}/reach/{me}", json.dumps(can))
            self._store_op(n, lambda: self.store.set(f"{where}/reach/{me}", signed))
        self._arrive(f"{where}/reached", members, senders, n, me)
        keys = [f"{where}/reach/{b}" for b in sorted(near)]
        answers = self._store_op(n, lambda: self.store.multi_get(keys))
        reach = set()
        for b, key, answer in zip(sorted(near), keys, answers):
            can = self._open(n, key, answer, f"the probe answers of {who(b, senders)}")
            if not isinstance(can, list) or not set(can) <= set(near[b]):
                raise MeshSpecError(
                    f"weight sync {n}: {who(b, senders)} answered a probe of sender ranks it was not "
                    f"asked about ({can!r}); no message was sent"
                )
            reach |= {(s, b) for s in can}
        return reach

    def _prepare(
        self,
        agreed: Verdict,
        records: list[dict],
        readable: set[tuple[int, int]],
        digest: str,
        me: int,
        where: str,
        jobs: tuple[int, ...],
    ) -> dict:
        senders = sum(rec["side"] == "sender" for rec in records)
        receivers = len(records) - senders
        itemsize = {n: dtype_of(d).itemsize for n, d in agreed.wire.items()}
        pieces = plan_sync(agreed, itemsize)
        reads, messages = split_reads(pieces, agreed, readable)
        buckets = schedule(messages, lambda key, src: itemsize[name_of(key)], self.bucket_bytes, pack_strided=True)
        address = holding_addresses(agreed)
        pids = {s: records[s]["memory"]["pid"] for s, _ in readable}
        mine = [p for p in reads if p.dst == me]
        pairs: dict[tuple[int, int], int] = {}
        for p in pieces:
            key = (p.src, p.dst - senders)
            pairs[key] = pairs.get(key, 0) + box_numel(p.box) * itemsize[name_of(p.name)]
        try:
            group = dist.ProcessGroupGloo(
                dist.PrefixStore(f"{where}/pg", self.store), me, senders + receivers, self.timeout
            )
        except (RuntimeError, dist.DistError) as err:  # a rank ended between the agreement and here
            raise MeshSpecError(
                f"weight sync: the side channel between the jobs could not be built within "
                f"{self.timeout}: {err}; no message was sent"
            ) from err
        wire = {n: dtype_of(d) for n, d in agreed.wire.items()}
        return {
            "digest": digest,
            "sizes": (senders, jobs),
            "buckets": buckets,
            "reads": _reads(mine, address, pids, itemsize),
            "read_pieces": mine,
            "address": address,
            "pids": pids,
            "itemsize": itemsize,
            "addresses": dict(records[me]["addresses"]),
            "read_from_me": sync_bytes([p for p in reads if p.src == me], itemsize),
            "pairs": pairs,
            "pool": BufferPool(),
            "group": group,
            "wire": wire,
            "bytes": sync_bytes(pieces, itemsize),
        }

    def _data(self, cache: dict, me: int):
        group, wire = cache["group"], cache["wire"]
        sources, targets = (cache["tensors"], {}) if self.role == "sender" else ({}, cache["tensors"])

        def post(ops):
            return [group.send([t], peer, tag) if send else group.recv([t], peer, tag) for send, t, peer, tag in ops]

        def read() -> None:  # while the first messages travel
            if cache["reads"].nbytes:
                if cache["bound_reads"] is None:
                    cache["bound_reads"] = cache["reads"].bind(targets)
                Reads.run(cache["bound_reads"])

        return execute(
            cache["buckets"],
            lambda key: sources[key],
            lambda key: targets[name_of(key)],
            lambda key, src: wire[name_of(key)],
            read,
            buffer_bytes=self.window * self.bucket_bytes,
            pool=cache["pool"],
            rank=me,
            post=post,
            views=cache["views"],
            post_each=True,
            wire_device=HOST,
        )

    def _close_round(
        self,
        prefix: str,
        members: list[int],
        senders: int,
        n: int,
        me: int,
        failure: Optional[BaseException],
        *,
        data: bool = True,
    ) -> None:
        """The closing arrival; ``data=False``: this rank refused the round before its data phase (it
        flags the others and returns; the caller raises its own error)."""
        receiving = self.role == "receiver"
        try:
            done = self._arrive(prefix, members, senders, n, me, flag=failure is not None)
        except MeshSpecError as err:
            failure = failure or err
            done = None
        if not data:
            self._cache = None
            return
        if failure is None and done is not None and done.flagged == 0:
            return
        self._cache = None  # the channel is rebuilt at the next round
        self.partial = receiving
        what = (
            "this rank's weights are partially written (received again at the next sync)"
            if receiving
            else "the sending job's weights are untouched"
        )
        cause = f": {failure}" if failure is not None else f" on {done.flagged} of the ranks of both jobs"
        raise MeshSpecError(f"weight sync {n} failed in the data phase{cause}; {what}") from failure


def _listening(host: str, port: int) -> int:
    """A socket listening on ``host``'s address only (not every interface), its file descriptor handed over."""
    family, kind, proto, _, where = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(where)
        sock.listen(socket.SOMAXCONN)
    except OSError:
        sock.close()
        raise
    return sock.detach()


def _open_store(host: str, port: int, serve: bool, timeout: timedelta):
    try:
        if serve:
            fd = _listening(host, port)
            try:
                return dist.TCPStore(
                    host, port, None, True, timeout=timeout, wait_for_workers=False, master_listen_fd=fd
                )
            except NotImplementedError:
                # torch 2.6's libuv store takes no listen fd (and the link's rounds time out on the legacy
                # backend): the store listens on every interface there; records stay authenticated
                with contextlib.suppress(OSError):
                    os.close(fd)
                logger.warning(
                    "ds-mesh: torch %s's store cannot listen on %s alone: the weight link's store "
                    "listens on every interface (its records are still signed with the link's secret)",
                    torch.__version__,
                    host,
                )
                return dist.TCPStore(host, port, None, True, timeout=timeout, wait_for_workers=False)
        return dist.TCPStore(host, port, None, serve, timeout=timeout, wait_for_workers=False)
    except OSError as err:
        raise MeshSpecError(
            f"the sending job's rank 0 could not serve the weight link at {host}:{port}: {err}"
        ) from err
    except (RuntimeError, dist.DistError) as err:
        if serve:
            raise MeshSpecError(
                f"the sending job's rank 0 could not serve the weight link at {host}:{port}: {err}"
            ) from err
        raise MeshSpecError(f"no sending job's weight link answered at {host}:{port} within {timeout}: {err}") from err


_LINKS_MADE: dict[str, int] = {}  # receiving links made in this process, by address
_LINKS_LOCK = threading.Lock()


def _launch_id(address: str, rank: int, size: int, initialised: bool) -> str:
    """One id shared by this launch's ranks (rank 0 draws it; the job's own store carries it), under a
    key of its own for each receiving link the job makes (by address, and how many were made there
    before in this process: every rank makes them in the same order), so that links made one after
    the other never read each other's id."""
    if size == 1:
        return uuid.uuid4().hex
    if not initialised:
        raise MeshSpecError(
            f"a receiving job of {size} ranks without a torch.distributed world must pass launch=, "
            "one id its ranks share (a new one per launch)"
        )
    with _LINKS_LOCK:
        made = _LINKS_MADE[address] = _LINKS_MADE.get(address, 0) + 1
    store = torch_compat.default_store()
    key = f"{PREFIX}/launch/{address}/{made}"
    if rank == 0:
        store.set(key, uuid.uuid4().hex)
    return store.get(key).decode()


HOST = torch.device("cpu")  # what the side channel (gloo) moves messages from and into
# the side channel's devices for the checks: the host, and accelerators (staged through host buffers)
_BRIDGE = WorldDevices("gloo", ("cpu", "cuda", "hpu", "mps", "npu", "xpu"), None, False, False, socket.gethostname(), 0)


def _tensors(model: Any) -> tuple[Optional[torch.nn.Module], dict[str, torch.Tensor]]:
    if isinstance(model, Mapping):
        return None, dict(model)
    module = getattr(model, "module", model)
    if not isinstance(module, torch.nn.Module):
        raise MeshSpecError(
            f"expected a DeepSpeed engine, a torch.nn.Module or tensors by name, got {type(model).__name__}"
        )
    return module, dict(module.named_parameters())


def _fingerprint(model: Any, layouts: Optional[Mapping[str, ParamLayout]], spec: Optional[MeshSpec]) -> tuple:
    """What this rank's side of a sync is read from, cheaply: each tensor's memory, shape, strides, dtype
    and device, the ZeRO-3 and AutoTP attributes, the layouts and meshes. An equal fingerprint reads
    the same record from the same memory (the cached views hold that memory, so it is not reused)."""
    _, tensors = _tensors(model)
    rows = []
    for name, tensor in tensors.items():
        held = tensor.ds_tensor if _is_zero3(tensor) else tensor
        meta = getattr(tensor, AUTOTP_META, None)
        rows.append(
            (
                name,
                held.data_ptr(),
                held.shape,
                held.stride(),
                held.dtype,
                held.device,
                getattr(held, "ds_numel", None),
                getattr(tensor, "ds_shape", None),
                id(getattr(tensor, "ds_process_group", None)),
                dict(meta) if isinstance(meta, Mapping) else None,
            )
        )
    engine_spec = getattr(getattr(model, "mesh_device", None), "spec", None)
    return rows, dict(layouts) if layouts is not None else None, spec, engine_spec


def _job_spec(model: Any, spec: Optional[MeshSpec], size: int) -> MeshSpec:
    if spec is not None:
        return spec
    engine_spec = getattr(getattr(model, "mesh_device", None), "spec", None)
    return engine_spec if isinstance(engine_spec, MeshSpec) else MeshSpec.build(size, dp=size)


def _is_zero3(param: torch.Tensor) -> bool:
    return hasattr(param, "ds_tensor") and hasattr(param, "ds_shape")


def _reads(
    pieces, address: Mapping[tuple[str, int, int], Optional[int]], pids: Mapping[int, int], itemsize: Mapping[str, int]
) -> Reads:
    """A receiver's :class:`Reads` of its read pieces, from the senders' current addresses."""
    return Reads(
        [
            Read(
                pids[p.src],
                name_of(p.name),
                p.box,
                p.src_box,
                p.dst_box,
                address[(name_of(p.name), p.src, index_of(p.name))],
                itemsize[name_of(p.name)],
            )
            for p in pieces
        ]
    )


def _readable_keys(addresses: Mapping[str, Optional[int]]) -> set[str]:
    return {key for key, at in addresses.items() if at is not None}


def _host_address(tensor: torch.Tensor) -> Optional[int]:
    """Where a contiguous host tensor's data are (what a same-host reader reads), else None."""
    if tensor_device(tensor).type != "cpu" or not tensor.is_contiguous() or not tensor.numel():
        return None
    return tensor.data_ptr()


def _sender_side(
    model: Any, layouts: Optional[Mapping[str, ParamLayout]], spec: Optional[MeshSpec], rank: int, size: int
) -> tuple[dict, dict, list[str]]:
    module, tensors = _tensors(model)
    spec = _job_spec(model, spec, size)
    params: dict[str, dict] = {}
    sources: dict[str, torch.Tensor] = {}
    problems: list[str] = []
    zero3 = {n: p for n, p in tensors.items() if _is_zero3(p)}
    rest = [n for n in tensors if n not in zero3]
    for name, param in zero3.items():
        meta = getattr(param, AUTOTP_META, None)
        if isinstance(meta, Mapping) and meta.get("partition_dim") is not None and not meta.get("replicated"):
            problems.append(
                f"source parameter {name!r} is both an AutoTP shard and ZeRO-3 partitioned, which the "
                "weight link does not read (use ZeRO-3 or AutoTP)"
            )
            continue
        part = param.ds_tensor
        shape = tuple(param.ds_shape)
        index = dist.get_rank(param.ds_process_group)
        start = index * part.ds_numel
        holds = flat_boxes(shape, start, start + part.ds_numel)
        flat = part.detach().reshape(-1)
        for i, (box, first) in enumerate(holds):
            extent = [hi - lo for lo, hi in box]
            sources[key_of(name, i)] = flat[first - start : first - start + math.prod(extent)].view(extent)
        device = tensor_device(part)
        params[name] = sender_param(
            shape, dtype_name(part.dtype), device_text(device), [(b, f - start) for b, f in holds]
        )
        problems += device_problems("source", {name: device}, _BRIDGE)
    if module is not None and rest:
        side = EngineSide(model, spec, rest, layouts)
        known, shapes, problems = side.layouts, side.shapes, problems + side.problems
    else:
        known = {n: (layouts or {}).get(n) or ParamLayout(tuple(tensors[n].shape)) for n in rest}
        shapes = {}
    metas, found = check_tensors(spec, rank, "source", known, tensors, shapes=shapes, world=_BRIDGE)
    problems += found
    for name, meta in metas.items():
        box = own_box(spec, known[name], rank, name, "source")
        tensor = tensors[name].detach()
        sources[key_of(name, 0)] = tensor
        params[name] = sender_param(known[name].shape, dtype_name(meta.dtype), meta.device, [(box, None)])
    return params, sources, problems


def _receiver_side(
    model: Any,
    layouts: Optional[Mapping[str, ParamLayout]],
    spec: Optional[MeshSpec],
    rank: int,
    size: int,
    reads: bool = False,
) -> tuple[dict, dict, list[str]]:
    """``reads``: say which shards same-host reads can fill (contiguous host tensors)."""
    _, tensors = _tensors(model)
    spec = spec if spec is not None else MeshSpec.build(size, dp=size)
    known = {n: (layouts or {}).get(n) or ParamLayout(tuple(t.shape)) for n, t in tensors.items()}
    extra = sorted(set(layouts or {}) - set(tensors))
    metas, problems = check_tensors(spec, rank, "destination", known, tensors, world=_BRIDGE)
    if extra:
        problems.append(f"layouts given for {extra[:6]}, which this rank's model does not have")
    params = {}
    for name, meta in metas.items():
        params[name] = receiver_param(
            known[name].shape,
            dtype_name(meta.dtype),
            meta.device,
            own_box(spec, known[name], rank, name, "destination"),
            reads and _host_address(tensors[name].detach()) is not None,
        )
    return params, {n: t.detach() for n, t in tensors.items()}, problems
