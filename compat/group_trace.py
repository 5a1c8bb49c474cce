"""Who creates process groups: a tracer, and strict mode (``DS_MESH_STRICT=1``).

Every torch process-group creation (``new_group`` / ``new_subgroups*`` through
``distributed_c10d._new_group_with_tag``, and ``split_group``) passes a thin wrapper once
:func:`enable` ran (:func:`compat.install` does it). The wrapper notes whether ``mesh_core`` is on
the call stack — the registry and ``DeepSpeedDeviceMesh`` are the only sanctioned creators while
the shim is active — and:

- hands a :class:`GroupCreation` to every open :func:`trace` (tests: "zero groups outside
  mesh_core, the same rank sets as legacy");
- in strict mode (``DS_MESH_STRICT=1`` in the environment, read at each creation, and the shim
  active) raises :class:`GroupOutsideMeshError` naming the rank set and the calling line, before
  torch creates anything.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import sys
import threading
from typing import Any, Iterator, Optional

from _ds_mesh_startup import switch_on
from mesh_core import torch_compat

logger = logging.getLogger(__name__)

STRICT_ENV = "DS_MESH_STRICT"
_lock = threading.RLock()
_sinks: list[list["GroupCreation"]] = []
_originals: dict[str, Any] = {}
_shim_active = False


class GroupOutsideMeshError(RuntimeError):
    """Strict mode: a process group was about to be created outside mesh_core."""


@dataclasses.dataclass(frozen=True)
class GroupCreation:
    ranks: tuple[int, ...]  # sorted global ranks; the whole world for ranks=None
    inside_mesh_core: bool
    site: str  # "file:line" of the nearest caller outside torch / compat / mesh_core
    api: str  # "new_group" or "split_group"


def strict_requested(environ: Optional[dict] = None) -> bool:
    """Whether ``DS_MESH_STRICT`` is on (the one on/off parser: ``enabled`` or ``2`` warn once and are off)."""
    return switch_on(STRICT_ENV, "raise on process groups created outside mesh_core", environ)


def set_shim_active(active: bool) -> None:
    """Called by compat.install / uninstall: strict mode only applies while the shim is active."""
    global _shim_active
    _shim_active = active


# --- the torch wrapper ------------------------------------------------------------------------------
def _package_dir(name: str) -> str:
    module = sys.modules.get(name)
    path = getattr(module, "__file__", None) or ""
    return os.path.dirname(os.path.abspath(path)) + os.sep if path else "\0"


def _inspect_stack() -> tuple[bool, str]:
    mesh_dir = _package_dir("mesh_core")
    # deepspeed.comm's wrappers are not the asker either: the site is the deepspeed line calling them
    skip = (
        _package_dir("torch"),
        _package_dir("compat"),
        mesh_dir,
        os.path.dirname(contextlib.__file__) + os.sep,
        _package_dir("deepspeed.comm"),
    )
    inside, site = False, "?"
    frame = sys._getframe(2)
    while frame is not None:
        filename = os.path.abspath(frame.f_code.co_filename)
        if filename.startswith(mesh_dir):
            inside = True
        if site == "?" and not filename.startswith(skip) and "wrapt" not in filename:
            site = f"{filename}:{frame.f_lineno}"
        frame = frame.f_back
    return inside, site


def _ranks_of(api: str, args: tuple, kwargs: dict) -> tuple[int, ...]:
    import torch.distributed as dist

    if api == "split_group":
        split = kwargs.get("split_ranks", args[1] if len(args) > 1 else None) or []
        rank = dist.get_rank()
        mine = [r for r in split if rank in r]
        return tuple(sorted(mine[0])) if mine else ()
    ranks = kwargs.get("ranks", args[0] if args else None)
    if ranks is None:
        return tuple(range(dist.get_world_size()))
    return tuple(sorted(int(r) for r in ranks))


def _traced(api: str, original: Any) -> Any:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if _sinks or (_shim_active and strict_requested()):
            inside, site = _inspect_stack()
            event = GroupCreation(_ranks_of(api, args, kwargs), inside, site, api)
            if not inside and _shim_active and strict_requested():
                raise GroupOutsideMeshError(
                    f"{STRICT_ENV}=1: process group of ranks {list(event.ranks)} created outside mesh_core at {site}; "
                    "route it through the mesh (DeepSpeedDeviceMesh / registry_for_world()) or unset " + STRICT_ENV
                )
            for sink in list(_sinks):
                sink.append(event)
            if not inside:
                logger.debug("process group %s created outside mesh_core at %s", list(event.ranks), site)
        return original(*args, **kwargs)

    wrapper.__wrapped__ = original  # type: ignore[attr-defined]
    wrapper.__name__ = getattr(original, "__name__", api)
    return wrapper


_TARGETS = ((torch_compat.NEW_GROUP_ENTRY, "new_group"), (torch_compat.SPLIT_GROUP_ENTRY, "split_group"))


def enable() -> None:
    """Wrap torch's group creators (idempotent)."""
    from torch.distributed import distributed_c10d as c10d

    with _lock:
        for attr, api in _TARGETS:
            if attr in _originals or not hasattr(c10d, attr):
                continue
            _originals[attr] = getattr(c10d, attr)
            setattr(c10d, attr, _traced(api, _originals[attr]))


def disable() -> None:
    """Restore torch's group creators, unless a :func:`trace` is still open."""
    from torch.distributed import distributed_c10d as c10d

    with _lock:
        if _sinks:
            return
        for attr, original in list(_originals.items()):
            setattr(c10d, attr, original)
            del _originals[attr]


def enabled() -> bool:
    return bool(_originals)


@contextlib.contextmanager
def trace() -> Iterator[list[GroupCreation]]:
    """Collect every process-group creation in this process while open."""
    events: list[GroupCreation] = []
    with _lock:
        was_enabled = enabled()
        enable()
        _sinks.append(events)
    try:
        yield events
    finally:
        with _lock:
            _sinks.remove(events)
            if not was_enabled:
                disable()


def outside(events: list[GroupCreation]) -> list[GroupCreation]:
    """The creations that did not come from mesh_core."""
    return [e for e in events if not e.inside_mesh_core]
