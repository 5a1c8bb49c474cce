"""A mesh's expert groups: those it built per expert-parallel size, and the names they are served under.

DeepSpeed's MoE layers look expert groups up by name (``"ep_size_N"``); a mesh registers each size it
builds under that name, and a runtime may register more names (the first registration of a name
wins, as DeepSpeed's builders skip a name that exists). The table is the mesh's own state: read it
through these methods (or the name-keyed functions of :mod:`mesh_core.runtime_hooks`).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping, Optional, Sequence

from torch.distributed import ProcessGroup

from .layout import MeshLayout
from .spec import MeshSpecError

__all__ = ["ExpertGroups", "ExpertGroupsNotBuilt", "ExpertTable", "expert_groups_name"]


def expert_groups_name(ep_size: Optional[int]) -> str:
    """The name DeepSpeed's MoE layers give the expert groups of ``ep_size``: ``ep_size_<N>``."""
    return f"ep_size_{ep_size}"


@dataclass(frozen=True)
class ExpertGroups:
    """EP and EDP groups for one expert-parallel size (this rank's groups and all rank lists)."""

    ep_size: int
    ep_group: Optional[ProcessGroup]
    edp_group: Optional[ProcessGroup]
    ep_ranks: Sequence[int]
    edp_ranks: Sequence[int]
    layout: Optional[MeshLayout] = field(default=None, repr=False, compare=False)  # None: registered lists

    @property
    def all_ep_ranks(self) -> list[list[int]]:
        """Every EP group of the mesh (computed on access: O(world size))."""
        return self._layout().groups("ep")

    @property
    def all_edp_ranks(self) -> list[list[int]]:
        """Every EDP group of the mesh (computed on access: O(world size))."""
        return self._layout().groups("edp")

    def _layout(self) -> MeshLayout:
        if self.layout is None:
            raise MeshSpecError(
                f"expert groups of ep_size={self.ep_size} were registered as rank lists, without a layout"
            )
        return self.layout


class ExpertGroupsNotBuilt(MeshSpecError, AssertionError):
    """No expert groups are registered under a name (an AssertionError too, as DeepSpeed's
    "expert parallel group is not initialized")."""


class ExpertTable:
    """The expert groups of one mesh: by the size it built them for, and by name."""

    def __init__(self) -> None:
        self._by_size: dict[int, ExpertGroups] = {}
        self._by_name: dict[str, ExpertGroups] = {}
        self._lock = threading.Lock()

    def built(self, ep_size: int) -> Optional[ExpertGroups]:
        """The groups the mesh built for ``ep_size`` (None if it has not)."""
        return self._by_size.get(ep_size)

    def add_built(self, ep_size: int, groups: ExpertGroups) -> None:
        """Record groups the mesh built for ``ep_size``, also served as ``ep_size_<N>`` unless that
        name is taken."""
        with self._lock:
            self._by_size[ep_size] = groups
            self._by_name.setdefault(expert_groups_name(ep_size), groups)

    def register(self, name: str, groups: ExpertGroups) -> ExpertGroups:
        """Serve ``groups`` under ``name`` unless the name is taken; returns what ``name`` serves."""
        with self._lock:
            return self._by_name.setdefault(name, groups)

    def named(self) -> Mapping[str, ExpertGroups]:
        """Every registered name → its groups, in registration order (a live read-only view)."""
        return MappingProxyType(self._by_name)

    def built_named(self) -> dict[str, ExpertGroups]:
        """The registered names whose groups this mesh built itself."""
        built = {id(g) for g in self._by_size.values()}
        return {n: g for n, g in self._by_name.items() if id(g) in built}

    def sizes(self) -> Mapping[int, ExpertGroups]:
        """Every expert-parallel size built → its groups (a live read-only view)."""
        return MappingProxyType(self._by_size)

    def clear(self) -> None:
        with self._lock:
            self._by_size.clear()
            self._by_name.clear()
