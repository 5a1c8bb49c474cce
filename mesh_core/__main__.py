"""``python -m mesh_core show`` (also the ``mesh`` console script); see :mod:`mesh_core.cli`."""

from __future__ import annotations

import sys
from typing import Optional, Sequence

from .cli.commands import main as _cli_main


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the ``mesh`` command line; returns the exit code."""
    return _cli_main(argv)


if __name__ == "__main__":
    sys.exit(main())
