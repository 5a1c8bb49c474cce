"""The torch releases ds-mesh supports, every private torch name it uses, and the device of a mesh.

Supported: torch **2.6.0 through 2.15.0** (:data:`SUPPORTED`, the one place that declares it:
pyproject's ``torch`` extra, the README, ``mesh doctor`` and CI follow it). Outside the range
:func:`check_torch` raises :class:`UnsupportedTorchError` naming the installed release and the range;
``DeepSpeedDeviceMesh`` and ``compat.install()`` call it before anything else. torch 2.5 and older
lack ``torch.accelerator`` and ``distributed_c10d._get_object_coll_device``; releases newer than
2.15.0 have not been checked, so they are refused rather than guessed (their private naming changed
in 2.14 already).

Private torch names, one function each, with what each supported release does (read from the
sources of 2.6.0, 2.8.0, 2.10.0, 2.11.0, 2.13.0, 2.14.1 and 2.15.0):

================================================ =====================================================
name                                             2.6 … 2.15.0
================================================ =====================================================
``c10d.GroupName``                               absent before 2.10 (a name is a plain ``str``);
                                                 ``NewType(str)`` from 2.10 → :func:`group_name`
``c10d._process_group_name(ranks, hashed)``      same signature everywhere; hashed names are salted
                                                 with ``len(_world.pg_names)`` up to 2.13 and with
                                                 ``_world.group_count`` (which it then increments)
                                                 from 2.14 → :func:`process_group_namer`,
                                                 :func:`set_process_group_namer`
``c10d._get_default_group()``                    present → :func:`default_group`
``c10d._get_default_store()``                    present → :func:`default_store`
``c10d._new_group_with_tag``                     what ``new_group`` calls (``+ sort_ranks`` from 2.13)
                                                 → :data:`NEW_GROUP_ENTRY` (wrapped by compat's trace)
``ProcessGroup.bound_device_id``                 the device ``init_process_group(device_id=)`` bound,
                                                 else None; a pybind property that torch's Python
                                                 code reads (``_new_group_with_tag``,
                                                 ``_new_process_group_helper``: split from the world
                                                 if set) → :func:`bound_device`,
                                                 :func:`unbound_default_group` (hidden per thread)
``new_group(device_id=)``                        binds the group and connects it at creation
                                                 (``eager_connect_single_device``) when its backend
                                                 ``supports_splitting``
``c10d._use_torchcomms_enabled()``               TorchComms mode (2.13: member-only ``new_group``
                                                 raises; 2.14: member-only ``new_comm``; absent
                                                 before) → :func:`torchcomms_enabled`,
                                                 :func:`check_settings`
``ProcessGroupNCCL2``, ``ProcessGroupNCCLLazy``  the backend classes of ``"nccl2"`` / ``"nccl-lazy"``
                                                 (2.14: ``nccl`` is nccl2 with
                                                 ``TORCH_DIST_USE_NCCL2=1``; 2.15: by default,
                                                 ``TORCH_DIST_USE_NCCL2=0`` or ``"nccl-legacy"`` for
                                                 ``ProcessGroupNCCL``; absent before 2.14) →
                                                 :func:`nccl_engine`, refused by :func:`check_settings`
``ProcessGroup._get_backend(device)``            present; raises RuntimeError for an unregistered
                                                 device type → :func:`backend_supports_splitting`,
                                                 :func:`backend_timeout`
``Backend.supports_splitting``                   NCCL True; gloo True from 2.13; fake False
``Backend.options._timeout``                     present (NCCL/gloo options) → :func:`backend_timeout`
``dist.split_group`` (public, "experimental")    names through ``_process_group_name``: members
                                                 only, counter names, before 2.10; every rank,
                                                 hashed, from 2.10 (2.14 advances the counter);
                                                 returns None to a rank in no split up to 2.13,
                                                 ``GroupMember.NON_GROUP_MEMBER`` (-100) from 2.14;
                                                 before 2.10 hands the *parent's* options object to the
                                                 child and mutates it (and 2.6's NCCL options cannot be
                                                 deep-copied) → :func:`split_group`, :func:`own_options`
``c10d._get_object_coll_device(group)``          returns a ``str`` ('cuda', 'cpu') in every release;
                                                 no longer used: :func:`default_device_type` decides
``torch._utils._flatten_dense_tensors``,         present → :func:`flatten_dense_tensors`,
``_unflatten_dense_tensors``                     :func:`unflatten_dense_tensors`
``torch._foreach_copy_``                         present → :func:`foreach_copy_`
``torch.accelerator.current_device_index``       ``current_device_idx`` in 2.6, both names from 2.7
                                                 → :func:`current_device_index`
================================================ =====================================================

The device of a mesh (:func:`default_device_type`, :func:`default_device`): the default group's
bound device; else the device the default group's backend serves, as ``get_backend_config()``
reports it (``"cuda:nccl"`` → cuda; a host backend — gloo, fake, mpi — → cpu); else the accelerator;
never ``"cpu"`` on a world whose backend runs on an accelerator. On an unbound accelerator world the
index is the rank's own (:func:`own_device_index`: ``LOCAL_RANK`` until the process selects a device),
not the current device every process starts on.

Also exported: :data:`OLDEST` / :data:`NEWEST` (the range's ends; tests/compat/test_releases.py),
:data:`SPLIT_GROUP_ENTRY` (wrapped by compat.group_trace, as :data:`NEW_GROUP_ENTRY` is),
:class:`UnsupportedSettingError` (what :func:`check_settings` raises), :func:`is_non_member` (a
creation's "not in the group" answer, mesh_core.registry) and :func:`torch_release` (the installed
release, tests/gpu). tests/test_structure.py holds the count of this face's names.
"""

