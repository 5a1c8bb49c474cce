"""DeepSpeed's logging as one standard ``logging`` tree rooted at ``deepspeed`` (installed with the shim).

DeepSpeed 0.19.8 logs through one ``"DeepSpeed"`` logger object that every module shares, so no
module can be configured on its own. With :func:`install` (called by ``compat.install()``):

- that object becomes a :class:`RoutingLogger`: each call hands the record to
  ``logging.getLogger(<calling module>)`` (``deepspeed.runtime.engine``,
  ``deepspeed.runtime.zero.stage_1_and_2``, ...; helpers such as ``log_dist`` and
  ``warning_once`` are looked through), so levels, filters and handlers work per module. Records of
  ``deepspeed.utils.timer`` (wall-clock breakdown, throughput) go to ``deepspeed.timers``;
- the tree's root ``deepspeed`` is WARNING by default and owns one stdout handler (DeepSpeed's own
  format plus the logger name; ``propagate`` off, as DeepSpeed's logger had it);
- ``deepspeed.timers`` is switched to INFO when the config asks for timers (``wall_clock_breakdown``,
  or an explicit ``"timers": {"throughput": {"enabled": true}}``), whatever the global level;
- op-builder output (``print`` and ``OpBuilder.warning``) becomes records of the op-builder module's
  logger (``deepspeed.ops.op_builder...``; ``deepspeed.comm.torch`` for its "op built" line), WARNING
  for its ``[WARNING]`` lines, INFO for the rest;
  ``print_dist`` output becomes records too; inference v2's ``"DS-Inference"`` logger routes like
  the main one;
- levels come from, lowest precedence first: the default (WARNING), the legacy ``"log_level"``
  config key / launcher ``--log_level`` (both warn ``TODOV1``), the config's
  ``"logging": {"level": "info", "modules": {"deepspeed.runtime.engine": "debug"}}`` section, and the
  ``DS_LOG_LEVELS`` environment variable (``"deepspeed=warning,deepspeed.runtime.zero=debug"``;
  the launchers put their level there, so training processes inherit it).

:func:`uninstall` restores the original logger classes, handlers, levels and functions.
"""

from __future__ import annotations

import functools
import logging
import os
import re
import sys
import threading
import traceback
import types
from typing import Any, Mapping, Optional

import wrapt

from .install_patches import ImportRoutes, PatchSet

logger = logging.getLogger(__name__)

ROOT = "deepspeed"
TIMERS = "deepspeed.timers"
ENV_VAR = "DS_LOG_LEVELS"
LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
    "critical": logging.CRITICAL,
}
DEFAULT_LEVEL = logging.WARNING
FORMAT = "[%(asctime)s] [%(levelname)s] [%(name)s] [%(filename)s:%(lineno)d:%(funcName)s] %(message)s"
# modules whose records go to another logger of the tree
MODULE_ALIASES = {"deepspeed.utils.timer": TIMERS}
# frames of these modules are logging helpers: the record names the module that called them
HELPER_MODULES = frozenset({"logging", "deepspeed.utils.logging", "deepspeed.inference.v2.logging", __name__})
OP_BUILDER = "deepspeed.ops.op_builder"
# other modules whose ``print`` reports op builds
OP_PRINT_MODULES = ("deepspeed.comm.torch", "deepspeed.comm.ccl")
# a dotted logger name: no "=", "," or spaces (``deepspeed=info=debug`` is a malformed entry, not a name)
_LOGGER_NAME = re.compile(r"[^\s=,]+")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_WARNING_TAG = re.compile(r"^\s*(\x1b\[[0-9;]*m)?\s*\[WARNING\]\s*(\x1b\[[0-9;]*m)?\s*")

_lock = threading.RLock()
_patches = PatchSet(packages=("deepspeed",))
_active = False
_swapped: list[tuple[logging.Logger, type]] = []  # (logger, its class before install)
_injected: list[types.ModuleType] = []  # op-builder modules given a module-level ``print``
_root_state: Optional[tuple[int, bool, list[logging.Handler]]] = None
_handler: Optional[logging.Handler] = None
_layers: dict[str, dict[str, int]] = {"legacy": {}, "config": {}}
_touched: dict[str, int] = {}  # logger name -> its level before we set it
_ours: dict[str, int] = {}  # logger name -> the level we set last


