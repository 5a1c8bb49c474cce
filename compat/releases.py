"""The deepspeed releases the shim serves, and the check :func:`compat.install` makes first.

The range is decided from what each release's ``deepspeed.utils.groups``, pipeline topology,
engine and logging code does (docs/releases.md has the table and the command that produces it):

- **0.17.0 … 0.19.8** (and DeepSpeed's development tree, which calls itself 0.19.6): the routed
  functions keep 0.19.8's names, signatures and group memberships for every call deepspeed itself
  makes; the differences inside the range are detected by feature, not version, where they are used
  (the engine's rank getters, ``set_log_level_from_string``, ``print_dist``,
  ``parallel_state_sp._release_sequence_parallel_groups`` are used only where the release has them);
- **0.16.x and older**: ``groups._get_data_parallel_group`` / ``_get_data_parallel_world_size`` /
  ``_get_model_parallel_world_size`` ask a sequence-parallel mpu (one with
  ``initialize_sequence_parallel``) for its groups, where 0.17.0 on (and the compat layer) do not, so
  0.19.8's rules would give wrong answers there;
- **newer than 0.19.8**: not checked yet, so refused rather than guessed.

Outside the range :func:`check` raises :class:`UnsupportedDeepSpeedError` naming the installed
version and the range, before anything is patched.
"""

from __future__ import annotations

import re
import sys
from typing import Optional

__all__ = ["NEWEST", "OLDEST", "SUPPORTED", "UnsupportedDeepSpeedError", "check", "installed_version", "is_supported"]

OLDEST = (0, 17, 0)
NEWEST = (0, 19, 8)
SUPPORTED = ">=0.17.0,<=0.19.8"  # the same constraint as pyproject.toml's "deepspeed" extra
_RELEASE = re.compile(r"^\s*v?(\d+)\.(\d+)(?:\.(\d+))?")


class UnsupportedDeepSpeedError(RuntimeError):
    """The installed deepspeed release is outside the range the shim serves."""


def installed_version() -> Optional[str]:
    """The installed deepspeed's version (the imported module's, else the distribution's); None if absent."""
    module = sys.modules.get("deepspeed")
    version = getattr(module, "__version__", None) if module is not None else None
    if isinstance(version, str):
        return version
    from importlib import metadata

    try:
        return metadata.version("deepspeed")
    except metadata.PackageNotFoundError:
        return None


def release(version: str) -> Optional[tuple[int, int, int]]:
    """``(major, minor, patch)`` of a version string (``0.19.6+edaa722`` → ``(0, 19, 6)``); None if unreadable."""
    match = _RELEASE.match(version)
    if match is None:
        return None
    return int(match.group(1)), int(match.group(2)), int(match.group(3) or 0)


def is_supported(version: str) -> bool:
    parsed = release(version)
    return parsed is not None and OLDEST <= parsed <= NEWEST


def check() -> Optional[str]:
    """The installed version when the shim serves it (None when deepspeed is not installed at all);
    :class:`UnsupportedDeepSpeedError` otherwise."""
    version = installed_version()
    if version is None or is_supported(version):
        return version
    oldest, newest = (".".join(map(str, r)) for r in (OLDEST, NEWEST))
    raise UnsupportedDeepSpeedError(
        f"ds-mesh's shim supports deepspeed >={oldest},<={newest} ({oldest} through {newest}); the installed "
        f"deepspeed is {version}. Install a supported release (pip install 'deepspeed>={oldest},<={newest}') "
        f"or run without the shim (unset DS_MESH, do not call compat.install())."
    )
