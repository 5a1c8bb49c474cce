"""Legacy DeepSpeed 0.19.8 process-group APIs re-implemented on the mesh.

- :mod:`compat.topology` — ``ProcessTopology``, ``PipeDataParallelTopology``,
  ``PipeModelDataParallelTopology``, ``PipelineParallelGrid``;
- :mod:`compat.groups` — every function of ``deepspeed.utils.groups``, around one default mesh
  (:func:`compat.groups.bind_mesh`);
- :mod:`compat.mpu` — :class:`~compat.mpu.MeshMPU` (a Megatron-style mpu served from a mesh) and
  :func:`~compat.mpu.mesh_from_mpu` (a mesh from a user's mpu);
- :mod:`compat.deprecation` — the ``TODOV1:`` :class:`LegacyAPIDeprecationWarning` (its advice is the
  catalog's, :mod:`ds_mesh_advice`: what to write, and the ``ds-migrate --explain`` code);
- :func:`mesh_topology` — a ``PipelineModule``'s ``topology=`` on a sub-world mesh (a
  :class:`MeshTopology`; :mod:`compat.subworld_pipe`);
- :func:`use_engine` — serve the legacy global getters from one engine when several exist
  (outside any engine's step they raise :class:`WrongGridError`; see :mod:`compat.engine_scope`).

:func:`install` / :func:`uninstall` route the real ``deepspeed`` modules onto these (they import
``compat.install``, and with it DeepSpeed, only when called).
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

from . import deprecation, groups, mpu, topology
from .deprecation import LegacyAPIDeprecationWarning
from .engine_scope import WrongGridError, use_engine
from .subworld_pipe import MeshTopology, mesh_topology  # sub-world pipelines

__all__ = [
    "LegacyAPIDeprecationWarning",
    "MeshTopology",
    "WrongGridError",
    "deprecation",
    "groups",
    "install",
    "mesh_topology",
    "mpu",
    "topology",
    "uninstall",
    "use_engine",
]


def install(*args: Any, **kwargs: Any) -> Any:
    """Route DeepSpeed's legacy modules onto compat (see ``compat.install``)."""
    return _installer().install(*args, **kwargs)


def uninstall(*args: Any, **kwargs: Any) -> Any:
    """Undo :func:`install`."""
    return _installer().uninstall(*args, **kwargs)


def _installer() -> ModuleType:
    # importing the submodule rebinds the package attribute "install" to it; that module is callable
    # (compat.install() keeps working), and `import compat.install as m` always gives the module
    return importlib.import_module(f"{__name__}.install")
