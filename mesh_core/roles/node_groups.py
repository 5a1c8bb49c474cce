"""Node-local and cross-node all-to-all groups (ZeRO++ quantized gradients, qgZ).

Legacy ``groups._get_local_all_to_all_group()`` fills one process-global dict
(``_ALL_TO_ALL_GROUP``: ``local_i`` = the ranks of node i, ``global_j`` = the ranks with local index j)
and hands that very dict out; a later world teardown / group release empties it in place, under the
engine that holds it. :func:`local_all_to_all_groups` is that dict and its builder: one object per
process, held by :data:`mesh_core.roles.state.PROCESS_ROLES` (the mesh runtime's legacy getter
serves the same object), every group from the world's
:class:`~mesh_core.runtime_hooks.GroupRegistry`, so asking again creates nothing new.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch.distributed as dist

from ..layout import MeshLayout
from ..registry import registry_for_world
from ..spec import MeshSpec
from .state import PROCESS_ROLES


def all_to_all_groups() -> dict[str, Any]:
    """The process's node all-to-all groups by legacy name (the same dict for the life of the process)."""
    return PROCESS_ROLES.all_to_all


def _member_group(rank_lists: Sequence[Sequence[int]]) -> Any:
    group, _ = registry_for_world().partition([list(r) for r in rank_lists])
    return dist.GroupMember.NON_GROUP_MEMBER if group is None else group  # as new_group for a non-member


def local_all_to_all_groups(devices_per_node: int) -> dict[str, Any]:
    """Legacy ``_get_local_all_to_all_group()`` with the accelerator's ``device_count()`` passed in:
    fill and return :func:`all_to_all_groups` — one node (``local_0`` = the world) when the world is
    smaller than a node, else ``local_i`` / ``global_j`` for ``world // devices_per_node`` nodes; the
    legacy ``AssertionError`` for a world of one node that is not exactly one node's devices."""
    assert dist.is_initialized(), "dist is not initialized"
    groups = PROCESS_ROLES.all_to_all
    world = dist.get_world_size()
    num_local = world // devices_per_node
    if num_local == 0:
        groups["local_0"] = _member_group([range(world)])
    elif num_local == 1:
        assert world == devices_per_node, "num_gpus not equal to device per node, cannot initialize All-To-All"
        groups["local_0"] = _member_group([range(devices_per_node)])
    else:
        assert world > devices_per_node, "num_nodes<2 cannot initialize All-To-All"
        layout = MeshLayout(
            MeshSpec.build(world, dp=num_local, tp=devices_per_node, ranks=range(num_local * devices_per_node))
        )
        # one partition call per legacy name, so each name gets the group of exactly its rank set
        for i, ranks in enumerate(layout.groups("tp")):
            groups[f"local_{i}"] = _member_group([ranks])
        for j, ranks in enumerate(layout.groups("dp")):
            groups[f"global_{j}"] = _member_group([ranks])
    return groups