# --- levels -------------------------------------------------------------------------------------
def parse_level(value: Any, where: str) -> int:
    """A level name (any case) or number; ``ValueError`` naming ``where`` and the valid names otherwise."""
    if isinstance(value, str) and value.strip().lower() in LEVELS:
        return LEVELS[value.strip().lower()]
    if isinstance(value, int) and not isinstance(value, bool) and value in LEVELS.values():
        return value
    raise ValueError(f"{where}: {value!r} is not a log level; valid levels are {', '.join(LEVELS)}")


@functools.lru_cache(maxsize=8)
def parse_env(text: str) -> dict[str, int]:
    """``DS_LOG_LEVELS``: ``name=level`` entries separated by commas (a bare level means ``deepspeed``).

    A bad entry is reported in one warning and skipped (later entries win over earlier ones).
    """
    levels: dict[str, int] = {}
    for entry in filter(None, (e.strip() for e in text.split(","))):
        name, _, value = entry.partition("=") if "=" in entry else ("", "", entry)
        name = name.strip() or ROOT
        try:
            if not _LOGGER_NAME.fullmatch(name):
                raise ValueError(f"{ENV_VAR} entry {entry!r}: {name!r} is not a logger name (one name=level per entry)")
            levels[name] = parse_level(value, f"{ENV_VAR} entry {entry!r}")
        except ValueError as err:
            logger.warning(
                "%s; the entry is ignored (example: %s=deepspeed=warning,deepspeed.runtime.zero=debug)", err, ENV_VAR
            )
    return levels


def levels_from_config(param_dict: Mapping[str, Any]) -> dict[str, int]:
    """The levels a DeepSpeed config's ``"logging"`` section sets (``ValueError`` if it is malformed)."""
    section = param_dict.get("logging")
    if section is None:
        return {}
    if not isinstance(section, Mapping):
        raise ValueError(
            f'config "logging" must be an object such as {{"level": "warning", "modules": '
            f'{{"deepspeed.runtime.engine": "info"}}}}, got {section!r}'
        )
    unknown = sorted(set(section) - {"level", "modules"})
    if unknown:
        raise ValueError(f'config "logging" has unknown keys {unknown}; valid keys are "level" and "modules"')
    levels = {}
    if section.get("level") is not None:
        levels[ROOT] = parse_level(section["level"], 'config "logging.level"')
    modules = section.get("modules")
    if modules is None:
        modules = {}
    if not isinstance(modules, Mapping):
        raise ValueError(
            f'config "logging.modules" must map logger names to levels, e.g. '
            f'{{"deepspeed.runtime.engine": "info"}}, got {modules!r}'
        )
    for name, value in modules.items():
        if not isinstance(name, str) or not name.strip():
            raise ValueError(
                f'config "logging.modules" has a key {name!r}; keys are logger names such as "deepspeed.runtime.engine"'
            )
        levels[name.strip()] = parse_level(value, f'config "logging.modules.{name}"')
    return levels


def timer_levels(param_dict: Mapping[str, Any]) -> dict[str, int]:
    """``deepspeed.timers`` on (INFO) when the config asks for timer output."""
    timers = param_dict.get("timers")
    throughput = timers.get("throughput") if isinstance(timers, Mapping) else None
    asked = bool(param_dict.get("wall_clock_breakdown")) or (
        isinstance(throughput, Mapping) and throughput.get("enabled") is True
    )
    return {TIMERS: logging.INFO} if asked else {}


def effective_levels() -> dict[str, int]:
    """Every level the tree sets now: default < legacy < config < ``DS_LOG_LEVELS``."""
    levels = {ROOT: DEFAULT_LEVEL}
    levels.update(_layers["legacy"])
    levels.update(_layers["config"])
    levels.update(parse_env(os.environ.get(ENV_VAR, "")))
    return levels


def apply_levels() -> None:
    """Set the loggers' levels to :func:`effective_levels`; those no longer named get their old level.

    A level only the default names (``deepspeed``: WARNING) does not override a level the user set
    on that logger with plain ``logging`` since.
    """
    with _lock:
        levels = effective_levels() if _active else {}
        explicit = set(_layers["legacy"]) | set(_layers["config"]) | set(parse_env(os.environ.get(ENV_VAR, "")))
        for name in list(_touched):
            if name not in levels:
                logging.getLogger(name).setLevel(_touched.pop(name))
                _ours.pop(name, None)
        for name, level in levels.items():
            target = logging.getLogger(name)
            if name not in explicit and name in _ours and target.level != _ours[name]:
                continue  # the user's own logging configuration
            _touched.setdefault(name, target.level)
            target.setLevel(level)
            _ours[name] = level


