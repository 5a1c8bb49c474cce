"""``python -m ds_mesh_advice <code>...``: print the catalog row (or TODOV1 kind) of each code."""

from __future__ import annotations

import sys
from typing import Optional, Sequence

from . import explain, find


def main(argv: Optional[Sequence[str]] = None) -> int:
    codes = list(sys.argv[1:] if argv is None else argv)
    if not codes:
        sys.stderr.write("usage: python -m ds_mesh_advice <legacy API or TODOV1 kind> ...\n")
        return 2
    sys.stdout.write("\n\n".join(explain(code) for code in codes) + "\n")
    return 0 if all(find(code) for code in codes) else 1


if __name__ == "__main__":
    raise SystemExit(main())
