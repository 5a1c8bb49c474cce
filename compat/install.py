"""Run the real, unchanged ``deepspeed`` package on the mesh: :func:`install` / :func:`uninstall`.

:func:`install` registers wrapt post-import hooks, so it works before or after ``import deepspeed``:

- ``deepspeed.utils.groups``: every function is routed to :mod:`compat.groups`; the module state
  the engine writes (``groups.mpu = ...``, ``groups.mesh_device = ...``) is forwarded there too, so
  both modules read one source of truth (the module's class becomes one with properties);
- ``deepspeed.runtime.pipe.topology``: the topology classes and the grid become the compat ones
  (the grid builds its groups on a mesh, which becomes the engine's);
- ``deepspeed.initialize``: wrapped by :func:`compat.initialize.initialize_wrapper` (the config's
  ``"mesh"`` section; ``mpu=`` / ``mesh_param=`` translated into the same mesh; one mesh per engine,
  as ``engine.mesh_device``); ``DeepSpeedConfig.__init__`` is wrapped in place to size batches by
  that mesh, and the engines' ``forward`` / ``backward`` / ``step`` / ``train_batch`` /
  ``eval_batch``, rank getters and checkpoint save / load run with their own engine's groups
  state (:mod:`compat.engine_scope`);
- ZeRO on an HSDP mesh (:mod:`compat.hsdp`): the engine's ``_configure_zero_optimizer`` /
  ``_configure_checkpointing`` and ``zero.Init.__init__`` are wrapped in place (they pass through
  unless the engine's mesh is an HSDP one); an HSDP engine's ZeRO optimizer gets its per-step
  replica average on the instance.

Copies made by ``from ... import`` (``deepspeed.utils``'s star import of the groups functions,
``pipe/module.py``'s grid and topology names) are re-pointed as well. :func:`uninstall` restores
every patched name. Installing twice is harmless. Setting ``DS_MESH=1`` installs at interpreter
start-up through the ``ds_mesh.pth`` file (see :func:`install_from_env`).
"""

from __future__ import annotations

import functools
import logging
import os
import sys
import threading
import types
import warnings
from typing import Any, Callable

import wrapt

from mesh_core import torch_compat
from mesh_core.runtime_hooks import add_hint, remove_hint, set_quiet_bound

from . import group_trace, mixed_world, releases
from .install_patches import ImportRoutes, PatchSet

logger = logging.getLogger(__name__)

ENV_VAR = "DS_MESH"
DEEPSPEED_SITES = r"deepspeed(\.|$)"

COMM_MODULE = "deepspeed.comm.comm"
GROUPS_MODULE = "deepspeed.utils.groups"
TOPOLOGY_MODULE = "deepspeed.runtime.pipe.topology"
TOPOLOGY_NAMES = (
    "ProcessTopology",
    "PipeDataParallelTopology",
    "PipeModelDataParallelTopology",
    "PipelineParallelGrid",
)
# Engine entry points that run with the engine's own groups state (see compat.engine_scope).
ENGINE_STEP_METHODS = ("forward", "backward", "step")
# Other engine methods that read ``groups`` (rank getters, checkpoint writers / readers).
ENGINE_GROUPS_METHODS = (
    "get_data_parallel_rank",
    "get_tensor_parallel_rank",
    "get_model_parallel_rank",
    "save_checkpoint",
    "load_checkpoint",
    "save_16bit_model",
)
PIPE_ENGINE_STEP_METHODS = ("train_batch", "eval_batch")

_lock = threading.RLock()
_patches = PatchSet(packages=("deepspeed",))
_active = False


# --- public API ---------------------------------------------------------------------------------
def install() -> None:
    """Route ``deepspeed`` (imported now or later) onto the mesh; a second call does nothing."""
    global _active
    with _lock:
        if _active:
            return
        torch_compat.check_torch()  # outside the supported torch range: an error, nothing patched
        version = releases.check()  # outside the supported range: an error, nothing patched
        _active = True
        try:
            _quiet_deepspeed_call_sites(True)
            _logging_tree().install(on_error=_abandon)  # DeepSpeed's logging as one tree (compat/logging_tree.py)
            group_trace.enable()
            group_trace.set_shim_active(True)
            add_hint(mixed_world.hint)  # ranks that never join: say DS_MESH is likely unset there
            set_quiet_bound(mixed_world.agree_bound)  # and name them within DS_MESH_AGREE_TIMEOUT
            _routes.activate()
            from . import process_experts

            process_experts.serve()  # legacy's process-wide expert table / expert-TP size, seen by every mesh
            if "deepspeed" in sys.modules:
                _patches.rebind_copies()  # copies made by modules imported before this call
        except BaseException:
            uninstall()  # all or nothing: no patch stays behind, is_installed() is False
            raise
        logger.debug("compat installed (deepspeed %s, imported: %s)", version, "deepspeed" in sys.modules)


