"""sha256 of the codemods' output on a fixed subset of the installed deepspeed package.

``python tools/codemods_digest.py`` prints ``{file: digest}`` as JSON; ``--write`` stores it in
``tests/fixtures/codemods/deepspeed_digest.json`` (what tests pin; rewrite it only when a codemod
change is meant to change the output). ``--all`` digests every file of the package (minutes).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import sys
from pathlib import Path
from typing import Optional, Sequence

ROOT = Path(__file__).resolve().parents[1]
STORED = ROOT / "tests" / "fixtures" / "codemods" / "deepspeed_digest.json"
# files with sites of several codemods (MoE groups, sequence parallel, the pipeline module), fast to migrate
SUBSET = ("moe/layer.py", "moe/mappings.py", "sequence/layer.py", "runtime/pipe/module.py")


def deepspeed_root() -> Path:
    spec = importlib.util.find_spec("deepspeed")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("deepspeed is not installed")
    return Path(spec.submodule_search_locations[0])


def digests(files: Sequence[str] = SUBSET) -> dict[str, str]:
    """``{path relative to deepspeed/: sha256 of the migrated source}`` (the source's own if unchanged)."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from codemods import migrate_code

    root = deepspeed_root()
    out = {}
    for rel in files:
        path = root / rel
        module = "deepspeed." + rel[: -len(".py")].replace("/", ".")
        if module.endswith(".__init__"):
            module = module[: -len(".__init__")]
        package = module if rel.endswith("__init__.py") else module.rpartition(".")[0]
        code = migrate_code(path.read_text(encoding="utf-8"), filename=str(path), module=module, package=package).code
        out[rel] = hashlib.sha256(code.encode("utf-8")).hexdigest()
    return out


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--write", action="store_true", help=f"store the subset's digests in {STORED.relative_to(ROOT)}"
    )
    parser.add_argument("--all", action="store_true", help="every .py file of the package (minutes)")
    args = parser.parse_args(argv)
    files = sorted(str(p.relative_to(deepspeed_root())) for p in deepspeed_root().rglob("*.py")) if args.all else SUBSET
    found = digests(files)
    if args.write:
        STORED.write_text(json.dumps(found, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    print(json.dumps(found, indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
