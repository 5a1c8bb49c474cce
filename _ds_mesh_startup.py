"""The ``DS_MESH`` start-up hook of ds-mesh, run by the ``ds_mesh.pth`` file at interpreter start.

Write or remove the ``.pth`` with ``python -m compat.install --write-pth`` / ``--remove-pth``.
The module name is private to ds-mesh so it cannot collide with a user's module, and the hook
imports only what the interpreter has already loaded: with ``DS_MESH`` unset the ``.pth`` line
never imports this module; with ``DS_MESH=1`` it only registers a finder, and the shim (and torch
with it) is loaded when the program first imports ``deepspeed``. The shim package (``compat``,
beside this file) is loaded under its own name unless ``import compat`` would find another
``compat`` first (a user's module): then it is loaded as ``_ds_mesh_compat`` and the user's
``compat`` stays theirs.
"""
import os
import sys

ENV_VAR = "DS_MESH"
ON = ("1", "true", "yes", "on")
OFF = ("", "0", "false", "no", "off")
PRIVATE_PACKAGE = "_ds_mesh_compat"
_HERE = os.path.dirname(os.path.abspath(__file__))


def state(environ=None):
    """``"on"``, ``"off"`` or ``"unknown"`` for the current ``DS_MESH`` value."""
    value = (os.environ if environ is None else environ).get(ENV_VAR, "").strip().lower()
    return "on" if value in ON else "off" if value in OFF else "unknown"


def main():
    """Called by the ``.pth`` line when ``DS_MESH`` is set; never raises."""
    try:
        mode = state()
        if mode == "unknown":
            _warn(
                f"{ENV_VAR}={os.environ.get(ENV_VAR)!r} is not understood and is ignored; "
                f"use {ENV_VAR}=1 (also true/yes/on) to run deepspeed on the mesh, or {ENV_VAR}=0 to leave it off"
            )
        elif mode == "on":
            if "deepspeed" in sys.modules:
                _install()
            elif not any(isinstance(f, _DeepSpeedFinder) for f in sys.meta_path):
                sys.meta_path.insert(0, _DeepSpeedFinder())
    except Exception as err:  # a start-up hook must never stop the interpreter
        _warn(f"{ENV_VAR} start-up hook failed: {err!r}; deepspeed runs without the mesh")


class _DeepSpeedFinder:
    """Installs the shim the first time ``deepspeed`` is imported, then steps aside."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "deepspeed":
            return None
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        try:
            _install()
        except Exception as err:
            _warn(f"{ENV_VAR}=1 but the shim could not be installed ({type(err).__name__}: {err}); deepspeed runs without the mesh")
            return None
        import importlib.util

        # ask again, now that the shim's post-import hooks watch deepspeed
        return importlib.util.find_spec(fullname)


def load_compat():
    """This distribution's ``compat`` package (imported under a private name if ``compat`` is taken)."""
    import importlib
    import importlib.machinery
    import importlib.util

    init = os.path.join(_HERE, "compat", "__init__.py")
    if PRIVATE_PACKAGE in sys.modules:
        return sys.modules[PRIVATE_PACKAGE]
    loaded = sys.modules.get("compat")
    if loaded is None:
        spec = importlib.machinery.PathFinder.find_spec("compat", sys.path)
        if spec is not None and _same_file(spec.origin, init):
            return importlib.import_module("compat")
    elif _same_file(getattr(loaded, "__file__", None), init):
        return loaded
    spec = importlib.util.spec_from_file_location(
        PRIVATE_PACKAGE, init, submodule_search_locations=[os.path.dirname(init)]
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[PRIVATE_PACKAGE] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[PRIVATE_PACKAGE]
        raise
    return module


def _install():
    import importlib

    package = load_compat()
    importlib.import_module(package.__name__ + ".install").install()


def _same_file(a, b):
    try:
        return a is not None and os.path.samefile(a, b)
    except OSError:
        return False


def _warn(message):
    import logging

    logging.getLogger("ds_mesh.startup").warning("ds-mesh: %s", message)
