"""What migrated code with no mesh at hand reads when legacy DeepSpeed holds the process groups.

A migrated ``groups._get_sequence_parallel_group()`` is ``current_mesh().get_group("sp")``. Where no
default mesh is set (no mesh runtime, no ``set_default_mesh``) but the real, unpatched DeepSpeed
recorded an mpu — ``deepspeed.initialize(mpu=...)`` stores it in ``deepspeed.utils.groups.mpu``
(passed by keyword, positionally, through ``**kwargs``, or assigned there by another module) — a
device mesh (``groups.mesh_device``), or AutoTP groups (``groups._init_tp_mesh_device``, built here
or in another module), the world data-parallel mesh would answer something else than
the legacy getter. :func:`legacy_groups_view` then returns a :class:`LegacyGroupsView`, which answers
each mesh query with the legacy getter the rewrite replaced, so the result is what legacy computed (under the shim,
``deepspeed.utils.groups`` is compat's, whose getters answer what legacy answers with the shim). Any
other query (``expert_groups_named``, ``spec``, ...) goes to the mesh ``current_mesh`` would have
returned without that state, the world data-parallel mesh.

Where legacy holds nothing either, ``current_mesh`` is the data-parallel world mesh, whose
``get_group("sp")`` raises :class:`NoSequenceParallelGroupError` (a ``KeyError``) as legacy's
``_get_sequence_parallel_group()`` did before any SP layout existed, so code that waits for that
error (retries later, falls back to no SP) keeps its meaning; its SP size is 1 and its SP rank 0,
as legacy's.

mesh_core does not import DeepSpeed: the module is looked up in ``sys.modules`` (only code that
imported DeepSpeed can have set its state), duck-typed, at call time.
"""

from __future__ import annotations

import functools
import sys
from typing import Any, Callable, Optional, Sequence, Union

import torch.distributed as dist

from ..renamed import TorchGetRank
from ..spec import MeshSpecError

GROUPS_MODULE = "deepspeed.utils.groups"
Dims = Union[str, Sequence[str]]

# dims -> (group, world size, rank) getters of deepspeed.utils.groups, the ones the codemods replace
_GETTERS: dict[tuple[str, ...], tuple[str, str, str]] = {
    ("dp",): ("_get_data_parallel_group", "_get_data_parallel_world_size", "_get_data_parallel_rank"),
    ("sp",): ("_get_sequence_parallel_group", "_get_sequence_parallel_world_size", "_get_sequence_parallel_rank"),
    ("dp", "sp"): (
        "_get_sequence_data_parallel_group",
        "_get_sequence_data_parallel_world_size",
        "_get_sequence_data_parallel_rank",
    ),
    ("tp",): (
        "get_tensor_model_parallel_group",
        "get_tensor_model_parallel_world_size",
        "get_tensor_model_parallel_rank",
    ),
}


_LETTERED_DP = ("get_data_parallel_group", "get_data_parallel_world_size", "get_data_parallel_rank")

NO_SP_GROUP = "No sequence parallel group found"  # legacy's KeyError text


class NoSequenceParallelGroupError(KeyError):
    """No sequence-parallel group exists yet. Legacy ``groups._get_sequence_parallel_group()``
    raised ``KeyError("No sequence parallel group found")`` there; this is that ``KeyError``
    (``args[0]`` is legacy's text) with a hint of what makes one."""

    def __init__(self, hint: str = "") -> None:
        super().__init__(*((NO_SP_GROUP, hint) if hint else (NO_SP_GROUP,)))

    def __str__(self) -> str:
        return ": ".join(str(a) for a in self.args if a)


@functools.lru_cache(maxsize=None)
def world_mesh_class() -> type:
    """The class of the data-parallel world mesh ``current_mesh`` falls back to (a
    ``DeepSpeedDeviceMesh`` whose ``get_group("sp")`` raises as legacy did without SP)."""
    from ..device_mesh import DeepSpeedDeviceMesh

    class WorldDataParallelMesh(DeepSpeedDeviceMesh):
        """The whole world as data parallel: legacy ``deepspeed.utils.groups`` with no mpu and no
        device mesh. It has no sequence-parallel group (:class:`NoSequenceParallelGroupError`)."""

        def get_group(self, dims: Dims) -> Any:
            if (dims,) == ("sp",) or (not isinstance(dims, str) and tuple(dims) == ("sp",)):
                raise NoSequenceParallelGroupError(
                    "no mesh with a sequence-parallel dim is set yet (deepspeed.initialize with the config's "
                    '"mesh": {"sp": N} sets one, as does mesh_core.set_default_mesh(mesh))'
                )
            return super().get_group(dims)

    return WorldDataParallelMesh


