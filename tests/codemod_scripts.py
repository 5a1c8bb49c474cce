"""Run a realistic legacy script with the real deepspeed 0.19.8 and its migrated version with the
mesh runtime, as one rank of a fake-backend world, and collect the ``OUT`` lines each prints."""

from __future__ import annotations

import contextlib
import io
import sys
from pathlib import Path

from fakepg import fake_world

SCRIPTS = Path(__file__).parent / "fixtures" / "codemods" / "scripts"


def run_fake(source: str, rank: int, world: int, *, legacy: bool, shim: bool = False) -> list[str]:
    """The ``OUT`` lines ``source`` prints as ``rank`` of ``world`` (an exception is a line too);
    with ``shim``, under ``compat.install()`` (uninstalled after)."""
    from mesh_core import set_default_mesh

    _reset_legacy_groups()
    out = io.StringIO()
    installer = None
    if shim:
        import importlib

        import deepspeed  # noqa: F401

        installer = importlib.import_module("compat.install")
        installer.install()
    before = sys.modules.get("compat.install")
    was_installed = bool(before and before.is_installed())
    try:
        with fake_world(rank, world, deepspeed_comm=legacy), contextlib.redirect_stdout(out):
            try:
                exec(compile(source, "<script>", "exec"), {"__name__": "__main__"})
            except Exception as err:  # noqa: BLE001 (what the script raised is part of its output)
                print(f"OUT raised {type(err).__name__}: {err}")
    finally:
        set_default_mesh(None)
        after = sys.modules.get("compat.install")
        if installer is not None or (after is not None and after.is_installed() and not was_installed):
            after.uninstall()  # also an install the script did itself (a migrated compat.install())
    return [line for line in out.getvalue().splitlines() if line.startswith("OUT")]


def without_runtime(code: str) -> str:
    """A migrated script without the ``import compat`` / ``compat.install()`` lines the migration
    adds (codemods._engine.runtime), so that it runs without the mesh runtime."""
    lines = code.splitlines(keepends=True)
    return "".join(
        line for line in lines if line.strip() != "import compat" and not line.lstrip().startswith("compat.install()")
    )


def run_fake_shim(source: str, rank: int, world: int, *, shim: bool) -> list[str]:
    """The ``OUT`` lines of ``source`` (a migrated script) as ``rank`` of ``world`` over the real
    deepspeed 0.19.8 (``deepspeed.comm`` initialised, as in a DeepSpeed job): without the mesh
    runtime (the ``compat.install()`` the migration may have added taken out), or with
    ``compat.install()`` for the run (uninstalled after)."""
    import importlib

    from mesh_core import set_default_mesh

    installer = importlib.import_module("compat.install")  # compat.install is also a function attribute
    _reset_legacy_groups()
    out = io.StringIO()
    try:
        with fake_world(rank, world, deepspeed_comm=True), contextlib.redirect_stdout(out):
            if shim:
                installer.install()
                # no layout left bound by an earlier test in this process (an engine's, a mesh's)
                from compat import engine_scope

                engine_scope.activate(engine_scope.GroupsState(None, None, None))
            try:
                exec(compile(source if shim else without_runtime(source), "<script>", "exec"), {"__name__": "__main__"})
            except Exception as err:  # noqa: BLE001 (what the script raised is part of its output)
                print(f"OUT raised {type(err).__name__}: {err}")
    finally:
        # after the world's teardown, which the installed runtime clears its groups state on
        if installer.is_installed():
            installer.uninstall()
        set_default_mesh(None)
    return [line for line in out.getvalue().splitlines() if line.startswith("OUT")]


def _reset_legacy_groups() -> None:
    """Legacy ``deepspeed.utils.groups`` keeps name-keyed tables across process groups; a run as
    another rank must not see the previous rank's groups (reloading re-runs its top level in place)."""
    import importlib
    import sys
    import types

    module = sys.modules.get("deepspeed.utils.groups")
    if module is not None:
        functions = {
            name: value
            for name, value in vars(module).items()
            if isinstance(value, types.FunctionType) and value.__module__ == module.__name__
        }
        importlib.reload(module)
        # reload made new function objects in the same globals; keep the originals, so copies other
        # modules made with `from ... import` (deepspeed.utils' star import) stay the same objects
        vars(module).update(functions)
