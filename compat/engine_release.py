"""``engine.destroy()`` releases the engine's mesh (installed around ``DeepSpeedEngine.destroy``).

A mesh the shim built for an engine (from the config / model / an mpu) belongs to that engine:
after deepspeed's own ``destroy`` it is destroyed too, releasing its registry references (groups
that another mesh or a legacy call site still holds stay alive). A mesh the caller handed in
(``mesh=``, a ``PipelineModule``'s grid) or one made around the caller's groups (``mpu=``) is
theirs and is left alone. If the
module-wide legacy getters (:mod:`compat.groups`) were serving that mesh, they are unbound, so no
later call gets a destroyed communicator. Only an explicit ``engine.destroy()`` releases: the one
deepspeed's ``__del__`` makes at garbage collection is left alone (see :func:`_called_from_finalizer`).
"""

from __future__ import annotations

import logging
import sys
from typing import Any

logger = logging.getLogger(__name__)

OWNED_ATTR = "_ds_mesh_owned"


def mark_owned(engine: Any, mesh: Any, *, given: Any = None, grid: Any = None, mpu: Any = None) -> None:
    """Record whether ``mesh`` was built for ``engine`` (not handed in through mesh= / grid / mpu)."""
    # an mpu's (or the Ulysses module's) groups are adopted into the mesh: they stay the caller's
    setattr(engine, OWNED_ATTR, mesh is not None and given is None and grid is None and mpu is None)


def release(engine: Any) -> bool:
    """Destroy ``engine``'s mesh when the engine owns it; returns whether it did."""
    mesh = getattr(engine, "mesh_device", None)
    if mesh is None or not getattr(engine, OWNED_ATTR, False) or not hasattr(mesh, "destroy"):
        return False
    from . import groups as compat_groups
    from .engine_scope import GroupsState, activate

    if compat_groups._state.mesh is mesh:  # the legacy getters must not hand out dead groups
        activate(GroupsState(None, None, None))
    destroyed = mesh.destroy()
    setattr(engine, OWNED_ATTR, False)
    logger.debug("engine.destroy(): released %s (%d communicators destroyed)", mesh, destroyed)
    return True


def destroy_wrapper(wrapped, instance, args, kwargs):  # noqa: ARG001 (wrapt's signature)
    """wrapt wrapper for ``DeepSpeedEngine.destroy``: deepspeed's teardown, then the mesh's."""
    from .engine_scope import unregister

    try:
        result = wrapped(*args, **kwargs)
    finally:
        unregister(instance)  # no longer counted by the wrong-grid protection
    if not _called_from_finalizer():
        release(instance)
    return result


def _called_from_finalizer() -> bool:
    """``DeepSpeedEngine.__del__`` calls ``destroy()`` whenever the collector runs, at different
    moments on different ranks; releasing shared groups then would desynchronise the ranks' group
    registries, so only an explicit ``engine.destroy()`` (same program point on every rank) does."""
    frame = sys._getframe(2)
    for _ in range(6):
        if frame is None:
            return False
        if frame.f_code.co_name == "__del__":
            return True
        frame = frame.f_back
    return False
