"""The process's current CUDA device, on CPU: what decides where an NCCL rank's tensors land before
anyone calls ``set_device``.

On a GPU host every process starts with current device index 0 (cuda:0 on every rank of a node, which
is NCCL's "duplicate GPU" failure as soon as the world communicator is made there) until something
selects another: the script (``torch.cuda.set_device``, ``torch.accelerator.set_device_index``) or
DeepSpeed's engine (``get_accelerator().set_device(local_rank)``). :func:`current_device` models that
state inside a :func:`fakenccl.nccl_world` (enter it inside the world, whose recorder it feeds):

- ``torch.accelerator.current_device_index`` / ``torch.cuda.current_device`` read the modelled index;
  ``torch.accelerator.set_device_index``, ``torch.cuda.set_device`` and DeepSpeed's accelerator's
  ``set_device`` (the CPU accelerator's is a no-op; the CUDA accelerator's is ``torch.cuda.set_device``)
  move it, each call recorded (:attr:`DeviceState.selected`);
- ``torch.accelerator.device_count`` / ``torch.cuda.device_count`` say ``device_count``;
- an allocation asked for ``"cuda"`` without an index lands on the current device, as on a GPU, and
  reaches the world's recorder (:attr:`fakenccl.RankLog.allocations`) with that index.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, Callable, Iterator

import torch

_FACTORIES = ("tensor", "zeros", "empty", "ones", "full")


@dataclasses.dataclass
class DeviceState:
    index: int = 0  # the current device index (0 until something selects another)
    selected: list = dataclasses.field(default_factory=list)  # (who, index) of every set_device


def _index(device: Any) -> int:
    if isinstance(device, int):
        return device
    device = torch.device(device)
    return 0 if device.index is None else device.index


@contextlib.contextmanager
def current_device(*, device_count: int = 8) -> Iterator[DeviceState]:
    """Model this process's current CUDA device (module docstring); yields its state."""
    state = DeviceState()
    with contextlib.ExitStack() as undo:

        def patch(owner: Any, name: str, value: Any) -> None:
            had = name in vars(owner)
            old = vars(owner).get(name)
            setattr(owner, name, value)
            undo.callback(lambda: setattr(owner, name, old) if had else delattr(owner, name))

        def select(who: str) -> Callable[[Any], None]:
            def set_device(device: Any) -> None:
                index = _index(device)
                if not 0 <= index < device_count:
                    raise RuntimeError(f"CUDA error: invalid device ordinal {index} ({device_count} devices)")
                state.index = index
                state.selected.append((who, index))

            return set_device

        patch(torch.accelerator, "current_device_index", lambda: state.index)
        patch(torch.accelerator, "set_device_index", select("torch.accelerator.set_device_index"))
        patch(torch.accelerator, "device_count", lambda: device_count)
        patch(torch.cuda, "current_device", lambda: state.index)
        patch(torch.cuda, "set_device", select("torch.cuda.set_device"))
        patch(torch.cuda, "device_count", lambda: device_count)
        try:
            from deepspeed.accelerator import get_accelerator
        except ImportError:
            pass
        else:
            patch(type(get_accelerator()), "set_device", lambda self, index: select("deepspeed accelerator")(index))

        for name in _FACTORIES:
            inner = getattr(torch, name)  # the world's recording factory

            def factory(*args: Any, _inner: Callable = inner, **kwargs: Any) -> torch.Tensor:
                device = kwargs.get("device")
                if device is not None and not isinstance(device, int):
                    device = torch.device(device)
                    if device.type == "cuda" and device.index is None:
                        kwargs["device"] = torch.device("cuda", state.index)
                elif isinstance(device, int):  # an int device is a CUDA ordinal
                    kwargs["device"] = torch.device("cuda", device)
                return _inner(*args, **kwargs)

            patch(torch, name, factory)
        yield state
