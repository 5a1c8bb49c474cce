"""The ``DS_MESH`` start-up hook of ds-mesh, run by the ``ds_mesh.pth`` file at interpreter start.

``ds_mesh.pth`` comes with the install (every wheel, editable or not, puts it in site-packages and
``pip uninstall`` removes it); ``python -m compat.install --write-pth`` / ``--remove-pth`` write or
remove it in other directories. With ``DS_MESH`` off the hook only watches for a config whose
``"mesh"`` section would be ignored (one warning naming ``DS_MESH=1``). The module name is private to ds-mesh so it cannot collide with a user's module, and the hook
imports only what the interpreter has already loaded: it only registers a finder, and the shim (and
torch with it) is loaded when the program first imports ``deepspeed`` with ``DS_MESH=1``. The shim package (``compat``,
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
PTH_NAME = "ds_mesh.pth"
# the text of ds_mesh.pth (the copy shipped at the repository root must equal it: tests/compat/test_startup.py)
PTH_LINE = (
    "import sys; __import__('importlib.util').util.find_spec('_ds_mesh_startup') is not None "
    "and __import__('_ds_mesh_startup').main()\n"
)
_HERE = os.path.dirname(os.path.abspath(__file__))
_warned = set()  # (name, value) pairs already reported by switch_on
# the launchers' rank variables (torchrun / deepspeed, Open MPI, MPICH / Intel MPI, Slurm)
RANK_VARS = ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID")
LOCAL_RANK_VARS = ("LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID")


def launcher_rank(names=RANK_VARS, environ=None):
    """This process's rank (``LOCAL_RANK_VARS``: its rank on its node) as its launcher set it; 0 outside a job."""
    environ = os.environ if environ is None else environ
    for name in names:
        value = environ.get(name, "").strip()
        if value.isdigit():
            return int(value)
    return 0


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
            _warn_once_per_job(
                f"{name}={value!r} is not understood and is ignored ({name} stays off); use {name}=1 "
                f"(also true/yes/on) to {purpose}, or {name}=0 to leave it off"
            )
    return mode == "on"


def state(environ=None):
    """``"on"``, ``"off"`` or ``"unknown"`` for the current ``DS_MESH`` value."""
    return switch_state(ENV_VAR, environ)


def main():
    """Called by the ``.pth`` line at interpreter start; never raises."""
    try:
        if switch_on(ENV_VAR, "run deepspeed on the mesh"):
            if "deepspeed" in sys.modules:
                _install()
            elif not any(isinstance(f, _DeepSpeedFinder) for f in sys.meta_path):
                sys.meta_path.insert(0, _DeepSpeedFinder())
        elif "deepspeed" in sys.modules:
            watch_initialize(sys.modules["deepspeed"])
        elif not any(isinstance(f, _IgnoredMeshFinder) for f in sys.meta_path):
            sys.meta_path.insert(0, _IgnoredMeshFinder())
    except Exception as err:  # a start-up hook must never stop the interpreter
        _warn_once_per_node(f"{ENV_VAR} start-up hook failed: {err!r}; deepspeed runs without the mesh")


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
            # once per node (its local rank 0): an unsupported release is a property of the node's install
            _warn_once_per_node(
                f"{ENV_VAR}=1 but the shim could not be installed ({type(err).__name__}: {err}); "
                "deepspeed runs without the mesh"
            )
            return None
        import importlib.util

        # ask again, now that the shim's post-import hooks watch deepspeed
        return importlib.util.find_spec(fullname)


class _IgnoredMeshFinder:
    """With the shim off: once ``deepspeed`` is imported, its ``initialize`` warns (once) when the
    config has a ``"mesh"`` section, which plain DeepSpeed ignores."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "deepspeed":
            return None
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        spec = _find_spec(fullname)
        if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _WatchingLoader(spec.loader)
        return spec


class _WatchingLoader:
    """``deepspeed``'s own loader; after the package ran, :func:`watch_initialize` wraps its ``initialize``."""

    def __init__(self, loader):
        self._loader = loader

    def __getattr__(self, name):
        return getattr(self._loader, name)

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        module.__loader__ = module.__spec__.loader = self._loader  # the package keeps its own loader
        self._loader.exec_module(module)
        try:
            watch_initialize(module)
        except Exception as err:
            _warn(f"watching deepspeed.initialize failed: {err!r}")


_mesh_warned = []


def watch_initialize(deepspeed_module):
    """Wrap ``deepspeed.initialize`` so that a ``"mesh"`` section the shim will not read gets one warning."""
    original = getattr(deepspeed_module, "initialize", None)
    if original is None or getattr(original, "_ds_mesh_watch", False):
        return
    import functools

    @functools.wraps(original)
    def initialize(*args, **kwargs):
        try:
            if not _mesh_warned:
                _warn_if_mesh_ignored(original, args, kwargs)
        except Exception:  # the check must never stop the user's call
            pass
        return original(*args, **kwargs)

    initialize._ds_mesh_watch = True
    deepspeed_module.initialize = initialize


def ignored_mesh_section(config, args=None):
    """The ``"mesh"`` section of a ``deepspeed.initialize`` config (a dict, or a JSON / HJSON file
    named by ``config`` or ``args.deepspeed_config``), or None."""
    if config is None and args is not None:
        config = getattr(args, "deepspeed_config", None) or getattr(args, "deepscale_config", None)
    if isinstance(config, (str, os.PathLike)) and os.path.isfile(config):
        with open(config, encoding="utf-8") as fh:
            text = fh.read()
        try:
            import json

            config = json.loads(text)
        except ValueError:
            try:
                import hjson
            except ImportError:
                return None
            config = hjson.loads(text)
    if isinstance(config, dict):
        return config.get("mesh")
    return None


def _warn_if_mesh_ignored(original, args, kwargs):
    if _shim_installed():
        return
    import inspect

    call = inspect.signature(original).bind_partial(*args, **kwargs).arguments
    config = call.get("config")
    section = ignored_mesh_section(config if config is not None else call.get("config_params"), call.get("args"))
    if section is None:
        return
    _mesh_warned.append(True)
    _warn_once_per_job(
        f'the config\'s "mesh" section {section!r} is ignored: the ds-mesh shim is off ({ENV_VAR} is not 1), so plain DeepSpeed '
        f"builds its own groups (data parallel over every rank); run with {ENV_VAR}=1 to train on the mesh, "
        'or drop the "mesh" section'
    )


def _shim_installed():
    for name in ("compat.install", PRIVATE_PACKAGE + ".install"):
        module = sys.modules.get(name)
        if module is not None and getattr(module, "is_installed", lambda: False)():
            return True
    return False


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


def _warn_once_per_job(message):
    """:func:`_warn` on rank 0 of the job only (the other ranks would repeat it word for word)."""
    if launcher_rank() == 0:
        _warn(message)


def _warn_once_per_node(message):
    """:func:`_warn` on each node's local rank 0 only."""
    if launcher_rank(LOCAL_RANK_VARS) == 0:
        _warn(message)


def _warn(message):
    import logging

    logging.getLogger("ds_mesh.startup").warning("ds-mesh: %s", message)
