"""The device type of the meshes compat builds itself (legacy APIs take no device argument)."""

from __future__ import annotations

import torch.distributed as dist


def default_device_type() -> str:
    """The device the default process group's collectives run on: ``"cuda"`` under NCCL, else ``"cpu"``."""
    if not dist.is_initialized() or dist.get_backend() in ("fake", "gloo"):
        return "cpu"
    return dist.distributed_c10d._get_object_coll_device(None).type  # type: ignore[attr-defined]