def set_legacy_level(level: int) -> None:
    """What ``--log_level`` / ``"log_level"`` / ``set_log_level_from_string`` set: DeepSpeed's logger
    and its handler, so the tree's root level."""
    _legacy.update(logger=level, handler=level)
    _sync_legacy()


def set_client_level(level: int) -> None:
    """``deepspeed.utils.logger.setLevel(level)`` (HF Trainer's ``log_level``, Lightning): in plain
    DeepSpeed it moves the logger, not its handler (the installed release's level, WARNING from
    0.17.6 on, unless :func:`set_legacy_level`), so what
    prints is bounded by both; the logger then reports ``level`` (:func:`reported_level`)."""
    _legacy["logger"] = level
    _sync_legacy()


def reported_level(target: logging.Logger) -> int:
    """What DeepSpeed's logger reports for a caller whose records go to ``target``: the level set on
    it the legacy way (as plain DeepSpeed reports it), unless the config / ``DS_LOG_LEVELS`` set levels."""
    if _legacy["logger"] is None:
        return target.getEffectiveLevel()
    explicit = set(_layers["config"]) | set(parse_env(os.environ.get(ENV_VAR, "")))
    name = target.name
    while name:  # a v1 level for this logger or one above it decides
        if name in explicit:
            return target.getEffectiveLevel()
        name = name.rpartition(".")[0]
    return _legacy["logger"]


def _sync_legacy(apply: bool = True) -> None:
    if _legacy["logger"] is None and _legacy["handler"] is None:
        _layers["legacy"].pop(ROOT, None)
    else:  # a record prints when both the logger and its handler let it through
        handler = _legacy["handler"] if _legacy["handler"] is not None else _handler_floor
        _layers["legacy"][ROOT] = max(_legacy["logger"] or DEFAULT_LEVEL, handler)
    if apply:
        apply_levels()


# the levels set the legacy way on DeepSpeed's logger object and on its stdout handler
_legacy: dict[str, Optional[int]] = {"logger": None, "handler": None}
# the level of the installed deepspeed's own handler (WARNING from 0.17.6 on, INFO before)
_handler_floor = DEFAULT_LEVEL


def configure_from_config(param_dict: Mapping[str, Any]) -> None:
    """Apply a DeepSpeed config's ``"logging"`` section, timers and legacy ``"log_level"``."""
    levels = {**timer_levels(param_dict), **levels_from_config(param_dict)}
    legacy = param_dict.get("log_level")
    if legacy is not None:
        _warn_config_log_level(legacy)
        level = parse_level(legacy, 'config "log_level"')
        _legacy.update(logger=level, handler=level)
        _sync_legacy(apply=False)
    _layers["config"] = levels
    apply_levels()


# --- routing ------------------------------------------------------------------------------------
def _caller(depth: int = 2) -> tuple[Optional[types.FrameType], str]:
    frame: Optional[types.FrameType] = sys._getframe(depth)
    while frame is not None:
        name = frame.f_globals.get("__name__", "")
        if name not in HELPER_MODULES:
            return frame, name
        frame = frame.f_back
    return None, ROOT


def logger_name_for(module: str) -> str:
    """The tree logger a module's records go to (modules outside deepspeed log to ``deepspeed``)."""
    if module == ROOT or module.startswith(ROOT + "."):
        return MODULE_ALIASES.get(module, module)
    return ROOT


def _emit(
    target: logging.Logger,
    level: int,
    msg: Any,
    args: Any,
    frame: Optional[types.FrameType],
    exc_info: Any = None,
    extra: Any = None,
    stack_info: bool = False,
) -> None:
    if frame is not None:
        fn, lno, func = frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name
    else:
        fn, lno, func = "(unknown file)", 0, "(unknown function)"
    if exc_info:
        if isinstance(exc_info, BaseException):
            exc_info = (type(exc_info), exc_info, exc_info.__traceback__)
        elif not isinstance(exc_info, tuple):
            exc_info = sys.exc_info()
    sinfo = None
    if stack_info and frame is not None:
        sinfo = "Stack (most recent call last):\n" + "".join(traceback.format_stack(frame)).rstrip("\n")
    target.handle(target.makeRecord(target.name, level, fn, lno, msg, args, exc_info, func, extra, sinfo))


