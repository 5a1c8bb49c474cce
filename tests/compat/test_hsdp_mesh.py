"""Which default mesh the HSDP wrappers act on (fake backend, no DeepSpeed engine)."""

from __future__ import annotations

import pytest

from compat import hsdp
from fakepg import fake_world
from mesh_core import DeepSpeedDeviceMesh, use_mesh

pytestmark = pytest.mark.torch_releases


def test_the_hsdp_mesh_is_a_live_hsdp_default_mesh_this_rank_is_in():
    with fake_world(1, 8):
        flat = DeepSpeedDeviceMesh.build(dp=4, tp=2)
        with use_mesh(flat):
            assert hsdp._hsdp_mesh() is None  # not HSDP
        mesh = DeepSpeedDeviceMesh.build(dp_replicate=2, dp_shard=2, tp=2)
        with use_mesh(mesh):
            assert hsdp._hsdp_mesh() is mesh
            mesh.destroy()
            assert hsdp._hsdp_mesh() is None  # destroyed
        outside = DeepSpeedDeviceMesh.build(ranks=range(4, 8), dp_replicate=2, dp_shard=2)
        with use_mesh(outside):
            assert not outside.is_member and hsdp._hsdp_mesh() is None  # rank 1 is not in it