from __future__ import annotations

import contextlib
import copy
import os
import re
import threading
from datetime import timedelta
from typing import Any, Callable, Iterator, Optional, Sequence

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

__all__ = [
    "NEWEST",
    "NEW_GROUP_ENTRY",
    "OLDEST",
    "SPLIT_GROUP_ENTRY",
    "SUPPORTED",
    "UnsupportedSettingError",
    "UnsupportedTorchError",
    "backend_supports_splitting",
    "backend_timeout",
    "bound_device",
    "check_settings",
    "check_torch",
    "current_device_index",
    "default_device",
    "default_device_type",
    "default_group",
    "default_store",
    "flatten_dense_tensors",
    "group_name",
    "is_non_member",
    "nccl_engine",
    "own_device_index",
    "split_group",
    "torch_release",
    "torchcomms_enabled",
    "unbound_default_group",
    "unflatten_dense_tensors",
]

OLDEST = (2, 6, 0)
NEWEST = (2, 15, 0)
SUPPORTED = ">=2.6.0,<=2.15.0"  # the same constraint as pyproject.toml's "torch" extra
_RELEASE = re.compile(r"^\s*(\d+)\.(\d+)(?:\.(\d+))?")

#: backends whose collectives run on host memory: a world of these has device type "cpu"
HOST_BACKENDS = frozenset({"gloo", "fake", "mpi"})

#: the private c10d function every ``new_group`` goes through (compat's group trace wraps it)
NEW_GROUP_ENTRY = "_new_group_with_tag"
#: torch's collective splitter (public, experimental)
SPLIT_GROUP_ENTRY = "split_group"


class UnsupportedTorchError(RuntimeError):
    """The installed torch release is outside the range ds-mesh supports."""


# --- the supported range --------------------------------------------------------------------------
def torch_release(version: Optional[str] = None) -> Optional[tuple[int, int, int]]:
    """``(major, minor, patch)`` of ``version`` (default: the installed torch; ``2.8.0+cu128`` →
    ``(2, 8, 0)``, a local or pre-release tag is ignored); None if unreadable."""
    match = _RELEASE.match(str(torch.__version__ if version is None else version))
    if match is None:
        return None
    return int(match.group(1)), int(match.group(2)), int(match.group(3) or 0)


