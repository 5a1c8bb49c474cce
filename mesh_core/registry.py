"""One communicator per (world, backend, rank set), shared by every mesh of that world.

``torch.distributed.new_group`` is collective over the whole world: every rank must call it for
every group, members or not, in the same order. The registry keeps that contract by creating a
whole *partition* (a list of rank sets) at a time, in the order given, skipping the rank sets that
already exist. Since every rank runs the same mesh code with the same specs, every rank skips the
same sets, so the call sequence stays identical on all ranks. The one exception is a singleton
group: only its member creates it (``use_local_synchronization``), since nobody else takes part.

Registries are kept per default process group (the "world"); a destroyed and re-initialised world
gets a fresh one.
"""
from __future__ import annotations

import logging
import weakref
from collections import Counter
from typing import Iterable, Optional, Sequence

import torch.distributed as dist
from torch.distributed import ProcessGroup

logger = logging.getLogger(__name__)

RankKey = tuple[int, ...]
_NOT_MEMBER = object()


class GroupRegistry:
    """Rank set → process group cache for one world, with reference counts for release."""

    def __init__(self) -> None:
        self._groups: dict[tuple[Optional[str], RankKey], object] = {}
        self._refs: Counter = Counter()
        self.created = 0  # new_group calls issued by this registry
        self.reused = 0  # requests served from the cache
        self.world_size = dist.get_world_size()
        self.rank = dist.get_rank()

    @staticmethod
    def key(ranks: Iterable[int], backend: Optional[str] = None) -> tuple[Optional[str], RankKey]:
        return (backend, tuple(sorted(int(r) for r in ranks)))

    def has(self, ranks: Iterable[int], backend: Optional[str] = None) -> bool:
        return self.key(ranks, backend) in self._groups

    def partition(
        self, rank_lists: Sequence[Sequence[int]], backend: Optional[str] = None
    ) -> tuple[Optional[ProcessGroup], list[tuple[Optional[str], RankKey]]]:
        """Create (or reuse) every group of a partition; return this rank's group and the keys.

        Collective: every rank of the world must call it with the same lists in the same order.
        """
        mine: Optional[ProcessGroup] = None
        keys = []
        for ranks in rank_lists:
            key = self.key(ranks, backend)
            group = self._groups.get(key)
            if group is None:
                group = self._create(key)
            else:
                self.reused += 1
            self._refs[key] += 1
            keys.append(key)
            if group is not _NOT_MEMBER and self.rank in key[1]:
                mine = group  # type: ignore[assignment]
        return mine, keys

    def adopt(
        self, rank_lists: Sequence[Sequence[int]], group: Optional[ProcessGroup], backend: Optional[str] = None
    ) -> list[tuple[Optional[str], RankKey]]:
        """Record a partition some other creator (DeviceMesh) made; ``group`` is this rank's."""
        keys = []
        for ranks in rank_lists:
            key = self.key(ranks, backend)
            if key not in self._groups:
                self._groups[key] = group if (group is not None and self.rank in key[1]) else _NOT_MEMBER
            self._refs[key] += 1
            keys.append(key)
        return keys

    def release(self, keys: Iterable[tuple[Optional[str], RankKey]]) -> int:
        """Drop one reference per key; destroy groups nobody references. Returns groups destroyed."""
        destroyed = 0
        for key in keys:
            self._refs[key] -= 1
            if self._refs[key] > 0:
                continue
            del self._refs[key]
            group = self._groups.pop(key, None)
            if group is None or group is _NOT_MEMBER or group is dist.GroupMember.WORLD:
                continue
            if dist.is_initialized():
                dist.destroy_process_group(group)  # type: ignore[arg-type]
                destroyed += 1
        return destroyed

    def forget(self, group: ProcessGroup) -> int:
        """Drop every cache entry holding ``group`` (already destroyed by someone else), so no later
        request is served a dead communicator. Returns the number of entries dropped."""
        keys = [key for key, cached in self._groups.items() if cached is group]
        for key in keys:
            del self._groups[key]
            self._refs.pop(key, None)
        return len(keys)

    @property
    def rank_sets(self) -> int:
        """Distinct rank sets known to the registry (world-wide communicator count)."""
        return len(self._groups)

    def _create(self, key: tuple[Optional[str], RankKey]) -> object:
        backend, ranks = key
        if len(ranks) == self.world_size and backend is None:
            group: object = dist.GroupMember.WORLD  # the default group already spans these ranks
        elif len(ranks) == 1:
            # a singleton needs no world-wide call: only its member creates it (hashed name, no
            # store barrier beyond itself), so W singleton groups cost each rank one call, not W
            if ranks[0] == self.rank:
                self.created += 1
                group = dist.new_group(ranks=list(ranks), backend=backend, use_local_synchronization=True)
            else:
                group = _NOT_MEMBER
        else:
            self.created += 1
            created = dist.new_group(ranks=list(ranks), backend=backend)
            group = created if self.rank in ranks else _NOT_MEMBER
        self._groups[key] = group
        return group


_REGISTRIES: "weakref.WeakKeyDictionary[ProcessGroup, GroupRegistry]" = weakref.WeakKeyDictionary()


def registry_for_world() -> GroupRegistry:
    """The registry of the current default process group (created on first use)."""
    world = dist.distributed_c10d._get_default_group()
    registry = _REGISTRIES.get(world)
    if registry is None:
        registry = _REGISTRIES[world] = GroupRegistry()
    return registry