def _target(module: str) -> logging.Logger:
    target = _by_module.get(module)
    if target is None:  # logging.getLogger takes a lock: remember the answer (loggers live forever)
        target = _by_module[module] = logging.getLogger(logger_name_for(module))
    return target


_by_module: dict[str, logging.Logger] = {}


class RoutingLogger(logging.Logger):
    """A shared logger object whose records go to the logger of the module that called it."""

    def isEnabledFor(self, level: int) -> bool:
        try:
            enabled = self._cache[-1 - level]  # the usual answer on a training step: no frame walk
        except KeyError:
            enabled = _tree_enables(self, level)
        if not enabled:
            return False
        frame = sys._getframe(1)
        while frame is not None:
            name = frame.f_globals.get("__name__", "")
            if name not in HELPER_MODULES:
                return _target(name).isEnabledFor(level)
            frame = frame.f_back
        return _target(ROOT).isEnabledFor(level)

    def getEffectiveLevel(self) -> int:
        return reported_level(_target(_caller()[1]))

    @property  # type: ignore[override]
    def level(self) -> int:
        return reported_level(_target(ROOT))

    @level.setter
    def level(self, value: int) -> None:
        self.__dict__["level"] = value  # the object's own level, back in force after uninstall

    def setLevel(self, level: Any) -> None:
        # a client (HF Trainer, Lightning) sets "the" DeepSpeed level: what plain DeepSpeed would show
        set_client_level(logging._checkLevel(level))  # type: ignore[attr-defined]

    def _log(self, level, msg, args, exc_info=None, extra=None, stack_info=False, stacklevel=1):  # noqa: D401
        frame, module = _caller()
        target = _target(module)
        if target.isEnabledFor(level):
            _emit(target, level, msg, args, frame, exc_info, extra, stack_info)


def _tree_enables(router: logging.Logger, level: int) -> bool:
    """False when no logger of the tree is enabled for ``level`` (so no caller's can be), kept in
    the router's ``_cache`` under ``-1 - level``: ``logging`` clears that dict on every level change
    and ``logging.disable``. True when one may be, or when the router is not a logger ``logging``
    clears (then nothing is kept and the full answer is computed per call)."""
    loggers = logging.Logger.manager.loggerDict
    if loggers.get(router.name) is not router:
        return True
    tree = [logging.getLogger(ROOT)] + [
        lg for name, lg in list(loggers.items()) if name.startswith(ROOT + ".") and isinstance(lg, logging.Logger)
    ]
    enabled = router._cache[-1 - level] = any(lg.isEnabledFor(level) for lg in tree)
    return enabled


def _route_object(obj: Any) -> None:
    if isinstance(obj, logging.Logger) and not isinstance(obj, RoutingLogger):
        _swapped.append((obj, obj.__class__))
        obj.__class__ = RoutingLogger


class _StdoutHandler(logging.StreamHandler):
    """Writes to the current ``sys.stdout`` (DeepSpeed's output went to stdout; redirection follows)."""

    def __init__(self) -> None:
        super().__init__(sys.stdout)
        self.setFormatter(logging.Formatter(FORMAT))

    @property  # type: ignore[override]
    def stream(self):
        return sys.stdout

    @stream.setter
    def stream(self, value) -> None:
        pass


# --- replacements for deepspeed functions -------------------------------------------------------
def _print_dist(message, ranks=None):
    """``print_dist`` as a record: ``deepspeed.timers`` (INFO) for timers, else the caller's logger (WARNING)."""
    final = sys.modules["deepspeed.utils.logging"].get_dist_msg(message, ranks)
    if final is None:
        return
    frame, module = _caller()
    name = logger_name_for(module)
    level = logging.INFO if name == TIMERS else logging.WARNING
    target = logging.getLogger(name)
    if target.isEnabledFor(level):
        _emit(target, level, "%s", (final,), frame)


