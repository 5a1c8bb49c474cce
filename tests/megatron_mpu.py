"""One Megatron-style model-parallel unit (mpu) for the tests: the getters a user's ``mpu=`` hands
``deepspeed.initialize`` and ``DeepSpeedDeviceMesh.from_mpu``, served from one process group per dim.

Which getters it has is the shape under test, so it is spelled out per use: ``names`` maps each
getter family to the dim it serves (:data:`MEGATRON`: Megatron-LM's ``parallel_state`` names;
:data:`DEEPSPEED_TEST`: DeepSpeed's own test mpu, ``get_model_parallel_*`` for tp), ``getters``
which of ``group`` / ``world_size`` / ``rank`` / ``group_ranks`` each family has (one list for all
families, or a list per family)."""

from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence

import torch.distributed as dist

MEGATRON = {"data_parallel": "dp", "tensor_model_parallel": "tp", "pipeline_model_parallel": "pp"}
DEEPSPEED_TEST = {"data_parallel": "dp", "model_parallel": "tp"}
ALL_GETTERS = ("group", "world_size", "rank", "group_ranks")


class MegatronMPU:
    """An mpu whose ``get_<family>_<getter>()`` methods answer from ``groups`` (dim -> group) and
    ``ranks`` (dim -> this rank's group's global ranks, needed for the non-group getters)."""

    def __init__(
        self,
        groups: Mapping[str, Any],
        ranks: Optional[Mapping[str, Sequence[int]]] = None,
        *,
        names: Mapping[str, str] = MEGATRON,
        getters: "Sequence[str] | Mapping[str, Sequence[str]]" = ("group",),
    ) -> None:
        per_family = getters if isinstance(getters, Mapping) else {family: getters for family in names}
        unknown = {g for gs in per_family.values() for g in gs} - set(ALL_GETTERS)
        if unknown or set(per_family) - set(names):
            raise ValueError(f"getters {dict(per_family)}: families are {list(names)}, getters {ALL_GETTERS}")
        self.groups, self.ranks = dict(groups), {dim: list(r) for dim, r in (ranks or {}).items()}
        for family, dim in names.items():
            if dim not in self.groups:
                continue
            answers = {
                "group": lambda dim=dim: self.groups[dim],
                "world_size": lambda dim=dim: len(self.ranks[dim]),
                "rank": lambda dim=dim: self.ranks[dim].index(dist.get_rank()),
                "group_ranks": lambda dim=dim: self.ranks[dim],
            }
            for getter in per_family.get(family, ()):
                setattr(self, f"get_{family}_{getter}", answers[getter])

    @classmethod
    def of_mesh(cls, mesh: Any, dims: Sequence[str] = ("dp", "tp", "pp"), **kwargs: Any) -> "MegatronMPU":
        """The mpu a user would hold over ``mesh``'s groups (what ``parallel_state`` would return)."""
        return cls(
            {dim: mesh.get_group(dim) for dim in dims}, {dim: mesh.get_group_ranks(dim) for dim in dims}, **kwargs
        )

    @classmethod
    def of_rank_lists(
        cls, lists: Mapping[str, Sequence[Sequence[int]]], *, member_only: bool = False, **kwargs: Any
    ) -> "MegatronMPU":
        """An mpu of the user's own groups: ``dist.new_group`` for every rank list of every dim, in
        the order given (a world-collective call on every rank), or with ``member_only`` only for
        the lists this rank is in; this rank keeps the group of the list holding it."""
        rank, groups, ranks = dist.get_rank(), {}, {}
        for dim, rank_lists in lists.items():
            for members in rank_lists:
                if member_only and rank not in members:
                    continue
                group = dist.new_group(ranks=list(members))
                if rank in members:
                    groups[dim], ranks[dim] = group, sorted(members)
        return cls(groups, ranks, **kwargs)
