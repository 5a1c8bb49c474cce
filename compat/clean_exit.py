"""Destroy the world at interpreter exit when a script that built an engine under the shim never
called ``torch.distributed.destroy_process_group()``.

A gloo rank whose process groups are still alive while the interpreter finalises can abort
("terminate called without an active exception", SIGABRT) after a run that trained correctly;
torch's NCCL backend warns at exit for the same reason. The handler does what such a script should
have done last: ``destroy_process_group()`` on this rank (a local call, no collective). A world the
script destroyed itself is left alone.
"""

from __future__ import annotations

import atexit
import logging
import threading

logger = logging.getLogger(__name__)

_lock = threading.Lock()
_armed = False


def arm() -> None:
    """Register the exit handler once per process (idempotent, thread-safe)."""
    global _armed
    with _lock:
        if _armed:
            return
        _armed = True
    atexit.register(_destroy_world)


def _destroy_world() -> None:
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return
    try:
        dist.destroy_process_group()
    except Exception as exc:  # at exit nothing is left to report to but the log
        logger.debug("ds-mesh: destroy_process_group() at exit failed: %s", exc)