def _set_log_level_from_string(log_level_str, custom_logger=None):
    """``set_log_level_from_string``: the DeepSpeed logger's level becomes the tree's root level."""
    module = sys.modules["deepspeed.utils.logging"]
    if custom_logger is not None and custom_logger is not module.logger:
        return _original(module, "set_log_level_from_string")(log_level_str, custom_logger)
    set_legacy_level(module.get_log_level_from_string(log_level_str))


def _ops_print(*values, sep=" ", end="\n", file=None, flush=False):
    """The op builders' ``print``: a record of the op-builder module's logger."""
    if file not in (None, sys.stdout):
        print(*values, sep=sep, end=end, file=file, flush=flush)
        return
    frame, module = _caller()
    text = sep.join(map(str, values)) if sep is not None else " ".join(map(str, values))
    level = logging.WARNING if _WARNING_TAG.match(text) else logging.INFO
    text = _ANSI.sub("", _WARNING_TAG.sub("", text, count=1)).rstrip("\n")
    target = logging.getLogger(logger_name_for(module))
    if target.isEnabledFor(level):
        _emit(target, level, "%s", (text,), frame)


def _op_builder_warning(self, msg):
    """``OpBuilder.warning``: keeps ``error_log`` and logs a WARNING record."""
    self.error_log = f"{msg}"
    frame, _ = _caller()
    target = logging.getLogger(logger_name_for(type(self).__module__))
    if target.isEnabledFor(logging.WARNING):
        _emit(target, logging.WARNING, "%s", (str(msg),), frame)


def _original(module: types.ModuleType, name: str) -> Any:
    for patch in _patches.patches:
        if patch.owner is module and patch.name == name:
            return patch.original
    return getattr(module, name)


def _warn_config_log_level(value: Any) -> None:
    from .deprecation import legacy_entry

    # one entry per value: its advice writes that value (the catalog's row keeps the general text)
    entry = legacy_entry(
        'ds_config "log_level"',
        f'"logging": {{"level": {value!r}}} in the config (or {ENV_VAR}=deepspeed={value})',
        'ds_config "log_level"',
        key=f'ds_config "log_level": {value!r}',
    )
    from .call_sites import SHIM, first_outside

    frame, _ = first_outside(sys._getframe(1), SHIM | {"deepspeed"})
    if frame is not None:
        entry.hit(frame)


# --- appliers -----------------------------------------------------------------------------------
def _route_logging_module(module: types.ModuleType) -> None:
    global _handler_floor
    levels = [h.level for h in getattr(module.logger, "handlers", ()) if isinstance(h, logging.StreamHandler)]
    _handler_floor = max(levels) if levels else logging.NOTSET  # what its setLevel(...) stays bounded by
    _route_object(module.logger)
    for name, replacement in (("print_dist", _print_dist), ("set_log_level_from_string", _set_log_level_from_string)):
        if hasattr(module, name):  # print_dist from deepspeed 0.18.0, set_log_level_from_string from 0.17.6
            _patches.replace(module, name, replacement)


def _route_engine(module: types.ModuleType) -> None:
    def configured(wrapped, instance, args, kwargs):
        result = wrapped(*args, **kwargs)
        param_dict = getattr(getattr(instance, "_config", None), "_param_dict", None)
        if isinstance(param_dict, Mapping):
            configure_from_config(param_dict)
        _inject_op_builder_print()  # op builders imported since
        return result

    cls = module.DeepSpeedEngine
    _patches.replace(
        cls, "_configure_with_arguments", wrapt.FunctionWrapper(cls.__dict__["_configure_with_arguments"], configured)
    )
    _patches.rebind_copies()


def _launcher_args(warn: bool):
    def parse_args(wrapped, instance, args, kwargs):
        namespace = wrapped(*args, **kwargs)
        argv = args[0] if args else kwargs.get("args")
        argv = sys.argv[1:] if argv is None else list(argv)
        explicit = any(a == "--log_level" or a.startswith("--log_level=") for a in argv)
        if explicit and warn:
            logging.getLogger("deepspeed.launcher").warning(
                "TODOV1: --log_level is deprecated; set %s=deepspeed=%s instead (per module: "
                "%s=deepspeed=warning,deepspeed.runtime.engine=info; ds-migrate --explain launcher-log_level)",
                ENV_VAR,
                namespace.log_level,
                ENV_VAR,
            )
        if not explicit:
            namespace.log_level = logging.getLevelName(DEFAULT_LEVEL).lower()
        level = "error" if getattr(namespace, "quiet", False) else namespace.log_level
        # forwarded to the training processes (they inherit the environment); the user's own
        # DS_LOG_LEVELS entries come later and win
        current = os.environ.get(ENV_VAR, "")
        os.environ[ENV_VAR] = f"{ROOT}={level}" + (f",{current}" if current else "")
        return namespace

    return parse_args


