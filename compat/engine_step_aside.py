"""A DeepSpeed engine's communicators step aside while another model runs (colocated RL).

:func:`release_engine_communicators` releases every communicator of the engines' meshes
(:mod:`mesh_core.step_aside`: suspended on NCCL >= 2.29, destroyed otherwise);
:func:`resume_engine_communicators` brings them back and, where they were destroyed, puts the new
group objects everywhere the old ones are held: the engine and its optimizer (ZeRO's dp / partition
groups, ZeRO-3 parameters' ``ds_process_group``, the parameter coordinator, pipeline grids), the
legacy getters' bound state (:mod:`compat.groups`) and module-level state of ``deepspeed``. It then
checks that nothing it can reach still holds an old group, and raises naming the holders if so.

Release puts a :class:`~mesh_core.step_aside.ReleasedCommunicator` in each destroyed group's place
(so nothing keeps it alive, and a use while released names the remedy); resume replaces the
stand-ins with the new groups.

Engines whose meshes share rank sets (an actor and its reference model on one layout share their
communicators) are released and resumed together: pass them all in one call.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

from mesh_core import MeshSpecError
from mesh_core.runtime_hooks import STEP_ASIDE_ATTR as ATTR
from mesh_core.runtime_hooks import ReleaseRecord, find_references, release_communicators, resume_communicators

logger = logging.getLogger(__name__)


def _mesh_of(engine: Any) -> Any:
    mesh = getattr(engine, "mesh_device", None)
    if mesh is None or not hasattr(mesh, "registry"):
        raise MeshSpecError(
            f"{type(engine).__name__} has no ds-mesh mesh (engine.mesh_device is {mesh!r}); "
            "build the engine with the shim installed (compat.install() or DS_MESH=1)"
        )
    return mesh


def _roots(engines: tuple[Any, ...]) -> list[Any]:
    from . import groups as compat_groups

    modules = [
        m for name, m in list(sys.modules.items()) if m is not None and name.split(".", 1)[0] in ("deepspeed", "compat")
    ]
    return [*engines, compat_groups._state, *modules]


def _meshes(engines: tuple[Any, ...]) -> list[Any]:
    return list({id(m): m for m in map(_mesh_of, engines)}.values())


def release_engine_communicators(*engines: Any, suspend: bool = True) -> list[ReleaseRecord]:
    """Release the communicators of every engine's mesh, and the other groups of the world's
    registry an engine holds (e.g. ZeRO++ hpZ groups); every rank of the engines calls it at the
    same point, e.g. after ``engine.step()``. Returns one record per distinct mesh."""
    holders = _roots(())
    return [
        release_communicators(mesh, suspend=suspend, holders=holders, owners=_engines_on(mesh, engines))
        for mesh in _meshes(engines)
    ]


def _engines_on(mesh: Any, engines: tuple[Any, ...]) -> list[Any]:
    return [engine for engine in engines if _mesh_of(engine) is mesh]


def resume_engine_communicators(*engines: Any) -> list[str]:
    """Bring back what :func:`release_engine_communicators` released and rebind the engines to it;
    returns where new groups were put (e.g. ``DeepSpeedEngine.optimizer.dp_process_group``)."""
    meshes, roots = _meshes(engines), _roots(engines)
    standins = [s for mesh in meshes for s in getattr(getattr(mesh, ATTR, None), "standins", {}).values()]
    rebound: list[str] = []
    for mesh in meshes:
        rebound += resume_communicators(mesh, holders=roots)
    left = find_references(roots, standins)
    if left:
        raise RuntimeError(
            f"after resuming the communicators, {len(left)} place(s) still hold a released one: {left[:5]}"
        )
    logger.debug("resumed %d communicators, rebound %d references", len(standins), len(rebound))
    return rebound
