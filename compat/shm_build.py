"""The first run speaks: DeepSpeed's shared-memory op (``deepspeed_shm_comm``, CPU runs) under the shim.

DeepSpeed JIT-compiles the op at its first ``init_distributed`` on CPU, silently (its one line,
``DeepSpeed deepspeed.ops.comm.deepspeed_shm_comm_op built successfully``, comes at the end), and a
build that was killed leaves a ``lock`` every later run waits on forever. Wrapped around
``deepspeed.comm.torch.build_shm_op`` by :mod:`compat.install`:

- rank 0 says what is building, where it is cached and how long it takes, before the build, and
  how long it took after (``deepspeed.mesh`` logger, WARNING: quiet through the ``"logging"`` section);
  a rebuild of a cached op (another venv or DeepSpeed release sharing the cache) is said the same way,
  with why it is rebuilt;
- up to torch 2.13 (``FileBaton``), a stale lock (no process builds in the directory, older than a
  starting build's grace) is an error naming the lock and the command that clears it, on every rank,
  instead of the wait; a build that dies while this rank waits gets the same words logged once. From
  torch 2.14 (``filelock``) the ``lock`` every build leaves means nothing unless its flock is held,
  and a killed build releases it: no lock goes stale. The rule is ``_ds_mesh_doctor.shm_op_state``'s,
  which ``mesh doctor`` reports.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any, Callable

from _ds_mesh_doctor import SHM_BUILD_TIME, SHM_OP, shm_op_directory, shm_op_state, stale_lock_message

logger = logging.getLogger("deepspeed.mesh")
POLL_S = 2.0


class StaleLockError(RuntimeError):
    """DeepSpeed's op build would wait forever on a lock nobody holds."""


def build_shm_op_wrapper(wrapped: Callable[[], Any]) -> Callable[[], Any]:
    """``deepspeed.comm.torch.build_shm_op`` that speaks (see the module docstring)."""

    def build_shm_op() -> Any:
        directory = _jit_directory()
        if directory is None:
            return wrapped()
        state = shm_op_state(directory, torch_version=_torch_version())
        if state["state"] == "stale":
            raise StaleLockError(stale_lock_message(state))
        speak = os.environ.get("RANK", "0") in ("0", "") and (not state["built"] or state["state"] == "rebuild")
        if speak and state["state"] == "rebuild":
            logger.warning(
                "ds-mesh: rebuilding DeepSpeed's shared-memory op %s in %s (%s; every rank waits for it): "
                "%s; one more line says when it is ready",
                SHM_OP,
                directory,
                SHM_BUILD_TIME,
                state["rebuild_reason"],
            )
        elif speak:
            logger.warning(
                "ds-mesh: building DeepSpeed's shared-memory op %s for this machine (first CPU run only, "
                "%s; every rank waits for it), cached in %s for later runs; one more line says when it "
                "is ready",
                SHM_OP,
                SHM_BUILD_TIME,
                directory,
            )
        done = threading.Event()
        watcher = threading.Thread(target=_watch, args=(directory, done), name="ds-mesh shm lock watch", daemon=True)
        watcher.start()
        start = time.monotonic()
        try:
            return wrapped()
        finally:
            done.set()
            if speak:
                logger.warning("ds-mesh: %s ready after %.0f s", SHM_OP, time.monotonic() - start)

    build_shm_op.__wrapped__ = wrapped  # type: ignore[attr-defined]
    return build_shm_op


def _torch_version() -> str:
    """The running torch's release (its JIT build's lock rule follows it)."""
    import torch

    return str(torch.__version__)


def _jit_directory() -> "str | None":
    """The op's build directory when this run JIT-builds it (a CPU accelerator, not pre-installed)."""
    try:
        import deepspeed.ops
        from deepspeed.accelerator import get_accelerator
        from deepspeed.git_version_info import installed_ops

        builder = get_accelerator().create_op_builder("ShareMemCommBuilder")
        if builder is None or installed_ops.get(builder.NAME, False):
            return None
        if not deepspeed.ops.__compatible_ops__.get(builder.NAME, False):
            return None
        import torch

        return shm_op_directory({"cuda": torch.version.cuda, "hip": getattr(torch.version, "hip", None)})
    except Exception:  # DeepSpeed's own call reports what is wrong
        return None


def _watch(directory: str, done: threading.Event) -> None:
    """While this rank waits: name a lock that turned stale (its builder died), once."""
    version = _torch_version()
    while not done.wait(POLL_S):
        state = shm_op_state(directory, torch_version=version)
        if state["state"] == "stale":
            logger.error("ds-mesh: %s", stale_lock_message(state))
            return