def _route_launcher(warn: bool):
    def applier(module: types.ModuleType) -> None:
        _patches.replace(module, "parse_args", wrapt.FunctionWrapper(module.parse_args, _launcher_args(warn)))
        _patches.rebind_copies()

    applier.__name__ = f"_route_launcher_{'runner' if warn else 'launch'}"
    return applier


def _route_op_builder(module: types.ModuleType) -> None:
    _patches.replace(module.OpBuilder, "warning", _op_builder_warning)
    _inject_op_builder_print()


def _inject_op_builder_print() -> None:
    for name, module in list(sys.modules.items()):
        if (
            (name == OP_BUILDER or name.startswith(OP_BUILDER + ".") or name in OP_PRINT_MODULES)
            and isinstance(module, types.ModuleType)
            and "print" not in vars(module)
            and module not in _injected
        ):
            module.print = _ops_print  # type: ignore[attr-defined]
            _injected.append(module)


def _route_inference_logger(module: types.ModuleType) -> None:
    def created(wrapped, instance, args, kwargs):
        result = wrapped(*args, **kwargs)
        with _lock:
            if _active:
                _route_object(result)
        return result

    if getattr(module, "inf_logger", None) is not None:
        _route_object(module.inf_logger)
    _patches.replace(module, "inference_logger", wrapt.FunctionWrapper(module.inference_logger, created))


def _route_deepspeed(module: types.ModuleType) -> None:
    _inject_op_builder_print()
    _patches.rebind_copies()


_APPLIERS = [
    ("deepspeed.utils.logging", _route_logging_module),
    ("deepspeed.ops.op_builder.builder", _route_op_builder),
    ("deepspeed.runtime.engine", _route_engine),
    ("deepspeed.inference.v2.logging", _route_inference_logger),
    ("deepspeed.launcher.runner", _route_launcher(warn=True)),
    ("deepspeed.launcher.launch", _route_launcher(warn=False)),
    ("deepspeed", _route_deepspeed),
]
_routes = ImportRoutes(_patches, _APPLIERS, _lock, lambda: _active)


# --- install / uninstall ------------------------------------------------------------------------
def install(on_error: Optional[Any] = None) -> None:
    """Make DeepSpeed's logging one tree (now for imported modules, at import for the rest).

    ``on_error(module, error)`` is called when a route fails inside a later import (a failure now
    undoes everything and raises).
    """
    global _active, _root_state, _handler
    with _lock:
        if _active:
            return
        _active = True
        _routes.on_error = on_error
        root = logging.getLogger(ROOT)
        _root_state = (root.level, root.propagate, list(root.handlers))
        if not root.handlers:  # the user's own handlers on "deepspeed" stay in charge
            _handler = _StdoutHandler()
            root.addHandler(_handler)
            root.propagate = False
        apply_levels()
        try:
            _routes.activate()
        except BaseException:
            uninstall()
            raise


def uninstall() -> None:
    """Restore DeepSpeed's logger objects, handlers, levels and functions."""
    global _active, _root_state, _handler, _handler_floor
    with _lock:
        if not _active:
            return
        _active = False
        _patches.restore()
        for obj, cls in reversed(_swapped):
            obj.__class__ = cls
        _swapped.clear()
        for module in _injected:
            if vars(module).get("print") is _ops_print:
                del module.print  # type: ignore[attr-defined]
        _injected.clear()
        _layers["legacy"].clear()
        _legacy.update(logger=None, handler=None)
        _handler_floor = DEFAULT_LEVEL
        _layers["config"].clear()
        apply_levels()  # back to the levels from before
        root = logging.getLogger(ROOT)
        if _handler is not None:
            root.removeHandler(_handler)
            _handler = None
        if _root_state is not None:
            root.setLevel(_root_state[0])
            root.propagate = _root_state[1]
            _root_state = None


def is_installed() -> bool:
    return _active
