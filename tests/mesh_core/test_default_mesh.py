"""The default mesh never outlives its world: a later process group never sees a mesh of an earlier one."""

from __future__ import annotations

import pytest

from fakepg import fake_world
from mesh_core import DeepSpeedDeviceMesh, MeshSpecError, current_mesh, default_mesh, set_default_mesh

pytestmark = pytest.mark.torch_releases


def test_a_default_mesh_of_a_destroyed_world_is_not_served_to_the_next_world():
    with fake_world(1, 4):
        old = DeepSpeedDeviceMesh.build(dp=2, sp=2, verify=False)
        set_default_mesh(old)
        assert current_mesh() is old and default_mesh() is old
    try:
        with fake_world(3, 8):
            with pytest.raises(
                MeshSpecError,
                match=r"default mesh MeshSpec\(dp=2, sp=2.* was built over a process "
                "group that has since been destroyed",
            ):
                default_mesh()
            assert current_mesh().spec.describe().startswith("MeshSpec(dp=8")  # the world dp mesh, not the stale one
            with pytest.raises(MeshSpecError, match="no default mesh is set"):
                default_mesh()  # current_mesh() cleared the stale pointer
    finally:
        set_default_mesh(None)


def test_a_destroyed_default_mesh_is_not_served():
    with fake_world(0, 4):
        mesh = DeepSpeedDeviceMesh.build(dp=4, verify=False)
        set_default_mesh(mesh)
        try:
            mesh.destroy()
            with pytest.raises(MeshSpecError, match="is destroyed"):
                default_mesh()
            assert current_mesh() is not mesh and current_mesh().spec.describe().startswith("MeshSpec(dp=4")
        finally:
            set_default_mesh(None)
