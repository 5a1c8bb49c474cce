"""Which ``deepspeed`` packages of a run are DeepSpeed itself and which are copies a tree vendors.

The codemods migrate DeepSpeed's own package with internal rules: its reads of the legacy groups
state move to the mesh while its builders stay (they fill the table the mesh runtime serves), which
is right only for a DeepSpeed that runs under ``compat.install()`` (the project's migrated copy).
A user's tree that ships its own modified ``deepspeed/`` (e.g. its own ``deepspeed/moe/layer.py``)
gets no runtime from the migration, so its copy is migrated with the user-code rules instead (a
builder and its readers move together or stay together; codemods/rules/_legacy_state.py).

``auto`` tells them apart by where the package lies: the installed ``deepspeed`` (found without
importing it), or a ``deepspeed`` package a path of the run points at or into, is DeepSpeed itself;
a ``deepspeed`` package found below a directory of the run is a vendored copy. ``internal`` and
``user`` decide for every ``deepspeed`` package of the run.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Optional, Sequence

from .files import module_and_package

MODES = ("auto", "internal", "user")


def _installed_deepspeed() -> Optional[Path]:
    """The directory of the ``deepspeed`` package this interpreter imports (None: not installed)."""
    try:
        spec = importlib.util.find_spec("deepspeed")  # a top-level spec: nothing is imported
    except (ImportError, ValueError):
        return None
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    return Path(os.path.realpath(locations[0])) if locations else None


def in_deepspeed(module: Optional[str]) -> bool:
    return bool(module) and (module == "deepspeed" or module.startswith("deepspeed."))


def package_dir(path: Path, module: str) -> Path:
    """The directory of the top-level package of ``module``, which ``path`` (its file) lies in."""
    path = Path(os.path.realpath(path))
    depth = module.count(".") - (0 if path.name == "__init__.py" else 1)
    return path if depth < 0 else path.parents[depth]  # (a module file deepspeed.py: itself)


def vendored_copy(path: Path, roots: Sequence[Path], mode: str = "auto") -> bool:
    """``path`` lies in a ``deepspeed`` package to be migrated with the user-code rules: a copy of
    DeepSpeed that ``roots`` (the paths the run was given) hold below one of them (see the module's
    docstring for ``mode``)."""
    if mode not in MODES:
        raise ValueError(f"deepspeed rules {mode!r} are not valid; use one of {', '.join(MODES)}")
    module, _ = module_and_package(Path(path))
    if not in_deepspeed(module) or mode == "internal":
        return False
    if mode == "user":
        return True
    top = package_dir(Path(path), module)  # type: ignore[arg-type]
    if top == _installed_deepspeed():
        return False
    for root in roots:
        real = Path(os.path.realpath(root))
        if real == top or top in real.parents:
            return False  # the run points at (or into) this package: DeepSpeed itself
    return True
