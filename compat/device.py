"""The device type of the meshes compat builds itself (legacy APIs take no device argument)."""

from __future__ import annotations

from mesh_core import torch_compat


def default_device_type() -> str:
    """The device the default process group serves: its bound device's type, cuda under NCCL, cpu
    under gloo/fake (:func:`mesh_core.torch_compat.default_device_type`)."""
    return torch_compat.default_device_type()
