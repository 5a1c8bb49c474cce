"""Which installed third-party distribution a call site belongs to (for TODOV1 warnings the user cannot act on)."""
from __future__ import annotations

import functools
import os
import site
import sysconfig
from types import FrameType
from typing import Optional

# our own packages and deepspeed (whose call sites the installer silences) are never "third party"
OWN = frozenset({"compat", "_ds_mesh_compat", "mesh_core", "codemods", "deepspeed", "wrapt", "__main__"})


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
