"""Each engine runs with its own ``groups`` state, so several engines in one process don't leak.

Legacy ``deepspeed.utils.groups`` holds one process-global ``mpu`` / ``mesh_device``: the last
engine built wins, and a second model silently reads the first one's groups. With the shim, the
state of :mod:`compat.groups` (bound mesh, ``mpu``, ``mesh_device``) is captured when an engine is
built and re-activated around that engine's ``forward`` / ``backward`` / ``step`` /
``train_batch`` / ``eval_batch`` (and its rank getters and checkpoint save / load), then put back.

Outside every engine's step (wrong-grid protection):

- while the engines alive on this rank all have one layout, the legacy global getters serve it
  (so single-model scripts keep working unchanged);
- once engines with different layouts exist, there is no right answer: every legacy global getter
  (``groups.*``, ``groups.mpu``) raises :class:`WrongGridError` naming the engines and how to
  choose (:func:`use_engine`, or the engine's own ``engine.mesh_device``).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import gc
import inspect
import types
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional

ENGINE_STATE_ATTR = "_mesh_groups_state"
# the mesh of the engine ``deepspeed.initialize`` is building right now (set by compat.initialize)
PENDING_MESH: contextvars.ContextVar[Any] = contextvars.ContextVar("compat_pending_mesh", default=None)


def pending_mesh() -> Any:
    """The mesh of the engine being built by ``deepspeed.initialize`` right now, if any."""
    return PENDING_MESH.get()


class WrongGridError(RuntimeError):
    """A legacy global group getter was called where several engines' grids would fit."""


@dataclass(frozen=True)
class GroupsState:
    mesh: Any
    mpu: Any
    mesh_device: Any


def _groups():
    from . import groups

    if not _GROUPS:
        groups.engine_being_built[0] = pending_mesh  # an mpu written outside initialize serves (compat.groups)
        _GROUPS.append(groups)
    return groups


def capture() -> GroupsState:
    """The current :mod:`compat.groups` state."""
    groups = _groups()
    return GroupsState(groups.bound_mesh(), groups.mpu, groups.mesh_device)


def activate(state: GroupsState) -> None:
    groups = _groups()
    groups.bind_mesh(state.mesh)
    groups.mpu = state.mpu
    groups.mesh_device = state.mesh_device
    groups._set_wrong_grid(state.mpu if isinstance(state.mpu, AmbiguousGrid) else None)


_GROUPS: list = []  # [compat.groups] once imported
_MESH_CORE: list = []  # [DeepSpeedDeviceMesh, enter_default_mesh, leave_default_mesh] once imported
_scope_meshes: list = []  # meshes of the engines whose entry points are running, innermost last


def _enter(state: Optional[GroupsState], scope: bool) -> tuple:
    """Make ``state`` current (the groups state, and mesh_core's default mesh when it is a mesh, so
    migrated code's ``current_mesh()`` reads what the legacy getters serve); with ``scope``, also the
    engine scope :func:`scope_mesh` reads. Returns what :func:`_leave` restores.

    No generator and no import after the first call: an engine's entry points run it on every
    forward, backward and step."""
    if state is None:
        if scope:
            _scope_meshes.append(None)
        return None, None, scope
    groups = _GROUPS[0] if _GROUPS else _groups()
    mesh = state.mesh
    previous = None
    if not (groups.bound_mesh() is mesh and groups.mpu is state.mpu and groups.mesh_device is state.mesh_device):
        previous = capture()
        try:
            activate(state)
        except BaseException:
            activate(previous)
            raise
    if not _MESH_CORE:
        from mesh_core import DeepSpeedDeviceMesh
        from mesh_core.runtime_hooks import enter_default_mesh, leave_default_mesh

        _MESH_CORE.extend((DeepSpeedDeviceMesh, enter_default_mesh, leave_default_mesh))
    # the default the user had comes back exactly on leaving (a context token, not a copy)
    token = _MESH_CORE[1](mesh) if isinstance(mesh, _MESH_CORE[0]) else None
    if scope:
        if previous is None and token is None and not _scope_meshes and _spans_world(mesh):
            groups.STATE_MARK[0] = state  # nothing to change: the next entry point may skip all this
        _scope_meshes.append(mesh)
    return previous, token, scope


def _spans_world(mesh: Any) -> bool:
    """``mesh`` (an engine's mesh, or None) is over every rank of the world: its scope changes
    nothing a world group would not do (:func:`barrier_wrapper`, :func:`same_ints_wrapper`)."""
    spec = getattr(mesh, "spec", None)
    return spec is not None and spec.size == spec.world_size


def _leave(entered: tuple) -> None:
    """Undo one :func:`_enter`, innermost first."""
    previous, token, scope = entered
    if scope:
        _scope_meshes.pop()
    if token is not None:
        _MESH_CORE[2](token)
    if previous is not None:
        activate(previous)