def uninstall() -> None:
    """Restore every name :func:`install` patched; engines built meanwhile keep their meshes."""
    global _active
    with _lock:
        if not _active:
            return
        _active = False
        _patches.restore()
        from . import process_experts

        process_experts.stop()
        if "compat.groups" in sys.modules:  # compat.groups on its own no longer follows deepspeed.comm
            sys.modules["compat.groups"].bind_legacy_comm(None)
        _quiet_deepspeed_call_sites(False)
        _logging_tree().uninstall()
        group_trace.set_shim_active(False)
        group_trace.disable()
        remove_hint(mixed_world.hint)
        set_quiet_bound(None)
        logger.debug("compat uninstalled")


def is_installed() -> bool:
    return _active


def _abandon(module: types.ModuleType, error: BaseException) -> None:
    """A route failed while ``module`` was being imported: undo everything, let the import go on."""
    with _lock:
        if not _active:
            return
        uninstall()
    logger.warning(
        "ds-mesh: routing %s (deepspeed %s) failed: %r; every patch is undone and deepspeed runs without the mesh",
        module.__name__,
        releases.installed_version(),
        error,
    )


def patched_names() -> list[str]:
    """``module.name`` of every patch currently applied (copies not included)."""
    return [f"{_owner_name(p.owner)}.{p.name}" for p in _patches.patches]


def install_from_env(environ: "os._Environ[str] | dict[str, str] | None" = None) -> bool:
    """:func:`install` when ``DS_MESH`` is set to 1/true/yes/on; returns whether it installed."""
    from _ds_mesh_startup import switch_on  # the one on/off parser (warns once on an odd value)

    if not switch_on(ENV_VAR, "run deepspeed on the mesh", environ):
        return False
    install()
    return True


def _quiet_deepspeed_call_sites(quiet: bool) -> None:
    """Hide the TODOV1 warnings of routed calls made *inside* deepspeed (users cannot migrate those)."""
    from .deprecation import LegacyAPIDeprecationWarning

    present = [
        f
        for f in warnings.filters
        if f[0] == "ignore"
        and f[2] is LegacyAPIDeprecationWarning
        and getattr(f[3], "pattern", None) == DEEPSPEED_SITES
    ]
    if quiet and not present:
        warnings.filterwarnings("ignore", category=LegacyAPIDeprecationWarning, module=DEEPSPEED_SITES)
    elif not quiet:
        for f in present:
            warnings.filters.remove(f)
        warnings._filters_mutated()  # type: ignore[attr-defined]


def _logging_tree() -> types.ModuleType:
    from . import logging_tree

    return logging_tree


# --- hook plumbing ------------------------------------------------------------------------------
def _wrap_in_place(owner: Any, name: str, wrapper: Callable[..., Any]) -> None:
    """``owner.name`` through ``wrapper(wrapped, instance, args, kwargs)`` (wrapt's signature)."""
    original = owner.__dict__[name]
    if isinstance(original, types.FunctionType):  # a plain method: a plain function costs a quarter of wrapt's per call
        _patches.replace(owner, name, _method_through(original, wrapper))
    else:
        _patches.replace(owner, name, wrapt.FunctionWrapper(original, wrapper))


