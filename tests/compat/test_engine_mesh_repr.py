"""The engine's mesh says what it is when printed."""

from __future__ import annotations

import pytest

from compat.engine_mesh import as_engine_mesh
from fakepg import fake_world
from mesh_core import DeepSpeedDeviceMesh, MeshSpec

pytestmark = pytest.mark.torch_releases


def test_engine_mesh_repr_names_the_documented_type_and_its_role():
    with fake_world(1, 4):
        mesh = as_engine_mesh(DeepSpeedDeviceMesh(MeshSpec.build(4, dp=2, tp=2)))
        text = repr(mesh)
        assert text.startswith("DeepSpeedDeviceMesh(MeshSpec(") and "dp=2" in text and "tp=2" in text
        assert "engine's mesh_device" in text and not text.startswith("EngineMesh")
        mesh.destroy()
