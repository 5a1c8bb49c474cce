"""Rank ↔ coordinate math for a :class:`MeshSpec`, with no torch.distributed.

Ranks are laid out row-major over the spec's dims (the last dim varies fastest), over the
spec's rank list. A *group along dims D* is the set of ranks that share every coordinate outside
D; its members are listed in row-major order of D. Per-rank queries cost O(number of dims) (plus
the size of the returned list); enumerating all groups of a dim is vectorised with numpy.

Expert parallelism splits each data group (the ranks along ``spec.expert_data_dims``, i.e. dp or
dp×sp) of size n into ``ep`` × ``edp = n/ep``:

- expert before data (default, DeepSpeed's E+D): EP groups are consecutive chunks of ep ranks of
  the data group, EDP groups take the same position in every chunk;
- data before expert (``data_before_expert``, DeepSpeed's ``use_data_before_expert_parallel_``):
  EDP groups are consecutive chunks of n/ep ranks, EP groups take the same position in each.
"""

from __future__ import annotations

import math
from functools import cached_property
from typing import Sequence, Union

import numpy as np

from . import row_major
from .spec import HSDP_DIMS, MeshSpec, MeshSpecError, check_dim_name

Dims = Union[str, Sequence[str]]


class MeshLayout:
    """Pure layout queries over one :class:`MeshSpec`."""

    def __init__(self, spec: MeshSpec) -> None:
        self.spec = spec
        self._index = {n: i for i, n in enumerate(spec.names)}
        self._strides = row_major.strides(spec.sizes)
        self._contiguous = isinstance(spec.ranks, range)
        self._position = None if self._contiguous else {r: i for i, r in enumerate(spec.ranks)}

    # --- single-rank queries ------------------------------------------------------------------
    def contains(self, rank: int) -> bool:
        if self._contiguous:
            return self.spec.ranks[0] <= rank < self.spec.ranks[0] + self.spec.size
        return rank in self._position  # type: ignore[operator]

    def local_index(self, rank: int) -> int:
        """Position of a global rank in the mesh (0 .. size-1)."""
        if not self.contains(rank):
            raise MeshSpecError(f"rank {rank} is not part of {self.spec.describe()}")
        if self._contiguous:
            return rank - self.spec.ranks[0]
        return self._position[rank]  # type: ignore[index]

    def global_rank(self, index: int) -> int:
        return self.spec.ranks[index]

    def coordinate(self, rank: int) -> dict[str, int]:
        """The rank's coordinate in every declared dim."""
        idx = self.local_index(rank)
        return dict(zip(self.spec.names, row_major.coords(idx, self.spec.sizes, self._strides)))

    def coordinate_of(self, rank: int, dims: Dims) -> int:
        """The rank's index inside its group along ``dims`` (also ``ep``/``edp``/flattened dims)."""
        members = self.normalize(dims)
        if members in (("ep",), ("edp",)):
            return self._expert_position(members[0], rank)
        coord = self.coordinate(rank)
        value = 0
        for name in members:
            value = value * self.spec.shape[name] + coord[name]
        return value

    def rank_at(self, **coords: int) -> int:
        """Global rank at a coordinate; undeclared dims may be given as 0, missing ones default to 0."""
        coordinate = [0] * len(self.spec.names)
        for name, value in coords.items():
            if name not in self._index:
                check_dim_name(name)
                if value != 0:
                    raise MeshSpecError(f"{name}={value} is out of range; {name} has size 1 in {self.spec.describe()}")
                continue
            size = self.spec.sizes[self._index[name]]
            if not 0 <= value < size:
                raise MeshSpecError(f"{name}={value} is out of range; valid values are 0..{size - 1}")
            coordinate[self._index[name]] = value
        return self.spec.ranks[row_major.flat_index(coordinate, self._strides)]

    def group_ranks(self, dims: Dims, rank: int) -> list[int]:
        """Ranks of ``rank``'s group along ``dims`` (a dim name or a tuple of them, flattened)."""
        members = self.normalize(dims)
        if members in (("ep",), ("edp",)):
            return self._expert_group_ranks(members[0], rank)
        base = self._fibre_base(rank, members)
        offsets = [0]
        for name in members:
            i = self._index[name]
            st, sz = self._strides[i], self.spec.sizes[i]
            offsets = [o + c * st for o in offsets for c in range(sz)]
        return [self.spec.ranks[base + o] for o in offsets]

    # --- whole-mesh enumeration ---------------------------------------------------------------
    def groups(self, dims: Dims) -> list[list[int]]:
        """Every group along ``dims``, ordered row-major over the remaining dims."""
        return self.groups_array(dims).tolist()

    def groups_array(self, dims: Dims) -> np.ndarray:
        """Like :meth:`groups`, as a 2-D int array (one row per group)."""
        members = self.normalize(dims)
        if members in (("ep",), ("edp",)):
            return self._expert_groups_array(members[0])
        return self._fibres(members)

    def p2p_pairs(self) -> list[list[int]]:
        """``[rank, next-stage rank]`` for every rank in rank order, wrapping last stage → first."""
        return [self.p2p_pair(r) for r in sorted(self.spec.ranks)]

    def p2p_pair(self, rank: int) -> list[int]:
        return [rank, self.stage_peer(rank, +1)]

    def stage_peer(self, rank: int, step: int) -> int:
        """The rank ``step`` pipeline stages away (wrapping), with every other coordinate equal."""
        coord = self.coordinate(rank)
        pp = self.spec.dim_size("pp")
        if pp == 1:
            return rank
        coord["pp"] = (coord["pp"] + step) % pp
        return self.rank_at(**coord)

    def normalize(self, dims: Dims) -> tuple[str, ...]:
        """Validated dims in mesh order; ``dp`` of an HSDP mesh expands, size-1 dims drop out."""
        names = (dims,) if isinstance(dims, str) else tuple(dims)
        if not names:
            raise MeshSpecError("dims=() is empty; name at least one dim")
        for name in names:
            check_dim_name(name)
        if len(set(names)) != len(names):
            raise MeshSpecError(f"dims {list(names)} repeat a dim; each dim may appear once")
        if any(n in ("ep", "edp") for n in names):
            if len(names) > 1:
                raise MeshSpecError(f"dims {list(names)}: ep/edp cannot be flattened with other dims")
            return names
        expanded: set[str] = set()
        for name in names:
            if name == "dp" and "dp" not in self._index:
                expanded.update(HSDP_DIMS)
            else:
                expanded.add(name)
        return tuple(n for n in self.spec.names if n in expanded)

    # --- internals ----------------------------------------------------------------------------
    @cached_property
    def _rank_array(self) -> np.ndarray:
        ranks = self.spec.ranks
        flat = np.arange(ranks.start, ranks.stop) if isinstance(ranks, range) else np.asarray(ranks, dtype=np.int64)
        return flat.reshape(self.spec.sizes)

    def _fibre_base(self, rank: int, members: Sequence[str]) -> int:
        """Local index of the first rank of ``rank``'s group along ``members`` (their coords at 0)."""
        idx = self.local_index(rank)
        for name in members:
            i = self._index[name]
            idx -= row_major.coord_along(idx, self._strides[i], self.spec.sizes[i]) * self._strides[i]
        return idx

    def _fibres(self, members: tuple[str, ...]) -> np.ndarray:
        inner = [self._index[n] for n in members]
        outer = [i for i in range(len(self.spec.names)) if i not in inner]
        size = math.prod(self.spec.sizes[i] for i in inner)
        return self._rank_array.transpose(outer + inner).reshape(-1, size)

    def _expert_split(self, data_groups: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        ep = self.spec.ep
        n = data_groups.shape[1]
        if self.spec.data_before_expert:
            blocks = data_groups.reshape(-1, ep, n // ep)
            return blocks.transpose(0, 2, 1).reshape(-1, ep), blocks.reshape(-1, n // ep)
        chunks = data_groups.reshape(-1, n // ep, ep)
        return chunks.reshape(-1, ep), chunks.transpose(0, 2, 1).reshape(-1, n // ep)

    def _expert_groups_array(self, kind: str) -> np.ndarray:
        ep_groups, edp_groups = self._expert_split(self._fibres(self.spec.expert_data_dims))
        return ep_groups if kind == "ep" else edp_groups

    def _expert_position(self, kind: str, rank: int) -> int:
        ep = self.spec.ep
        pos = self.coordinate_of(rank, self.spec.expert_data_dims) if self.spec.expert_data_dims else 0
        edp = self.spec.data_size // ep
        if self.spec.data_before_expert:
            return pos // edp if kind == "ep" else pos % edp
        return pos % ep if kind == "ep" else pos // ep

    def _expert_group_ranks(self, kind: str, rank: int) -> list[int]:
        """EP/EDP members computed from positions in the data group: O(group size x dims)."""
        dims = self.spec.expert_data_dims
        if not dims:
            return [rank]
        pos = self.coordinate_of(rank, dims)
        ep = self.spec.ep
        edp = self.spec.data_size // ep
        # one kind is a consecutive chunk of the data group, the other takes a stride through it
        chunk, stride = (edp, ep) if self.spec.data_before_expert else (ep, edp)
        strided = (kind == "ep") == self.spec.data_before_expert
        if strided:
            positions = [pos % chunk + k * chunk for k in range(stride)]
        else:
            positions = range((pos // chunk) * chunk, (pos // chunk + 1) * chunk)
        axes = [self._index[n] for n in dims]
        base = self._fibre_base(rank, dims)
        out = []
        for q in positions:
            offset = 0
            for i in reversed(axes):
                q, c = divmod(q, self.spec.sizes[i])
                offset += c * self._strides[i]
            out.append(self.spec.ranks[base + offset])
        return out
