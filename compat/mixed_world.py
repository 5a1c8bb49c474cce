"""What the shim adds to :class:`mesh_core.AbsentRanksError`: the likely cause when ranks never join.

A rank that runs DeepSpeed without the shim (its node lacks ``DS_MESH=1``, or the start-up hook) never
builds a mesh, so the shim's ranks wait for it at their first mesh until the process-group timeout.
``mesh_core`` names the missing ranks and those that built no mesh at all in this world; :func:`hint`
(registered by :func:`compat.install`) says why that most likely happened and how each launcher sets
the variable on every node. :func:`announce` (when ``deepspeed.init_distributed`` returns, and at the
start of ``deepspeed.initialize``) tells the others early that this rank runs the shim, so that when a mesh check fails the ranks that got there first wait,
bounded, until this one has read the verdict, and the rank whose process holds the store does not end
it under a shim rank that comes a little later.
"""
from __future__ import annotations

import logging
from typing import Optional

import torch.distributed as dist

from mesh_core import AbsentRanksError
from mesh_core.runtime_hooks import announce_builder, ranks_text

logger = logging.getLogger(__name__)

HOW_TO_SET = (
    "Every rank needs DS_MESH=1 (and the start-up hook, python -m compat.install --write-pth, in the Python "
    "environment of every node): with torchrun, set it on each node (DS_MESH=1 torchrun ...); the deepspeed "
    "launcher carries DS_MESH and the other DS_MESH*/DS_LOG_LEVELS variables to every node when they are set in "
    "its own shell (or put DS_MESH=1 in .deepspeed_env); srun: --export=ALL,DS_MESH=1; mpirun: -x DS_MESH=1 "
    "(Open MPI), -genv DS_MESH 1 (MPICH, Intel MPI). See docs/multinode.md of ds-mesh."
)


def hint(error: AbsentRanksError) -> Optional[str]:
    """The likely cause of ``error`` under the shim, or ``None`` when it does not apply."""
    if error.missing == []:  # this rank came late itself
        return None
    if error.missing is None:
        return ("If some node runs DeepSpeed without the shim, its ranks never join the mesh and this "
                "happens. " + HOW_TO_SET)
    if not error.quiet:  # every missing rank builds meshes: another layout, or later than the timeout
        return None
    return (f"Likely cause: {ranks_text(error.quiet, 'rank')} run DeepSpeed without the ds-mesh shim (they have "
            "built no mesh in this world): DS_MESH=1 is not set in their environment, or the start-up hook is "
            "not installed on their node. " + HOW_TO_SET)


def announce() -> None:
    """Record in the world's store that this rank runs the shim (once per world; nothing on a world
    whose mesh checks are skipped, or whose store cannot take it)."""
    try:
        announce_builder()
    except (RuntimeError, dist.DistError) as err:  # the mesh check reports a broken store itself
        logger.debug("could not announce this rank in the store: %r", err)


def init_distributed_wrapper(wrapped, instance, args, kwargs):  # noqa: ARG001 (wrapt's signature)
    """``deepspeed.comm.init_distributed``, then :func:`announce` (installed by :mod:`compat.install`)."""
    result = wrapped(*args, **kwargs)
    announce()
    return result