def _method_through(original: types.FunctionType, wrapper: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        return wrapper(original.__get__(self), self, args, kwargs)

    return method


def _scope_in_place(owner: type, name: str) -> None:
    """An engine entry point runs with its engine's groups state (compat.engine_scope)."""
    from .engine_scope import scoped_entry_point

    _patches.replace(owner, name, scoped_entry_point(owner.__dict__[name], f"{owner.__qualname__}.{name}"))


def _owner_name(owner: Any) -> str:
    if isinstance(owner, types.ModuleType):
        return owner.__name__
    return f"{owner.__module__}.{owner.__qualname__}"


# --- appliers, one per target module ------------------------------------------------------------
def _route_comm(module: types.ModuleType) -> None:
    """``deepspeed.comm.new_group`` → the world's registry; ``get_all_ranks_from_group`` bounded for
    the world group (see :mod:`compat.comm_routes`)."""
    from . import comm_routes

    comm_routes.bind_legacy(module.get_all_ranks_from_group)
    _patches.replace(module, "new_group", comm_routes.new_group)
    _patches.replace(module, "get_all_ranks_from_group", comm_routes.get_all_ranks_from_group)
    package = sys.modules.get("deepspeed.comm")
    if package is not None:  # the package's star-import copies, when it finished importing already
        _patches.rebind_copies()


def _route_groups(module: types.ModuleType) -> None:
    from . import groups as compat_groups

    # legacy's module-level `dist` (deepspeed.comm): replacements of its functions are honoured
    compat_groups.bind_legacy_comm(getattr(module, "dist", None))
    missing = []
    for name, value in list(vars(module).items()):
        if not isinstance(value, types.FunctionType) or value.__module__ != module.__name__:
            continue
        target = getattr(compat_groups, name, None)
        if not callable(target):
            missing.append(name)
            continue
        # the compat function itself (no wrapper frame): its TODOV1 warning names deepspeed's call site
        _patches.replace(module, name, target)
    if missing:
        logger.warning("compat.groups lacks %s; those deepspeed.utils.groups functions stay legacy", missing)
    # module state (mpu, mesh_device, ..., and the private globals compat.groups exposes as views)
    state = [
        name
        for name, value in vars(module).items()
        if not name.startswith("__")
        and not callable(value)
        and not isinstance(value, types.ModuleType)
        and hasattr(compat_groups, name)
    ]
    _patches.swap_module_class(module, _forwarding_module_class(compat_groups, state))


def _forwarding_module_class(target: types.ModuleType, names: list[str]) -> type:
    """A ModuleType subclass whose ``names`` read and write ``target``'s attributes."""

    def forward(name: str) -> property:
        def write(self: Any, value: Any) -> None:
            # DeepSpeed's private globals are views of compat's state: write through to it
            set_legacy = getattr(target, "set_legacy_global", None)
            if set_legacy is None or not set_legacy(name, value):
                setattr(target, name, value)

        return property(lambda self: getattr(target, name), write)

    namespace = {name: forward(name) for name in names}
    namespace["__doc__"] = f"module state forwarded to {target.__name__}: {', '.join(names)}"
    return type("MeshRoutedModule", (types.ModuleType,), namespace)


def _route_topology(module: types.ModuleType) -> None:
    from . import topology as compat_topology

    for name in TOPOLOGY_NAMES:
        if hasattr(compat_topology, name):
            _patches.replace(module, name, getattr(compat_topology, name))
        else:
            logger.warning("compat.topology lacks %s; deepspeed's stays in place", name)


def _route_config(module: types.ModuleType) -> None:
    from .initialize import config_init_wrapper

    _wrap_in_place(module.DeepSpeedConfig, "__init__", config_init_wrapper)


def _route_engine(module: types.ModuleType) -> None:
    for name in ENGINE_STEP_METHODS + ENGINE_GROUPS_METHODS:
        if name in ENGINE_STEP_METHODS or name in vars(module.DeepSpeedEngine):  # the rank getters: from 0.17.5
            _scope_in_place(module.DeepSpeedEngine, name)


def _route_engine_destroy(module: types.ModuleType) -> None:
    """``engine.destroy()`` also releases the mesh the shim built for the engine (compat.engine_release)."""
    from .engine_release import destroy_wrapper

    _wrap_in_place(module.DeepSpeedEngine, "destroy", destroy_wrapper)


def _route_pipe_engine(module: types.ModuleType) -> None:
    for name in PIPE_ENGINE_STEP_METHODS:
        _scope_in_place(module.PipelineEngine, name)


def _route_comm_init(module: types.ModuleType) -> None:
    # mixed worlds: this rank says it runs the shim as soon as the world is up (compat.mixed_world)
    _patches.replace(
        module, "init_distributed", wrapt.FunctionWrapper(module.init_distributed, mixed_world.init_distributed_wrapper)
    )


def _route_shm_build(module: types.ModuleType) -> None:
    # the first CPU run says that DeepSpeed's shm op is building, and a stale build lock is named (compat.shm_build)
    from .shm_build import build_shm_op_wrapper

    if callable(getattr(module, "build_shm_op", None)):  # a release without the op: nothing to say
        _patches.replace(module, "build_shm_op", build_shm_op_wrapper(module.build_shm_op))


def _route_comm_barrier(module: types.ModuleType) -> None:
    # sub-world engines: world barriers inside a sub-world engine wait for its ranks only
    from .engine_scope import barrier_wrapper

    _patches.replace(module, "barrier", wrapt.FunctionWrapper(module.barrier, barrier_wrapper))


def _route_zero_utils(module: types.ModuleType) -> None:
    # sub-world engines: ZeRO-3's rank-0 trace check runs over the engine's own ranks
    from .engine_scope import same_ints_wrapper

    name = "assert_ints_same_as_other_ranks"
    _patches.replace(module, name, wrapt.FunctionWrapper(getattr(module, name), same_ints_wrapper))


def _route_launcher_env(module: types.ModuleType) -> None:
    # the shim on every node: each multi-node runner exports DS_MESH* / DS_LOG_LEVELS (compat.launcher_env)
    from .launcher_env import runner_init_wrapper

    _wrap_in_place(module.MultiNodeRunner, "__init__", runner_init_wrapper)


def _route_pipe_module(module: types.ModuleType) -> None:
    # sub-world pipelines: PipelineModule(topology=compat.mesh_topology(mesh)) is built on the mesh
    from .subworld_pipe import make_pipeline_module_init_wrapper

    _wrap_in_place(module.PipelineModule, "__init__", make_pipeline_module_init_wrapper(module))


def _route_hsdp(module: types.ModuleType) -> None:
    # HSDP under ZeRO (partition over dp_shard, average across dp_replicate; compat.hsdp)
    from . import hsdp

    for owner, name, wrapper in hsdp.WRAPPERS[module.__name__]:
        _wrap_in_place(getattr(module, owner), name, wrapper)


def _route_initialize(module: types.ModuleType) -> None:
    from .initialize import initialize_wrapper

    current = module.initialize
    # the start-up hook's watcher of an ignored "mesh" section (DS_MESH was off at start-up) steps aside:
    # the shim reads that section; uninstall() puts the watcher back
    original = current.__wrapped__ if getattr(current, "_ds_mesh_watch", False) else current
    _patches.replace(module, "initialize", wrapt.FunctionWrapper(original, initialize_wrapper))
    # last hook of `import deepspeed`: re-point any copy made of a name patched earlier
    _patches.rebind_copies()


# Import order of these modules inside `import deepspeed`; when deepspeed is already imported the
# hooks fire in this order too.
_APPLIERS: list[tuple[str, Callable[[types.ModuleType], None]]] = [
    ("deepspeed.comm.torch", _route_shm_build),
    (COMM_MODULE, _route_comm),
    (COMM_MODULE, _route_comm_barrier),
    (COMM_MODULE, _route_comm_init),
    ("deepspeed.runtime.zero.utils", _route_zero_utils),
    (GROUPS_MODULE, _route_groups),
    ("deepspeed.runtime.config", _route_config),
    (TOPOLOGY_MODULE, _route_topology),
    ("deepspeed.runtime.engine", _route_engine),
    ("deepspeed.runtime.engine", _route_engine_destroy),
    ("deepspeed.runtime.pipe.engine", _route_pipe_engine),
    ("deepspeed.runtime.pipe.module", _route_pipe_module),
    ("deepspeed", _route_initialize),
    ("deepspeed.launcher.multinode_runner", _route_launcher_env),
    *((name, _route_hsdp) for name in ("deepspeed.runtime.engine", "deepspeed.runtime.zero.partition_parameters")),
]
_routes = ImportRoutes(_patches, _APPLIERS, _lock, lambda: _active, on_error=_abandon)


class _CallableModule(types.ModuleType):
    """``import compat.install`` rebinds ``compat.install`` to this module; keep ``compat.install()`` working."""

    def __call__(self) -> None:
        install()


sys.modules[__name__].__class__ = _CallableModule


# --- DS_MESH=1: the start-up hook (compat/startup.py; names kept here for existing callers) ------
from .startup import PTH_LINE, PTH_NAME, remove_pth, write_pth  # noqa: E402,F401

if __name__ == "__main__":
    from .startup import main as _startup_main

    sys.exit(_startup_main())
