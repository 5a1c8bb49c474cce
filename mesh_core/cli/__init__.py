"""The ``mesh`` command line (``python -m mesh_core show``) and its pictures; see :mod:`.commands`."""

from .commands import main

__all__ = ["main"]
