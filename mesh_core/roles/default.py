"""An optional "current mesh" for code with no engine in scope.

Meshes hold no global state; this is the one explicit, opt-in pointer, set by whoever owns the
mesh (the compat layer, a training script). Migrated code that had no engine at hand calls
:func:`default_mesh` where it used to call ``deepspeed.utils.groups``.
"""
from __future__ import annotations

import contextlib
from contextvars import ContextVar
from typing import TYPE_CHECKING, Iterator, Optional

from ..spec import MeshSpecError

if TYPE_CHECKING:
    from ..device_mesh import DeepSpeedDeviceMesh

_current: ContextVar[Optional["DeepSpeedDeviceMesh"]] = ContextVar("mesh_core_default_mesh", default=None)


def default_mesh() -> "DeepSpeedDeviceMesh":
    """The mesh set by :func:`set_default_mesh` / :func:`use_mesh`; raises if none is set."""
    mesh = _current.get()
    if mesh is None:
        raise MeshSpecError(
            "no default mesh is set; pass the model's mesh (engine.mesh_device) or call "
            "mesh_core.set_default_mesh(mesh) first"
        )
    return mesh


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
