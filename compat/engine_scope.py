"""Each engine runs with its own ``groups`` state, so several engines in one process don't leak.

Legacy ``deepspeed.utils.groups`` holds one process-global ``mpu`` / ``mesh_device``: the last
engine built wins, and a second model silently reads the first one's groups. With the shim, the
state of :mod:`compat.groups` (bound mesh, ``mpu``, ``mesh_device``) is captured when an engine is
built and re-activated around that engine's ``forward`` / ``backward`` / ``step`` /
``train_batch`` / ``eval_batch`` (and its rank getters and checkpoint save / load), then put back.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Iterator, Optional

ENGINE_STATE_ATTR = "_mesh_groups_state"


@dataclass(frozen=True)
class GroupsState:
    mesh: Any
    mpu: Any
    mesh_device: Any


def _groups():
    from . import groups

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


@contextlib.contextmanager
def groups_state(state: Optional[GroupsState]) -> Iterator[None]:
    """Make ``state`` current inside the block (no-op for None); restore the previous one after."""
    if state is None:
        yield
        return
    previous = capture()
    if previous == state:
        yield
        return
    activate(state)
    try:
        yield
    finally:
        activate(previous)


def engine_step_wrapper(wrapped, instance, args, kwargs):
    """wrapt wrapper for engine entry points: run them with the engine's groups state."""
    with groups_state(getattr(instance, ENGINE_STATE_ATTR, None)):
        return wrapped(*args, **kwargs)