@contextlib.contextmanager
def groups_state(state: Optional[GroupsState]) -> Iterator[None]:
    """Make ``state`` current inside the block (no-op for None); restore the previous one after."""
    entered = _enter(state, scope=False)
    try:
        yield
    finally:
        _leave(entered)


def scoped_entry_point(original: Callable[..., Any], label: Optional[str] = None) -> Callable[..., Any]:
    """``original``, an engine method (``forward``, ``step``, a rank getter, ...), run with its
    engine's groups state and as the engine in scope (``label``, e.g. ``DeepSpeedEngine.step``,
    names its code in profiles and tracebacks).

    A plain function with ``original``'s own parameters rather than a ``wrapt`` wrapper or an
    ``(*args, **kwargs)`` one: it runs on every forward, backward and step, a wrapt method wrapper
    costs about four times as much per call, and packing the arguments into a new tuple and dict
    costs about as much as the check. While the engine's state is current and its mesh spans the
    world and is this context's default, a call only checks that: a launch-bound step's time goes to
    cache misses more than to instructions, so every object a per-step check touches counts
    (docs/benchmarks.md)."""
    from mesh_core.runtime_hooks import DEFAULT_MESH

    namespace = {
        "original": original,
        "marked": _groups().STATE_MARK,
        "default_mesh": DEFAULT_MESH,
        "enter": _enter,
        "leave": _leave,
    }
    copied = _forwarding(original, reserved=set(namespace) | {"self", "state", "entered"})
    parameters, call = copied or ("*args, **kwargs", "*args, **kwargs")
    # fast path: the last entry found nothing to change, and neither the groups state (which clears the
    # mark on any change) nor this context's default mesh changed since
    source = (
        f"def entry_point(self, {parameters}):\n"
        f"    state = self.__dict__.get({ENGINE_STATE_ATTR!r})\n"
        f"    if state is marked[0] and state is not None and default_mesh.get() is state.mesh:\n"
        f"        return original(self, {call})\n"
        f"    entered = enter(state, True)\n"
        f"    try:\n"
        f"        return original(self, {call})\n"
        f"    finally:\n"
        f"        leave(entered)\n"
    )
    exec(compile(source, f"<scoped {label or getattr(original, '__qualname__', original)}>", "exec"), namespace)
    entry_point = namespace["entry_point"]
    if copied:
        entry_point.__defaults__ = original.__defaults__
        entry_point.__kwdefaults__ = dict(original.__kwdefaults__ or {}) or None
    return functools.wraps(original)(entry_point)


def _forwarding(method: Callable[..., Any], reserved: set) -> Optional[tuple[str, str]]:
    """``method``'s parameters after ``self`` as a ``def`` writes them (defaults left out: the
    caller copies ``__defaults__``), and the call that passes them on unchanged; None when the
    signature can't be copied (not a plain function, a name the entry point uses)."""
    if not isinstance(method, types.FunctionType) or method.__code__.co_argcount < 1:
        return None
    code = method.__code__
    flags = code.co_flags
    names = code.co_varnames
    positional = list(names[1 : code.co_argcount])
    keyword_only = list(names[code.co_argcount : code.co_argcount + code.co_kwonlyargcount])
    index = code.co_argcount + code.co_kwonlyargcount
    var_args = names[index] if flags & inspect.CO_VARARGS else None
    var_kwargs = names[index + bool(var_args)] if flags & inspect.CO_VARKEYWORDS else None
    every = [*positional, *keyword_only, *filter(None, (var_args, var_kwargs))]
    if reserved & set(every):
        return None
    params = [*positional]
    if code.co_posonlyargcount > 1:  # positional-only parameters after ``self``
        params.insert(code.co_posonlyargcount - 1, "/")
    if var_args:
        params.append(f"*{var_args}")
    elif keyword_only:
        params.append("*")
    params += keyword_only
    if var_kwargs:
        params.append(f"**{var_kwargs}")
    call = [
        *positional,
        *(f"*{var_args}",) * bool(var_args),
        *(f"{k}={k}" for k in keyword_only),
        *(f"**{var_kwargs}",) * bool(var_kwargs),
    ]
    return ", ".join(params), ", ".join(call)


def scope_mesh() -> Any:
    """The mesh of the engine being built or stepped right now (None outside any)."""
    pending = pending_mesh()
    if pending is not None:
        return pending
    return _scope_meshes[-1] if _scope_meshes else None


def barrier_wrapper(wrapped, instance, args, kwargs):  # noqa: ARG001 (wrapt's signature)
    """wrapt wrapper for ``deepspeed.comm.barrier``: a world barrier issued by a sub-world engine
    (ZeRO-3's set-up, checkpointing) waits for that engine's ranks only; the ranks outside never
    enter the engine, so a world barrier there would hang."""
    group = kwargs.get("group", args[0] if args else None)
    mesh = scope_mesh() if group is None else None
    if mesh is not None and not _spans_world(mesh):
        args, kwargs = args[1:], {**kwargs, "group": mesh.get_group(mesh.spec.names)}
    return wrapped(*args, **kwargs)


