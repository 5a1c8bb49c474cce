"""An optional "current mesh" for code with no engine in scope.

Meshes hold no global state; this is the one explicit, opt-in pointer, set by whoever owns the
mesh (the compat layer, a training script). Migrated code that had no engine at hand calls
:func:`default_mesh` where it used to call ``deepspeed.utils.groups``.
"""

from __future__ import annotations

import contextlib
import logging
from contextvars import ContextVar, Token
from typing import TYPE_CHECKING, Iterator, Optional

import torch.distributed as dist

from ..registry import registry_for_world
from ..spec import MeshSpecError

if TYPE_CHECKING:
    from ..device_mesh import DeepSpeedDeviceMesh

logger = logging.getLogger(__name__)

_current: ContextVar[Optional["DeepSpeedDeviceMesh"]] = ContextVar("mesh_core_default_mesh", default=None)
# read-only view for per-step hot paths (``DEFAULT_MESH.get() is mesh``); set it with the functions below
DEFAULT_MESH = _current


def default_mesh() -> "DeepSpeedDeviceMesh":
    """The mesh set by :func:`set_default_mesh` / :func:`use_mesh`; raises if none is set, or if
    it is destroyed or was built over a process group that is no longer the default one."""
    mesh = _current.get()
    stale = stale_reason(mesh)
    if stale:
        raise MeshSpecError(
            f"the default mesh {mesh.spec.describe()} {stale}; set the mesh of this world with "
            "mesh_core.set_default_mesh(mesh)"
        )
    if mesh is None:
        raise MeshSpecError(
            "no default mesh is set; pass the model's mesh (engine.mesh_device) or call "
            "mesh_core.set_default_mesh(mesh) first"
        )
    return mesh


def live_default_mesh() -> Optional["DeepSpeedDeviceMesh"]:
    """The default mesh, or None when none is set or it is stale (:func:`stale_reason`); a stale
    one is cleared, so a later world never sees a mesh of an earlier one."""
    mesh = _current.get()
    stale = stale_reason(mesh)
    if stale:
        logger.info("the default mesh %s %s; ignoring it", mesh.spec.describe(), stale)  # type: ignore[union-attr]
        _current.set(None)
        return None
    return mesh


def stale_reason(mesh: Optional["DeepSpeedDeviceMesh"]) -> str:
    """Why ``mesh`` can no longer serve ("" if it can): destroyed, or built in another world."""
    if mesh is None:
        return ""
    if getattr(mesh, "_destroyed", False):
        return "is destroyed"
    registry = getattr(mesh, "registry", None)
    if registry is not None and dist.is_initialized() and registry is not registry_for_world():
        return "was built over a process group that has since been destroyed"
    return ""


def set_default_mesh(mesh: Optional["DeepSpeedDeviceMesh"]) -> None:
    """Set (or with None, clear) the default mesh."""
    _current.set(mesh)


@contextlib.contextmanager
def use_mesh(mesh: "DeepSpeedDeviceMesh") -> Iterator["DeepSpeedDeviceMesh"]:
    """Make ``mesh`` the default mesh inside a ``with`` block."""
    token = _current.set(mesh)
    try:
        yield mesh
    finally:
        _current.reset(token)


def enter_default_mesh(mesh: Optional["DeepSpeedDeviceMesh"]) -> Optional[Token]:
    """Make ``mesh`` the default mesh until :func:`leave_default_mesh` is given the returned token
    (:func:`use_mesh` without a generator, for wrappers that run on every training step); None
    when ``mesh`` already is the default (nothing to restore)."""
    if _current.get() is mesh:
        return None
    return _current.set(mesh)


def leave_default_mesh(token: Optional[Token]) -> None:
    """Restore the default mesh from before the :func:`enter_default_mesh` that returned ``token``."""
    if token is not None:
        _current.reset(token)