def is_supported(version: Optional[str] = None) -> bool:
    parsed = torch_release(version)
    return parsed is not None and OLDEST <= parsed <= NEWEST


def check_torch(version: Optional[str] = None) -> str:
    """The installed torch version when ds-mesh supports it; :class:`UnsupportedTorchError` otherwise.
    For the installed torch (``version`` None) its distributed settings too (:func:`check_settings`)."""
    installed = version is None
    version = str(torch.__version__ if version is None else version)
    if is_supported(version):
        if installed:
            check_settings()
        return version
    oldest, newest = (".".join(map(str, r)) for r in (OLDEST, NEWEST))
    raise UnsupportedTorchError(
        f"ds-mesh supports torch >={oldest},<={newest} ({oldest} through {newest}); the installed torch is "
        f"{version}. Install a supported release (e.g. pip install torch=={newest})."
    )


class UnsupportedSettingError(UnsupportedTorchError):
    """A torch.distributed setting under which ds-mesh cannot create its groups safely."""


#: NCCL engines of torch >= 2.14 that ds-mesh refuses (by their backend class, :func:`nccl_engine`), and why
REFUSED_BACKENDS = {
    "nccl2": "its communicators come from the torchcomms engine (ProcessGroupNCCL2), which binds every world to "
    "a device and on which ds-mesh's creation of a group among its members only (no split of the world) is not "
    "verified",
    "nccl-lazy": "it creates each point-to-point pair's communicator lazily, at the pair's first message "
    "(a communicator init that can deadlock against NCCL work in flight)",
}
#: the backend class (``distributed_c10d``'s name) of each refused engine; absent before torch 2.14
_ENGINE_CLASSES = {"nccl2": "ProcessGroupNCCL2", "nccl-lazy": "ProcessGroupNCCLLazy"}


def nccl_engine(group: Optional[dist.ProcessGroup] = None) -> Optional[str]:
    """``"nccl2"`` or ``"nccl-lazy"`` when ``group``'s (default: the world's) backend for an accelerator is
    that engine's class, whatever name it was asked by (``"nccl"`` on 2.15 by default and on 2.14 with
    ``TORCH_DIST_USE_NCCL2=1``, ``"nccl2"``, ``"nccl-lazy"``); None otherwise (stock ``ProcessGroupNCCL``,
    gloo, or a torch without these engines)."""
    group = default_group() if group is None else group
    for device in sorted(set(backend_devices(group)) - {"cpu"}):
        try:
            backend = _backend(group, torch.device(device))
        except (RuntimeError, ValueError):
            continue
        for engine, name in _ENGINE_CLASSES.items():
            engine_class = getattr(c10d, name, None)
            if isinstance(engine_class, type) and isinstance(backend, engine_class):
                return engine
    return None


def torchcomms_enabled() -> bool:
    """Whether torch routes process groups through TorchComms (``TORCH_DISTRIBUTED_USE_TORCHCOMMS=1`` /
    ``torch.distributed.config.use_torchcomms``, with torchcomms installed); False where torch has no such mode."""
    probe = getattr(c10d, "_use_torchcomms_enabled", None)
    return bool(probe()) if probe is not None else False


