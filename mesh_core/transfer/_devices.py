"""Which devices a weight transfer may move tensors on: this rank's checks and the agreed ones.

The data phase sends every tensor point to point on the world's default group, so before any
message every participant checks (and the agreement of :mod:`mesh_core.transfer._agree` makes the
verdict the same on every participant):

- on this rank: each tensor's device type is one the world's backend moves (an NCCL-only world
  moves no CPU tensor; a ``meta`` tensor has no data), and an accelerator tensor is on this rank's
  own device (the world's bound device, else the accelerator's current device): NCCL refuses two
  ranks of one communicator on one GPU, and a tensor on another GPU than the communicator's fails
  or hangs in the data phase;
- among the participants: every tensor of every rank on one device type (a CPU side facing a GPU
  side cannot exchange messages), no two ranks of one host on the same accelerator device, and on
  a world whose communicator is created lazily (not bound to a device) a transfer that is the
  world's first NCCL operation has every world rank taking part (a batch of point-to-point
  messages initialises the world's communicator, a collective of the whole world).
"""

from __future__ import annotations

import socket
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence

import torch
import torch.distributed as dist

from .. import torch_compat
from ..rendezvous import ranks_text


@dataclass(frozen=True)
class WorldDevices:
    """What this rank's world moves data on (the record's ``world`` entry)."""

    backend: str  # the default group's backend, e.g. "nccl", "gloo", "cpu:gloo,cuda:nccl"
    types: tuple[str, ...]  # device types the backend moves tensors of
    own: Optional[str]  # this rank's accelerator device ("cuda:1"), None on a CPU-only world
    bound: bool  # the world is bound to ``own`` (eager communicator; DeepSpeed's init on >= 2 GPUs)
    lazy_uninitialised: bool  # an unbound accelerator world whose communicator does not exist yet
    host: str
    size: int  # ranks in the world

    def fields(self) -> dict[str, Any]:
        return {
            "backend": self.backend,
            "types": list(self.types),
            "own": self.own,
            "bound": self.bound,
            "lazy": self.lazy_uninitialised,
            "host": self.host,
            "size": self.size,
        }


def world_devices() -> WorldDevices:
    """This rank's :class:`WorldDevices`, from the default group (its bound device, else the
    accelerator's current device when the backend moves accelerator tensors)."""
    group = torch_compat.default_group()
    backend = str(dist.get_backend(group))
    types = sorted(torch_compat.backend_devices(group)) or [torch_compat.home_device_type(backend)]
    bound = torch_compat.bound_device(group)
    own: Optional[torch.device] = bound
    if own is None and any(t != "cpu" for t in types):
        device = torch_compat.default_device()  # the current accelerator device (GPU only)
        own = device if device.type != "cpu" else None
    lazy = own is not None and bound is None and torch_compat.backend_initialised(group, own) is False
    return WorldDevices(
        backend,
        tuple(types),
        None if own is None else device_text(own),
        bound is not None,
        lazy,
        socket.gethostname(),
        dist.get_world_size(),
    )


def tensor_device(tensor: torch.Tensor) -> torch.device:
    """The device a tensor is sent from / received into."""
    return tensor.device


def device_problems(side: str, devices: Mapping[str, torch.device], world: WorldDevices) -> list[str]:
    """Why this rank's ``side`` tensors (device by name) cannot travel on ``world``: one line per device."""
    by_device: dict[str, list[str]] = {}
    for name, device in devices.items():
        by_device.setdefault(device_text(device), []).append(name)
    problems = []
    for device, names in by_device.items():
        reason = _device_problem(torch.device(device), world)
        if reason:
            listed = ", ".join(repr(n) for n in names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
            problems.append(
                f"{side} tensor{'s' if len(names) > 1 else ''} {listed} "
                f"{'are' if len(names) > 1 else 'is'} on {device}{reason}"
            )
    return problems


def _device_problem(device: torch.device, world: WorldDevices) -> Optional[str]:
    if device.type == "meta":
        return " (no data to send or receive)"
    if device.type not in world.types:
        return f", but the world's backend {world.backend!r} moves {' and '.join(world.types)} tensors only"
    if (
        device.type != "cpu"
        and world.own is not None
        and device.type == torch.device(world.own).type
        and device_text(device) != world.own
    ):
        whose = "the world's bound device" if world.bound else "the current device"
        return f", but this rank's device is {world.own} ({whose})"
    return None


def agreed_problems(members: Sequence[int], records: Sequence[Mapping[str, Any]]) -> list[str]:
    """The device problems seen only among all participants' records (pure: the same on every rank)."""
    problems = []
    by_type: dict[str, list[int]] = {}
    for rank, rec in zip(members, records):
        for devices in (rec.get("devices") or {}).values():
            for device in (devices or {}).values():
                if not device.startswith("meta"):  # refused on its rank already
                    by_type.setdefault(device.split(":")[0], []).append(rank)
    if len(by_type) > 1:
        problems.append(
            "tensors on different device types cannot travel between ranks: "
            + "; ".join(f"{t} on {ranks_text(sorted(set(rs)), 'rank')}" for t, rs in sorted(by_type.items()))
        )
    holders: dict[tuple[str, str], list[int]] = {}
    lazy = []
    for rank, rec in zip(members, records):
        world = rec.get("world") or {}
        if world.get("own") and _uses(rec, world["own"]):
            holders.setdefault((world.get("host", ""), world["own"]), []).append(rank)
            if world.get("lazy"):
                lazy.append(rank)
    for (host, device), ranks in sorted(holders.items()):
        if len(ranks) > 1:
            problems.append(
                f"{ranks_text(ranks, 'rank')} on host {host} all use {device}: each rank needs its own "
                "accelerator (call torch.cuda.set_device(local_rank), or init_process_group(device_id=...))"
            )
    world_size = max((rec.get("world") or {}).get("size", 0) for rec in records)
    if lazy and len(members) < world_size:
        problems.append(
            f"the world's communicator is not created yet on {ranks_text(lazy, 'rank')} and only {len(members)} of its "
            f"{world_size} ranks take part: the transfer's first batch of messages would create it, which needs every "
            "world rank (run a collective over the world first, e.g. dist.barrier(), or init with device_id=)"
        )
    return problems


def _uses(record: Mapping[str, Any], device: str) -> bool:
    return any(d == device for devices in (record.get("devices") or {}).values() for d in (devices or {}).values())


def device_text(device: torch.device) -> str:
    """``"cuda:1"``, ``"cpu"``: a device as the records name it."""
    device = torch.device(device)
    return device.type if device.index is None else f"{device.type}:{device.index}"
