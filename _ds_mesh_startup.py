"""The ``DS_MESH`` start-up hook of ds-mesh, run by the ``ds_mesh.pth`` file at interpreter start.

Write or remove the ``.pth`` with ``python -m compat.install --write-pth`` / ``--remove-pth``.
The module name is private to ds-mesh so it cannot collide with a user's module, and the hook
imports only what the interpreter has already loaded: with ``DS_MESH`` unset the ``.pth`` line
never imports this module; with ``DS_MESH=1`` it only registers a finder, and the shim (and torch
with it) is loaded when the program first imports ``deepspeed``. The shim package (``compat``,
beside this file) is loaded under its own name, so the hook's ``compat`` is the module ``import compat``
gives the program, whatever the install (editable, wheel, ``PYTHONPATH``, zipapp); only when
``import compat`` would find another ``compat`` (a user's own module) is it loaded as
``_ds_mesh_compat`` and the user's ``compat`` stays theirs.
"""
import os
import sys

ENV_VAR = "DS_MESH"
ON = ("1", "true", "yes", "on")
OFF = ("", "0", "false", "no", "off")
PRIVATE_PACKAGE = "_ds_mesh_compat"
_HERE = os.path.dirname(os.path.abspath(__file__))
_warned = set()  # (name, value) pairs already reported by switch_on


# --- the one parser of ds-mesh's on/off environment variables (DS_MESH, DS_MESH_STRICT) -----------
# It lives here because the start-up hook must read DS_MESH before any package is imported.
def switch_state(name, environ=None):
    """``"on"``, ``"off"`` or ``"unknown"`` for the on/off environment variable ``name`` (unset is off)."""
    value = (os.environ if environ is None else environ).get(name, "").strip().lower()
    return "on" if value in ON else "off" if value in OFF else "unknown"


def switch_on(name, purpose, environ=None):
    """Whether the on/off variable ``name`` is on. A value it does not understand (``enabled``,
    ``2``) counts as off and is reported once per value, as a warning saying ``purpose``."""
    mode = switch_state(name, environ)
    if mode == "unknown":
        value = (os.environ if environ is None else environ).get(name)
        if (name, value) not in _warned:
            _warned.add((name, value))
            _warn(
                f"{name}={value!r} is not understood and is ignored ({name} stays off); use {name}=1 "
                f"(also true/yes/on) to {purpose}, or {name}=0 to leave it off"
            )
    return mode == "on"


def state(environ=None):
    """``"on"``, ``"off"`` or ``"unknown"`` for the current ``DS_MESH`` value."""
    return switch_state(ENV_VAR, environ)


def main():
    """Called by the ``.pth`` line when ``DS_MESH`` is set; never raises."""
    try:
        if switch_on(ENV_VAR, "run deepspeed on the mesh"):
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
    import importlib.util

    init = os.path.join(_HERE, "compat", "__init__.py")
    if PRIVATE_PACKAGE in sys.modules:
        return sys.modules[PRIVATE_PACKAGE]
    loaded = sys.modules.get("compat")
    if loaded is None:
        # every finder of sys.meta_path, not only sys.path's: an editable install's (setuptools'
        # __editable__ finder), a zipapp's and a wheel's ``compat`` is then this very package
        spec = _find_spec("compat")
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


def _find_spec(name):
    import importlib.util

    try:
        return importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None


def _same_file(a, b):
    """Whether paths ``a`` and ``b`` name one file (also inside a zip archive, where stat fails)."""
    if a is None or b is None:
        return False
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.normcase(os.path.realpath(a)) == os.path.normcase(os.path.realpath(b))


def _warn(message):
    import logging

    logging.getLogger("ds_mesh.startup").warning("ds-mesh: %s", message)