def legacy_groups_view(fallback: Callable[[], Any]) -> Optional["LegacyGroupsView"]:
    """A view of DeepSpeed's own groups state when it holds an mpu or a device mesh, else None;
    ``fallback()`` gives the mesh that answers what the view has no legacy getter for."""
    groups = sys.modules.get(GROUPS_MODULE)
    if groups is None:
        return None
    if (
        getattr(groups, "mpu", None) is None
        and getattr(groups, "mesh_device", None) is None
        and getattr(groups, "_TENSOR_MODEL_PARALLEL_GROUP", None) is None
    ):
        return None
    return LegacyGroupsView(groups, fallback)


def _key(dims: Dims) -> tuple[str, ...]:
    key = (dims,) if isinstance(dims, str) else tuple(sorted(dims))
    if key not in _GETTERS and key != ("pp", "tp"):
        valid = ", ".join(repr(k[0] if len(k) == 1 else k) for k in (*_GETTERS, ("pp", "tp")))
        raise MeshSpecError(f"dims={dims!r} has no legacy deepspeed.utils.groups getter; valid dims here are {valid}")
    return key


class LegacyGroupsView(TorchGetRank):
    """The mesh queries migrated code makes (``get_group`` / ``size`` / ``get_local_rank`` /
    ``get_group_ranks`` / ``expert_groups``), answered by legacy ``deepspeed.utils.groups``."""

    def __init__(self, groups: Any, fallback: Callable[[], Any]) -> None:
        self._groups = groups
        self._fallback = fallback

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(self._fallback(), name)

    def __repr__(self) -> str:
        return f"LegacyGroupsView(mpu={getattr(self._groups, 'mpu', None)!r})"

    def _autotp_only(self) -> bool:
        """Legacy holds AutoTP groups and neither an mpu nor a device mesh: its data-parallel group
        is the AutoTP one (the lettered getters'), not the world clone."""
        g = self._groups
        return (
            getattr(g, "mpu", None) is None
            and getattr(g, "mesh_device", None) is None
            and getattr(g, "_DATA_PARALLEL_GROUP", None) is not None
        )

    @property
    def rank(self) -> int:
        return dist.get_rank()

    def _getter(self, dims: Dims, what: int):
        key = _key(dims)
        if key == ("dp",) and self._autotp_only():
            return getattr(self._groups, _LETTERED_DP[what])  # the AutoTP data-parallel group
        if key == ("pp", "tp"):
            if what != 1:
                raise MeshSpecError("legacy deepspeed.utils.groups only has the model-parallel world size")
            return self._groups._get_model_parallel_world_size
        return getattr(self._groups, _GETTERS[key][what])

    def get_group(self, dims: Dims) -> Any:
        return self._getter(dims, 0)()

    def size(self, dims: Dims) -> int:
        return self._getter(dims, 1)()

    def get_local_rank(self, dims: Dims) -> int:
        return self._getter(dims, 2)()

    def get_group_ranks(self, dims: Dims) -> list[int]:
        if _key(dims) == ("dp",) and not self._autotp_only():
            return list(self._groups._get_data_parallel_group_ranks())
        return sorted(dist.get_process_group_ranks(self.get_group(dims)))

    def expert_groups(self, ep_size: int) -> Any:
        """The expert groups legacy built for ``ep_size`` (its ``ep_size_<N>`` tables); where legacy
        built none, the ones the world data-parallel mesh builds."""
        from ..expert_table import ExpertGroups

        name = f"ep_size_{ep_size}"
        g = self._groups
        built = getattr(g, "_get_expert_parallel_group_dict", None)
        if built is not None and name not in built():  # none built by legacy: the mesh builds its own
            return self._fallback().expert_groups(ep_size)
        return ExpertGroups(
            ep_size=ep_size,
            ep_group=g._get_expert_parallel_group(name),
            edp_group=g._get_expert_data_parallel_group(name),
            ep_ranks=list(g._get_expert_parallel_group_ranks(name)),
            edp_ranks=list(g._get_expert_data_parallel_group_ranks(name)),
        )