def check_settings() -> None:
    """Refuse, with one :class:`UnsupportedSettingError` naming the setting and the way back, the
    torch.distributed settings under which a group cannot be created among its members only
    (docs/nccl.md):

    - TorchComms before torch 2.14 (``new_group(use_local_synchronization=True)`` raises there);
    - a world whose NCCL backend is the ``nccl2`` or ``nccl-lazy`` engine (:func:`nccl_engine`: by the
      backend object, so torch 2.15's default ``nccl`` and 2.14's ``TORCH_DIST_USE_NCCL2=1`` are the
      same case). Before the world exists nothing is refused: a gloo job is not concerned.
    """
    release = torch_release()
    if torchcomms_enabled() and release is not None and release < (2, 14, 0):
        raise UnsupportedSettingError(
            f"TORCH_DISTRIBUTED_USE_TORCHCOMMS=1 (torch.distributed.config.use_torchcomms) is not supported by "
            f"ds-mesh on torch {torch.__version__}: there new_group(use_local_synchronization=True) raises "
            "NotImplementedError, and ds-mesh creates groups among their members only. Unset "
            "TORCH_DISTRIBUTED_USE_TORCHCOMMS, or use torch 2.14.1."
        )
    if not (dist.is_available() and dist.is_initialized()):
        return
    engine = nccl_engine()
    if engine == "nccl2":
        way_back = (
            "set TORCH_DIST_USE_NCCL2=0 before the job starts (torch >= 2.15: nccl is nccl2 by default) "
            "or init_process_group(backend='nccl-legacy')"
            if release is not None and release >= (2, 15, 0)
            else "unset TORCH_DIST_USE_NCCL2 (or set it to 0) and use backend='nccl'"
        )
        raise UnsupportedSettingError(
            f"the world's NCCL backend is nccl2 (ProcessGroupNCCL2; TORCH_DIST_USE_NCCL2="
            f"{os.environ.get('TORCH_DIST_USE_NCCL2', '<unset>')}, torch {torch.__version__}), which ds-mesh does not "
            f"support: {REFUSED_BACKENDS['nccl2']}. To run on torch's stock ProcessGroupNCCL, {way_back}."
        )
    if engine == "nccl-lazy":
        raise UnsupportedSettingError(
            f"the 'nccl-lazy' backend (init_process_group(backend='nccl-lazy')) is not supported by ds-mesh: "
            f"{REFUSED_BACKENDS['nccl-lazy']}. Use backend='nccl' (with TORCH_DIST_USE_NCCL2=0 on torch >= 2.15)."
        )


# --- names ----------------------------------------------------------------------------------------
def group_name(name: str) -> str:
    """``name`` as torch's process-group name type (``c10d.GroupName`` from 2.10, ``str`` before)."""
    return getattr(c10d, "GroupName", str)(name)


def process_group_namer() -> Callable[..., str]:
    """torch's current ``distributed_c10d._process_group_name`` (what names every new group)."""
    return c10d._process_group_name  # type: ignore[attr-defined, unused-ignore]


def set_process_group_namer(namer: Callable[..., str]) -> None:
    """Replace ``distributed_c10d._process_group_name`` (looked up by ``_new_group_with_tag`` per call)."""
    c10d._process_group_name = namer  # type: ignore[attr-defined, assignment, unused-ignore]


# --- the default group ----------------------------------------------------------------------------
def default_group() -> dist.ProcessGroup:
    """The default process group (the "world")."""
    return c10d._get_default_group()


def default_store() -> c10d.Store:
    """The default group's store."""
    return c10d._get_default_store()


# The default group's bound device, hidden from one thread at a time: ``ProcessGroup.bound_device_id``
# is a pybind property read by torch's Python code (``_new_group_with_tag``, ``_new_process_group_helper``);
# while a thread creates a member-only group the property is replaced by a descriptor that answers
# None to that thread, for the default group only, and the real value to every other reader.
_REAL_BOUND_DEVICE = dist.ProcessGroup.__dict__.get("bound_device_id")
_HIDING_LOCK = threading.Lock()
_hiding = threading.local()  # .world: the default group this thread creates a member-only group on
_hiders = 0


class _ThreadBoundDevice:
    """``ProcessGroup.bound_device_id`` as torch's own property, except None for the default group
    in a thread inside :func:`unbound_default_group`."""

    def __get__(self, group: Any, owner: Any = None) -> Any:
        if group is None:
            return self
        if getattr(_hiding, "world", None) is group:
            return None
        return _REAL_BOUND_DEVICE.__get__(group, owner)  # type: ignore[union-attr]

    def __set__(self, group: Any, value: Any) -> None:
        _REAL_BOUND_DEVICE.__set__(group, value)  # type: ignore[union-attr]