@contextlib.contextmanager
def use_engine(engine: Any) -> Iterator[Any]:
    """Serve the legacy global getters (``groups.*``, ``groups.mpu``) from ``engine`` inside the block."""
    state = getattr(engine, ENGINE_STATE_ATTR, None)
    if state is None:
        raise WrongGridError(
            f"{type(engine).__name__} was not built by deepspeed.initialize under the shim; it has no groups state"
        )
    with groups_state(state):
        yield engine


# --- the engines alive on this rank ---------------------------------------------------------------
_engines: list["weakref.ref[Any]"] = []


def _label(engine: Any) -> str:
    module = getattr(engine, "module", None)
    mesh = getattr(engine, "mesh_device", None)
    spec = getattr(mesh, "spec", None)
    where = spec.describe() if spec is not None else repr(mesh)
    return f"{type(module).__name__ if module is not None else type(engine).__name__} engine on {where}"


def live_engines() -> list[Any]:
    """Engines built under the shim on this rank and not yet destroyed or collected."""
    alive = []
    for ref in list(_engines):
        engine = ref()
        if engine is None or getattr(engine, "_mesh_destroyed", False):
            _engines.remove(ref)
        else:
            alive.append(engine)
    return alive


def _layout_key(engine: Any) -> Any:
    spec = getattr(getattr(engine, "mesh_device", None), "spec", None)
    if spec is None:
        return id(engine)
    return (spec.names, spec.sizes, tuple(spec.ranks), spec.ep, spec.data_before_expert)


def register(engine: Any) -> None:
    """Record a newly built engine and make the out-of-scope state right for the engines alive now."""
    _engines.append(weakref.ref(engine))
    settle()


def unregister(engine: Any) -> None:
    """Forget a destroyed engine (``engine.destroy()``)."""
    engine._mesh_destroyed = True
    settle()


def settle() -> None:
    """Activate the state served outside every engine's step: the one layout of the engines alive,
    or an :class:`AmbiguousGrid` when they have several."""
    engines = live_engines()
    if len({_layout_key(e) for e in engines}) > 1:
        gc.collect()  # engines dropped by the user but still held in reference cycles
        engines = live_engines()
    layouts = {_layout_key(e) for e in engines}
    if not engines:
        if isinstance(_groups().mpu, AmbiguousGrid):
            activate(GroupsState(None, None, None))
        return
    if len(layouts) == 1:
        activate(getattr(engines[-1], ENGINE_STATE_ATTR))
    else:
        activate(GroupsState(None, AmbiguousGrid([_label(e) for e in engines]), None))


class AmbiguousGrid:
    """Stands in for ``groups.mpu`` while engines with different layouts exist and none is in scope:
    any use raises :class:`WrongGridError` naming the engines."""

    def __init__(self, engines: list[str]) -> None:
        self.engines = engines

    def error(self, what: str) -> WrongGridError:
        listed = "; ".join(f"[{i}] {label}" for i, label in enumerate(self.engines))
        return WrongGridError(
            f"{what} was called outside any engine's step while {len(self.engines)} engines with different "
            f"layouts exist on this rank ({listed}), so there is no single process-group grid to serve. "
            "Choose one: run it inside `with compat.use_engine(engine): ...` (the engine's forward / backward / "
            "step do this already), or ask that engine's mesh directly, e.g. engine.mesh_device.get_group('tp')"
        )

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        raise self.error(f"deepspeed.utils.groups.mpu.{name}")

    def __bool__(self) -> bool:
        raise self.error("deepspeed.utils.groups.mpu")

    def __repr__(self) -> str:
        return f"AmbiguousGrid({self.engines})"


def same_ints_wrapper(wrapped, instance, args, kwargs):  # noqa: ARG001 (wrapt's signature)
    """wrapt wrapper for ZeRO-3's ``assert_ints_same_as_other_ranks`` (a world broadcast from rank
    0): inside a sub-world engine, compare with the engine's first rank over the engine's group."""
    mesh = scope_mesh()
    if mesh is None or _spans_world(mesh):
        return wrapped(*args, **kwargs)
    import torch.distributed as dist

    ints = list(kwargs.get("ints", args[0] if args else []))
    group, first = mesh.get_group(mesh.spec.names), min(mesh.spec.ranks)
    objects = [ints if dist.get_rank() == first else None]
    dist.broadcast_object_list(objects, src=first, group=group)
    if objects[0] != ints:
        raise RuntimeError(
            f"Detected a disagreement on list contents between rank{first} (the first rank of "
            f"{mesh.spec.describe()}) and rank{dist.get_rank()}:\n rank{first}: {objects[0]}\n "
            f"rank{dist.get_rank()}: {ints}"
        )
