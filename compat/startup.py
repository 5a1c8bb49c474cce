"""The ``DS_MESH`` start-up hook's ``.pth`` file: write it, remove it (``python -m compat.install``).

Every install of ds-mesh (a wheel, ``pip install -e``) ships ``ds_mesh.pth`` in site-packages (see
``setup.py``) and ``pip uninstall`` removes it; these commands serve other site directories. The line
imports the private ``_ds_mesh_startup`` module (if it still exists: a ``.pth`` left in another
directory after ``pip uninstall`` stays silent), which registers one finder: with ``DS_MESH=1`` it
installs the shim when the program first imports ``deepspeed``; otherwise it only warns, once, when
``deepspeed.initialize`` gets a config whose ``"mesh"`` section nothing will read (see that module).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Optional, Sequence

from _ds_mesh_startup import PTH_LINE, PTH_NAME  # the hook module owns its own line

logger = logging.getLogger(__name__)

HOOK_MODULE = "_ds_mesh_startup"


def default_site_dir() -> str:
    """This environment's site-packages (where ``pip install`` puts packages)."""
    import sysconfig

    return sysconfig.get_paths()["purelib"]


def write_pth(directory: Optional[str] = None) -> str:
    """Write ``ds_mesh.pth`` into a site directory (default: this environment's); returns its path."""
    target = os.path.join(directory or default_site_dir(), PTH_NAME)
    with open(target, "w", encoding="utf-8") as fh:
        fh.write(PTH_LINE)
    return target


def remove_pth(directory: Optional[str] = None) -> Optional[str]:
    """Delete ``ds_mesh.pth`` from a site directory; returns its path, or None if there was none."""
    target = os.path.join(directory or default_site_dir(), PTH_NAME)
    try:
        os.remove(target)
    except FileNotFoundError:
        return None
    return target


def main(argv: Optional[Sequence[str]] = None, out=None) -> int:
    """``python -m compat.install --write-pth [SITE_DIR]`` / ``--remove-pth [SITE_DIR]``."""
    out = out or sys.stdout
    parser = argparse.ArgumentParser(
        prog="python -m compat.install",
        description="Install or remove the DS_MESH=1 start-up hook (ds_mesh.pth in a site directory). "
        "With it, DS_MESH=1 runs unchanged deepspeed scripts on the mesh.",
    )
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument(
        "--write-pth",
        nargs="?",
        const="",
        metavar="SITE_DIR",
        help="write ds_mesh.pth (default directory: this environment's site-packages)",
    )
    action.add_argument(
        "--remove-pth",
        nargs="?",
        const="",
        metavar="SITE_DIR",
        help="remove ds_mesh.pth (default directory: this environment's site-packages)",
    )
    args = parser.parse_args(argv)
    try:
        if args.write_pth is not None:
            out.write(f"wrote {write_pth(args.write_pth or None)}; DS_MESH=1 now runs deepspeed on the mesh\n")
            return 0
        directory = args.remove_pth or default_site_dir()
        removed = remove_pth(directory)
        out.write(f"removed {removed}\n" if removed else f"no {PTH_NAME} in {directory}; nothing to remove\n")
        return 0
    except OSError as err:
        print(f"python -m compat.install: error: {err}", file=sys.stderr)
        return 1