_THREAD_VIEW = _ThreadBoundDevice()


def _real_bound_device(group: dist.ProcessGroup) -> Optional[torch.device]:
    if _REAL_BOUND_DEVICE is not None and isinstance(group, dist.ProcessGroup):
        device: Optional[torch.device] = _REAL_BOUND_DEVICE.__get__(group, type(group))
        return device
    return getattr(group, "bound_device_id", None)


def bound_device(group: Optional[dist.ProcessGroup] = None) -> Optional[torch.device]:
    """The device ``group`` (default: the world) is bound to (``init_process_group(device_id=)``), or
    None; inside :func:`unbound_default_group` still the device the world is bound to."""
    return _real_bound_device(default_group() if group is None else group)


@contextlib.contextmanager
def unbound_default_group() -> Iterator[Optional[torch.device]]:
    """Inside the block the default group reports no bound device *to this thread*, so a
    ``new_group`` it makes is a fresh communicator among the members instead of a split of the
    world's (which every world rank must join). Nothing changes for other threads: they keep
    seeing the bound device (and so keep splitting as their peers do). Yields the bound device.

    torch's property is swapped for a thread-aware one while any thread is inside such a block
    and put back (in ``finally``) when the last one leaves."""
    global _hiders
    world = default_group()
    saved = _real_bound_device(world)
    if getattr(_hiding, "world", None) is not None:
        raise RuntimeError("nested unbound_default_group in one thread")
    if saved is None or _REAL_BOUND_DEVICE is None:  # nothing to hide
        yield saved
        return
    with _HIDING_LOCK:
        if _hiders == 0:
            dist.ProcessGroup.bound_device_id = _THREAD_VIEW  # type: ignore[method-assign, assignment, misc, unused-ignore]
        _hiders += 1
    _hiding.world = world
    try:
        yield saved
    finally:
        _hiding.world = None
        with _HIDING_LOCK:
            _hiders -= 1
            if _hiders == 0:
                dist.ProcessGroup.bound_device_id = _REAL_BOUND_DEVICE  # type: ignore[method-assign, misc, unused-ignore]


def _backend(group: dist.ProcessGroup, device: torch.device) -> Any:
    return group._get_backend(device)  # raises RuntimeError for a device type with no backend


def backend_supports_splitting(group: dist.ProcessGroup, device: torch.device) -> bool:
    """Whether ``group``'s backend for ``device`` can ``split_group`` (False when there is none)."""
    try:
        return bool(getattr(_backend(group, device), "supports_splitting", False))
    except RuntimeError:
        return False


def backend_timeout(group: dist.ProcessGroup, device: torch.device) -> timedelta:
    """The timeout of ``group``'s backend for ``device`` (AttributeError/RuntimeError where it has none)."""
    timeout: timedelta = _backend(group, device).options._timeout
    return timeout


def backend_initialised(group: dist.ProcessGroup, device: torch.device) -> Optional[bool]:
    """Whether ``group``'s backend for ``device`` has created its communicators (NCCL's
    ``_is_initialized()``: every communicator of the group counts); None where it cannot tell."""
    try:
        probe = getattr(_backend(group, device), "_is_initialized", None)
    except RuntimeError:
        return None
    return None if probe is None else bool(probe())


def accelerator_available() -> bool:
    """Whether torch sees an accelerator (``torch.accelerator``, present in every supported release)."""
    return bool(torch.accelerator.is_available())


def accelerator_type() -> Optional[str]:
    """The accelerator's device type ("cuda", "xpu", …) when one is available, else None."""
    if not accelerator_available():
        return None
    current = torch.accelerator.current_accelerator()
    return None if current is None else current.type


