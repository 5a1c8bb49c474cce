"""Call sites of the legacy APIs: the first frame outside the shim (where a TODOV1 warning points),
and which installed third-party distribution it belongs to (a warning the user cannot act on)."""

from __future__ import annotations

import functools
import os
import site
import sysconfig
from types import FrameType
from typing import Optional, Union

# our own packages and deepspeed (whose call sites the installer silences) are never "third party"
OWN = frozenset({"compat", "_ds_mesh_compat", "mesh_core", "codemods", "deepspeed", "wrapt", "__main__"})
# the shim's own frames between a legacy entry point and its caller
SHIM = frozenset({"compat", "_ds_mesh_compat", "wrapt"})


def first_outside(frame: Optional[FrameType], packages: Union[frozenset, set]) -> tuple[Optional[FrameType], int]:
    """The first frame from ``frame`` outward whose module's top package is none of ``packages``
    (``None`` when every frame is), and how many frames were stepped over to reach it."""
    hops = 0
    while frame is not None and str(frame.f_globals.get("__name__", "")).split(".")[0] in packages:
        frame, hops = frame.f_back, hops + 1
    return frame, hops


@functools.lru_cache(maxsize=1)
def _site_dirs() -> tuple[str, ...]:
    dirs = set(site.getsitepackages() if hasattr(site, "getsitepackages") else [])
    dirs.update(p for p in (site.getusersitepackages(), *sysconfig.get_paths().values()) if p)
    return tuple(os.path.realpath(d) + os.sep for d in dirs if d.endswith(("site-packages", "dist-packages")))


def _installed(filename: str) -> bool:
    path = os.path.realpath(filename)
    parts = path.split(os.sep)
    return path.startswith(_site_dirs()) or "site-packages" in parts or "dist-packages" in parts


@functools.lru_cache(maxsize=256)
def _distribution(top: str) -> tuple[str, str]:
    from importlib import metadata

    names = metadata.packages_distributions().get(top) or [top]
    try:
        return names[0], metadata.version(names[0])
    except metadata.PackageNotFoundError:
        return names[0], "(version unknown)"


def third_party(frame: FrameType) -> Optional[tuple[str, str]]:
    """``(distribution, version)`` when ``frame`` runs code of an installed package other than ours."""
    top = str(frame.f_globals.get("__name__", "")).split(".")[0]
    if not top or top in OWN or not _installed(frame.f_code.co_filename):
        return None
    return _distribution(top)
