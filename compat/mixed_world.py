"""What the shim adds to :class:`mesh_core.AbsentRanksError`: the likely cause when ranks never join,
and its own bound on the wait for them.

A rank that runs DeepSpeed without the shim (its node lacks ``DS_MESH=1``, or the start-up hook) never
builds a mesh. Every shim rank says it runs the shim as soon as its world is up (:func:`announce`, when
``deepspeed.init_distributed`` returns, and at the start of ``deepspeed.initialize``), so at its first
mesh a shim rank waits for a rank that has said nothing only :func:`agree_bound` (``DS_MESH_AGREE_TIMEOUT``
seconds, 60 by default), not the process-group timeout; a rank that has said it runs the shim is waited
for up to the process-group timeout (it is late, not absent). ``mesh_core`` names the missing ranks and
those that built no mesh at all in this world; :func:`hint` (registered by :func:`compat.install`) says
why that most likely happened and how each launcher sets the variable on every node. The announcement
also lets the ranks that got to a failed check first wait, bounded, until a later shim rank has read
the verdict, so the rank whose process holds the store does not end it under a shim rank that comes a
little later.
"""

from __future__ import annotations

import logging
import os
from datetime import timedelta
from typing import Optional

import torch.distributed as dist

from mesh_core import AbsentRanksError
from mesh_core.runtime_hooks import announce_builder, ranks_text

logger = logging.getLogger(__name__)

AGREE_ENV = "DS_MESH_AGREE_TIMEOUT"
AGREE_DEFAULT_S = 60.0
_OFF = ("0", "off", "none")
_warned_values: set[str] = set()

HOW_TO_SET = (
    "Every rank needs DS_MESH=1 (and the start-up hook, python -m compat.install --write-pth, in the Python "
    "environment of every node): with torchrun, set it on each node (DS_MESH=1 torchrun ...); the deepspeed "
    "launcher carries DS_MESH and the other DS_MESH*/DS_LOG_LEVELS variables to every node when they are set in "
    "its own shell (or put DS_MESH=1 in .deepspeed_env); srun: --export=ALL,DS_MESH=1; mpirun: -x DS_MESH=1 "
    "(Open MPI), -genv DS_MESH 1 (MPICH, Intel MPI). See docs/multinode.md of ds-mesh."
)


def agree_bound() -> Optional[timedelta]:
    """How long a shim rank waits at its first mesh for a rank that has not said it runs the shim:
    ``DS_MESH_AGREE_TIMEOUT`` seconds (read at each check; 60 by default); ``0`` / ``off``: no bound of
    the shim's own (the process-group timeout). A value that is not a number of seconds is reported
    once and the default used."""
    raw = os.environ.get(AGREE_ENV, "").strip()
    if not raw:
        return timedelta(seconds=AGREE_DEFAULT_S)
    if raw.lower() in _OFF:
        return None
    try:
        seconds = float(raw)
    except ValueError:
        seconds = float("nan")
    if seconds > 0:
        try:
            return timedelta(seconds=seconds)
        except OverflowError:  # longer than any process-group timeout: none of the shim's own
            return None
    if raw not in _warned_values:
        _warned_values.add(raw)
        from .deprecation import job_ranks

        if job_ranks()[0] == 0:  # one warning per job
            logger.warning(
                "ds-mesh: %s=%r is not a positive number of seconds and is ignored (the shim waits %g s "
                "for a rank that has not said it runs the shim); use a positive number of seconds, or 0 for "
                "no bound of the shim's own (the process-group timeout)",
                AGREE_ENV,
                raw,
                AGREE_DEFAULT_S,
            )
    return timedelta(seconds=AGREE_DEFAULT_S)


def hint(error: AbsentRanksError) -> Optional[str]:
    """The likely cause of ``error`` under the shim, or ``None`` when it does not apply."""
    if error.missing == []:  # this rank came late itself
        if agree_bound() is None:
            return None
        return (
            f"If this rank starts long after the others (a slow node, a long load before "
            f"deepspeed.init_distributed), raise {AGREE_ENV} (seconds, {AGREE_DEFAULT_S:g} by default) on "
            "every rank."
        )
    if error.missing is None:
        return (
            "If some node runs DeepSpeed without the shim, its ranks never join the mesh and this "
            "happens. " + HOW_TO_SET
        )
    if not error.quiet:  # every missing rank builds meshes: another layout, or later than the timeout
        return None
    one = len(error.quiet) == 1
    runs, it, they, its, start = (
        ("runs", "it has", "it", "its", "starts") if one else ("run", "they have", "they", "their", "start")
    )
    knob = ""
    if agree_bound() == error.timeout:  # the shim's own bound gave up, not the process-group timeout
        knob = (
            f"; {AGREE_ENV} sets that wait: raise it if {they} {'does' if one else 'do'} run the shim but {start} "
            "far later than the others"
        )
    return (
        f"Likely cause: {ranks_text(error.quiet, 'rank')} {runs} DeepSpeed without the ds-mesh shim ({it} built no "
        f"mesh in this world, and did not say within {error.timeout.total_seconds():g} s that {they} {runs} the "
        f"shim{knob}): DS_MESH=1 is not set "
        f"in {its} environment, the start-up hook is not installed on {its} node, or the shim could not be "
        f"installed there (the node's first rank says why). " + HOW_TO_SET
    )


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