# --- the device of a mesh -------------------------------------------------------------------------
def backend_devices(group: Optional[dist.ProcessGroup] = None) -> dict[str, str]:
    """``{device type: backend}`` of ``group`` as torch reports it (``get_backend_config``)."""
    config = str(dist.get_backend_config(group))
    pairs: dict[str, str] = {}
    for part in config.split(","):
        device, sep, backend = part.strip().partition(":")
        if sep:
            pairs[device.strip()] = backend.strip().lower()
        elif device:  # a bare backend name: it serves its home device
            pairs[home_device_type(device.strip().lower())] = device.strip().lower()
    return pairs


def home_device_type(backend: str) -> str:
    """The device type a backend's collectives serve: cpu for a host backend (gloo, fake, mpi), the
    device torch maps to it otherwise (cuda for nccl), cpu when torch maps it to none."""
    if backend in HOST_BACKENDS:
        return "cpu"
    for device, name in dist.Backend.default_device_backend_map.items():
        if name == backend and device != "cpu":
            return device
    return "cpu"


def default_device_type() -> str:
    """The device type of meshes built on the default group: its bound device's type; else the
    device its backend serves (cuda for NCCL, cpu for gloo/fake/mpi); else the accelerator's; else cpu."""
    if not dist.is_available() or not dist.is_initialized():
        return accelerator_type() or "cpu"
    bound = bound_device()
    if bound is not None:
        return bound.type
    devices = backend_devices()
    served = [device for device, backend in devices.items() if device != "cpu" and backend not in HOST_BACKENDS]
    if served:
        accelerator = accelerator_type()
        return accelerator if accelerator in served else served[0]
    if devices:
        return "cpu"
    return accelerator_type() or "cpu"


def default_device() -> torch.device:
    """The device the default group's collectives run on: the bound device; else, on an unbound
    accelerator world, :func:`own_device_index` of :func:`default_device_type`; cpu for a host world."""
    bound = bound_device() if dist.is_available() and dist.is_initialized() else None
    if bound is not None:
        return bound
    kind = default_device_type()
    if kind == "cpu":
        return torch.device("cpu")
    if accelerator_type() == kind:
        return torch.device(kind, own_device_index())
    return torch.device(kind)


def current_device_index() -> int:
    """The accelerator's current device index (``torch.accelerator.current_device_index``, which torch
    2.6 names ``current_device_idx``)."""
    query = getattr(torch.accelerator, "current_device_index", None) or torch.accelerator.current_device_idx
    return int(query())


def launcher_local_rank() -> Optional[int]:
    """``LOCAL_RANK`` as launchers set it (torchrun, the deepspeed launcher, ``deepspeed.init_distributed``),
    or None when unset or not an integer."""
    try:
        return int(os.environ["LOCAL_RANK"])
    except (KeyError, ValueError):
        return None


def own_device_index() -> int:
    """This process's accelerator on a world bound to none: the current device once the process has
    selected one other than 0; while the current device is still 0 (every process starts there, so
    every rank of a node would share that GPU), ``LOCAL_RANK`` when it names a visible device (the device
    torch's ``DeviceMesh`` and DeepSpeed's engine select); else the current device (one visible device
    per process, or no launcher)."""
    current = current_device_index()
    local = launcher_local_rank()
    if current == 0 and local is not None and 0 < local < torch.accelerator.device_count():
        return local
    return current


# --- creation -------------------------------------------------------------------------------------
def is_non_member(group: Any) -> bool:
    """Whether a creation result means "this rank is not in the group" (None, or
    ``GroupMember.NON_GROUP_MEMBER``, which ``split_group`` returns from 2.14)."""
    return group is None or (isinstance(group, int) and group == dist.GroupMember.NON_GROUP_MEMBER)


_OPTION_FIELDS = ("is_high_priority_stream", "_timeout", "config")  # what a user sets on NCCL options


