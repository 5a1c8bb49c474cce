"""A frozen, validated description of one model's parallel layout.

A :class:`MeshSpec` names the mesh dimensions (outermost first, row-major: the last dim varies
fastest), their sizes, the global ranks the mesh covers (the whole world or a sub-world) and how
expert parallelism splits the data-parallel ranks. It is pure data: building one never touches
``torch.distributed``, so every validation error is raised before any process group exists.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterable, Mapping, Sequence, Union

# the dim names (one list: mesh_core.axis_names); "dp" and the HSDP pair are mutually exclusive,
# "ep"/"edp" are not dims of their own but a split of the data ranks
from .axis_names import ALIASES, DEFAULT_ORDER, EXPERT_DIMS, HSDP_DIMS, MESH_DIMS  # noqa: F401 (re-exported)

AUTO = "auto"

SizeArg = Union[int, str, None]


class MeshSpecError(ValueError):
    """An invalid mesh description; the message names the offending value and what is valid."""


def is_auto(value: object) -> bool:
    """Whether a dim size asks to be inferred from the number of ranks: ``"auto"`` (any case, no
    spaces), ``None``, or ``-1`` (Python callers; a config's ``"mesh"`` section refuses -1 first)."""
    if isinstance(value, str):
        return value.lower() == AUTO
    return value is None or (type(value) is int and value == -1)


def auto_message(where: str) -> str:
    """The one message for a value that looks like ``"auto"`` but is not it (``" auto "``)."""
    return f'{where} is not valid; write "auto" exactly (no spaces) to infer this dim, or a positive integer'


def _size_or_auto(name: str, value: object) -> Union[int, None]:
    """A dim's size, or None for "infer it"; the one "auto" message for near-misses."""
    if is_auto(value):
        return None
    if isinstance(value, str) and value.strip().lower() == AUTO:
        raise MeshSpecError(auto_message(f"{name}={value!r}"))
    return _positive_int(name, value)


@dataclass(frozen=True)
class MeshSpec:
    """Named dims (outer → inner), their sizes, the ranks they cover and the expert split."""

    names: tuple[str, ...]
    sizes: tuple[int, ...]
    ranks: Sequence[int]  # a range when contiguous (O(1) memory), else a tuple
    world_size: int
    ep: int = 1
    data_before_expert: bool = False
    expert_data_dims: tuple[str, ...] = field(default=())

    @classmethod
    def build(
        cls,
        world_size: int,
        *,
        order: Sequence[str] | None = None,
        ranks: Iterable[int] | None = None,
        ep: int = 1,
        data_before_expert: bool = False,
        **sizes: SizeArg,
    ) -> "MeshSpec":
        """Validate and build a spec.

        ``sizes`` maps dim names to an int, or to ``"auto"``/``-1``/``None`` for the one dim whose
        size is inferred from the number of ranks. Undeclared dims have size 1; when no data dim is
        declared, ``dp`` is inferred. ``ranks`` restricts the mesh to a sub-world (global ranks in
        row-major order); ``order`` lists dims outermost first (default ``pp, dp, sp, tp``).
        """
        world_size = _positive_int("world_size", world_size)
        rank_tuple = _validate_ranks(ranks, world_size)
        unknown = sorted(set(sizes) - set(MESH_DIMS))
        if unknown:
            raise MeshSpecError(f"unknown mesh dim(s) {unknown}; valid dims are {list(MESH_DIMS)} (ep is given as ep=)")
        if "dp" in sizes and any(d in sizes for d in HSDP_DIMS):
            raise MeshSpecError(
                f"dp={sizes['dp']!r} cannot be combined with {[d for d in HSDP_DIMS if d in sizes]}: "
                "declare either dp or dp_replicate x dp_shard (HSDP)"
            )
        if any(d in sizes for d in HSDP_DIMS):
            for d in HSDP_DIMS:
                sizes.setdefault(d, 1)
        elif "dp" not in sizes and (order is None or "dp" in order):
            sizes["dp"] = AUTO
        names = _resolve_order(order, sizes)
        resolved = _resolve_sizes(names, sizes, len(rank_tuple), world_size, rank_tuple)
        data_dims = tuple(n for n in names if n in ("dp", "dp_replicate", "dp_shard", "sp"))
        data_size = math.prod(resolved[n] for n in data_dims)
        ep = _positive_int("ep", ep)
        if data_size % ep:
            dims_desc = "x".join(f"{n}={resolved[n]}" for n in data_dims)
            raise MeshSpecError(
                f"ep={ep} does not divide the data-parallel size {data_size} ({dims_desc}); "
                f"valid ep values are {_divisors(data_size)}"
            )
        return cls(
            names=names,
            sizes=tuple(resolved[n] for n in names),
            ranks=rank_tuple,
            world_size=world_size,
            ep=ep,
            data_before_expert=bool(data_before_expert),
            expert_data_dims=data_dims,
        )

    # --- derived views ------------------------------------------------------------------------
    @property
    def size(self) -> int:
        """Number of ranks the mesh covers."""
        return len(self.ranks)

    @property
    def shape(self) -> dict[str, int]:
        return dict(zip(self.names, self.sizes))

    def dim_size(self, name: str) -> int:
        """Size of a dim, an expert dim, or the flattened ``dp`` of an HSDP mesh; 1 if undeclared."""
        if name == "ep":
            return self.ep
        if name == "edp":
            return self.data_size // self.ep
        if name == "dp" and "dp" not in self.names:
            return math.prod(self.dim_size(d) for d in HSDP_DIMS)
        check_dim_name(name)
        return self.shape.get(name, 1)

    @property
    def data_size(self) -> int:
        return math.prod(self.shape[n] for n in self.expert_data_dims)

    def describe(self) -> str:
        dims = ", ".join(f"{n}={s}" for n, s in zip(self.names, self.sizes))
        extra = f", ep={self.ep}{' (data before expert)' if self.data_before_expert else ''}" if self.ep > 1 else ""
        return f"MeshSpec({dims}{extra}; ranks {_ranks_repr(self.ranks)} of world {self.world_size})"

    def __str__(self) -> str:
        return self.describe()


def check_dim_name(name: str) -> None:
    """Raise a :class:`MeshSpecError` unless ``name`` is a mesh or expert dim name."""
    if name not in MESH_DIMS and name not in EXPERT_DIMS:
        hint = f" ({name!r} is {ALIASES[name]!r} on a mesh)" if name in ALIASES else ""
        raise MeshSpecError(f"unknown mesh dim {name!r}{hint}; valid dims are {list(MESH_DIMS + EXPERT_DIMS)}")


def _positive_int(what: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise MeshSpecError(f"{what}={value!r} is not valid; it must be a positive integer")
    return value


def _validate_ranks(ranks: Iterable[int] | None, world_size: int | None) -> Sequence[int]:
    """The ranks as a range or tuple; ``world_size=None``: the checks that need no world (before one exists)."""
    if ranks is None:
        return range(world_size or 0)
    if world_size is None:
        # no upper bound yet: the world size is known only once the process group exists
        ranks = tuple(ranks)
        negative = [r for r in ranks if isinstance(r, int) and r < 0]
        if negative:
            raise MeshSpecError(f"ranks {negative[:8]} are out of range; a global rank is 0 or more")
        world_size = max((r for r in ranks if isinstance(r, int)), default=0) + 1
    if isinstance(ranks, range) and ranks.step == 1 and len(ranks):
        if ranks.start < 0 or ranks.stop > world_size:
            raise MeshSpecError(f"ranks {ranks} are out of range; valid ranks are 0..{world_size - 1}")
        return ranks
    rank_tuple = tuple(ranks)
    if not rank_tuple:
        raise MeshSpecError("ranks=() is empty; a sub-world mesh needs at least one rank")
    bad = [r for r in rank_tuple if isinstance(r, bool) or not isinstance(r, int) or not 0 <= r < world_size]
    if bad:
        raise MeshSpecError(f"ranks {bad[:8]} are out of range; valid ranks are 0..{world_size - 1}")
    if len(set(rank_tuple)) != len(rank_tuple):
        seen: set[int] = set()
        dupes = sorted({r for r in rank_tuple if r in seen or seen.add(r)})
        raise MeshSpecError(f"ranks contain duplicates {dupes[:8]}; each rank may appear once")
    if rank_tuple == tuple(range(rank_tuple[0], rank_tuple[0] + len(rank_tuple))):
        return range(rank_tuple[0], rank_tuple[0] + len(rank_tuple))
    return rank_tuple


def _resolve_order(order: Sequence[str] | None, sizes: Mapping[str, SizeArg]) -> tuple[str, ...]:
    if order is None:
        return tuple(n for n in DEFAULT_ORDER if n in sizes)
    order = tuple(order)
    unknown = [n for n in order if n not in MESH_DIMS]
    if unknown:
        raise MeshSpecError(f"order has unknown dim(s) {unknown}; valid dims are {list(MESH_DIMS)}")
    dupes = sorted({n for n in order if order.count(n) > 1})
    if dupes:
        raise MeshSpecError(f"order {list(order)} repeats dim(s) {dupes}; each dim may appear once")
    if "dp" in order and any(d in order for d in HSDP_DIMS):
        raise MeshSpecError(f"order {list(order)} mixes dp with {list(HSDP_DIMS)}; use one or the other")
    missing = [n for n in sizes if n not in order and sizes[n] not in (1,)]
    if missing:
        raise MeshSpecError(f"order {list(order)} leaves out dim(s) {missing} that have a size other than 1")
    # dims the order leaves out have size 1; dims it names but sizes don't are 1 too
    return tuple(order)


def _resolve_sizes(
    names: tuple[str, ...],
    sizes: Mapping[str, SizeArg],
    n_ranks: int,
    world_size: int,
    ranks: Sequence[int],
) -> dict[str, int]:
    resolved: dict[str, int] = {}
    inferred: list[str] = []
    for name in names:
        size = _size_or_auto(name, sizes.get(name, 1))
        if size is None:
            inferred.append(name)
            continue
        resolved[name] = size
    if len(inferred) > 1:
        raise MeshSpecError(f"only one dim may be inferred ('auto'), got {inferred}")
    where = f"world_size={world_size}" if n_ranks == world_size else f"the {n_ranks} ranks {_ranks_repr(ranks)}"
    for name in names:
        if name in resolved and n_ranks % resolved[name]:
            raise MeshSpecError(f"{name}={resolved[name]} does not divide {where}")
    known = math.prod(resolved.values())
    desc = " x ".join(f"{n}={resolved[n]}" for n in names if n in resolved) or "1"
    if inferred:
        if n_ranks % known:
            raise MeshSpecError(f"{desc} = {known} does not divide {where}; {inferred[0]} cannot be inferred")
        resolved[inferred[0]] = n_ranks // known
    elif known != n_ranks:
        raise MeshSpecError(
            f"{desc} = {known} ranks, but the mesh covers {where}; the sizes must multiply to {n_ranks}"
        )
    return resolved


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _ranks_repr(ranks: Sequence[int]) -> str:
    if isinstance(ranks, range):
        return f"{ranks[0]}..{ranks[-1]}"
    return str(list(ranks[:8]))[:-1] + (", ...]" if len(ranks) > 8 else "]")
