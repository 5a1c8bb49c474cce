"""``deepspeed.comm`` on the mesh: every group deepspeed asks for comes from the world's registry.

:func:`new_group` replaces ``deepspeed.comm.new_group`` (installed by :mod:`compat.install`). Every
``dist.new_group`` line of deepspeed 0.19.8 goes through it — the pipeline's world clone and
tied-weight groups (``runtime/pipe/module.py``), ALST / Ulysses (``parallel_state_sp.py``), the
hybrid engine's inference TP groups, AutoSP (``sp_dp_registry.py``), the inference engines' TP / EP
groups, ZeRO's and the MoE helpers' legacy paths — so identical rank sets share one communicator
with the meshes (``registry_for_world()``), and a rank set spanning the world is the world group.

:func:`get_all_ranks_from_group` replaces ``deepspeed.comm.get_all_ranks_from_group``: deepspeed's
loops ``get_global_rank(group, i)`` until it raises, which torch never does for the world group,
so any caller handed the world group (legacy handed a clone) would spin forever. It answers the
world group's ranks and defers to deepspeed for every other group (same results, same ``[]`` for a
group this rank is not in or ``None``).
"""

from __future__ import annotations

import inspect
import logging
import os
import sys
from typing import Any, Callable, Iterable, Optional

from mesh_core.runtime_hooks import registry_for_world

logger = logging.getLogger(__name__)

_DEEPSPEED_MARK = os.sep + "deepspeed" + os.sep
_legacy_get_all_ranks: Optional[Callable[..., list[int]]] = None


def caller_site(depth: int = 2) -> str:
    """``path:line`` of the nearest frame outside compat / wrapt (for logs and errors)."""
    here = os.path.dirname(os.path.abspath(__file__))
    frame = sys._getframe(depth)
    while frame is not None:
        filename = os.path.abspath(frame.f_code.co_filename)
        if os.path.dirname(filename) != here and "wrapt" not in filename:
            if _DEEPSPEED_MARK in filename:
                filename = "deepspeed" + os.sep + filename.rsplit(_DEEPSPEED_MARK, 1)[1]
            return f"{filename}:{frame.f_lineno}"
        frame = frame.f_back
    return "?"


def _partition(registry: Any, ranks: list[int], asker: str) -> Any:
    # the world's group registry takes asker= (its DEBUG line names who asked); older ones do not
    if "asker" in inspect.signature(registry.partition).parameters:
        return registry.partition([ranks], asker=asker)
    return registry.partition([ranks])


def new_group(ranks: Optional[Iterable[int]] = None) -> Any:
    """``deepspeed.comm.new_group`` served by the world's registry (same contract: called by every
    rank with the same ranks; returns the group, or ``GroupMember.NON_GROUP_MEMBER`` outside it)."""
    import torch.distributed as dist

    rank_list = list(range(dist.get_world_size())) if ranks is None else [int(r) for r in ranks]
    if len(set(rank_list)) != len(rank_list) or any(not 0 <= r < dist.get_world_size() for r in rank_list):
        raise ValueError(
            f"new_group ranks {rank_list} must be distinct ranks of the world (0..{dist.get_world_size() - 1})"
        )
    registry = registry_for_world()
    site = caller_site()
    created = registry.created
    group, _keys = _partition(registry, rank_list, f"deepspeed.comm.new_group at {site}")
    logger.debug(
        "deepspeed.comm.new_group(%s) at %s: %s",
        sorted(rank_list),
        site,
        "created by the registry" if registry.created > created else "shared with an existing group",
    )
    return group if group is not None else dist.GroupMember.NON_GROUP_MEMBER


def get_all_ranks_from_group(group: Any = None) -> list[int]:
    """The global ranks of ``group``; for the world group (where deepspeed's loop never ends)
    ``0..world_size-1``."""
    import torch.distributed as dist

    if group is not None and dist.is_initialized() and group is dist.GroupMember.WORLD:
        return list(range(dist.get_world_size()))
    if _legacy_get_all_ranks is not None:
        return _legacy_get_all_ranks(group)
    try:  # not bound (never installed): the same answer, bounded
        return list(dist.get_process_group_ranks(group))
    except (RuntimeError, ValueError, AttributeError, KeyError):
        return []


def bind_legacy(get_all_ranks: Callable[..., list[int]]) -> None:
    """Remember deepspeed's own ``get_all_ranks_from_group`` (for every group but the world's)."""
    global _legacy_get_all_ranks
    _legacy_get_all_ranks = get_all_ranks