def own_options(options: Any) -> Any:
    """A copy of a backend's options for a child group: ``copy.deepcopy`` where the options support it
    (torch >= 2.10), else a fresh object of the same type with the user-set fields copied (torch 2.6's
    ``ProcessGroupNCCL.Options`` cannot be pickled; ``split_group`` overwrites the rest)."""
    try:
        return copy.deepcopy(options)
    except TypeError:
        fresh = type(options)()
        for field in _OPTION_FIELDS:
            if hasattr(options, field):
                with contextlib.suppress(AttributeError, TypeError):
                    setattr(fresh, field, getattr(options, field))
        return fresh


def split_group(split_ranks: Sequence[Sequence[int]]) -> Optional[dist.ProcessGroup]:
    """``dist.split_group`` of the default group into ``split_ranks`` (collective over the world);
    this rank's group, or None when it is in no split. Before 2.10 the child gets a copy of the
    parent's backend options (torch handed over, and mutated, the parent's own)."""
    kwargs: dict[str, Any] = {}
    release = torch_release()
    if release is not None and release < (2, 10, 0):
        device = bound_device()
        if device is not None:
            with contextlib.suppress(AttributeError, RuntimeError):
                kwargs["pg_options"] = own_options(_backend(default_group(), device).options)
    group = getattr(dist, SPLIT_GROUP_ENTRY)(split_ranks=[list(r) for r in split_ranks], **kwargs)
    return None if is_non_member(group) else group


# --- private tensor helpers -----------------------------------------------------------------------
def flatten_dense_tensors(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """``torch._utils._flatten_dense_tensors``: one contiguous 1-D tensor of ``tensors``."""
    from torch._utils import _flatten_dense_tensors

    flat: torch.Tensor = _flatten_dense_tensors(tensors)  # type: ignore[no-untyped-call, unused-ignore]
    return flat


def unflatten_dense_tensors(flat: torch.Tensor, tensors: Sequence[torch.Tensor]) -> Sequence[torch.Tensor]:
    """``torch._utils._unflatten_dense_tensors``: views of ``flat`` shaped like ``tensors``."""
    from torch._utils import _unflatten_dense_tensors

    views: Sequence[torch.Tensor] = _unflatten_dense_tensors(flat, tensors)  # type: ignore[no-untyped-call, unused-ignore]
    return views


def foreach_copy_(targets: Sequence[torch.Tensor], sources: Sequence[torch.Tensor]) -> None:
    """``targets[i].copy_(sources[i])``: in one ``torch._foreach_copy_`` call when every tensor is on one
    device, else (a GPU region staged through host memory) one synchronous ``copy_`` each."""
    if targets and all(t.device == targets[0].device for t in (*targets, *sources)):
        torch._foreach_copy_(list(targets), list(sources))
        return
    for target, source in zip(targets, sources):
        target.copy_(source)


def connect_backend(group: dist.ProcessGroup, device: torch.device) -> None:
    """Connect ``group``'s communicator for ``device`` now (NCCL: ``ncclCommInitRank`` among its
    members, as torch does at creation when given ``device_id``) instead of at its first collective."""
    _backend(group, device).eager_connect_single_device(device)


def alias_group_name(name: str, group: dist.ProcessGroup) -> bool:
    """Make torch resolve the group name ``name`` to ``group`` (its process-group registry, through
    which ``DeviceMesh`` and DTensor find their groups by name); False where torch has no such registry."""
    register = getattr(c10d, "_register_process_group", None)
    if register is None:
        return False
    register(name, group)
    return True


def drop_group_alias(name: str) -> None:
    """Undo :func:`alias_group_name`."""
    unregister = getattr(c10d, "_unregister_process_group", None)
    if unregister is not None:
        unregister(name)


def retarget_device_mesh(device_mesh: Any, groups: dict[str, Any]) -> None:
    """Point a torch ``DeviceMesh``'s own name -> group table (kept for ``torch.compile``) at ``groups``
    for the names it holds."""
    table = getattr(device_mesh, "_pg_registry", None)
    if isinstance(table, dict):
        for name, group in groups.items():
            if name in table:
                table[name] = group
