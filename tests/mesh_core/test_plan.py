"""The creation plan (``mesh show``) equals what the real mesh does on the fake backend."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from test_member_only import big_layouts

from fakepg import fake_world, record_new_groups
from mesh_core import DeepSpeedDeviceMesh, MeshSpec
from mesh_core.plan import creation_plan, format_plan

pytestmark = pytest.mark.torch_releases


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(big_layouts())
def test_plan_calls_equal_the_real_mesh(case):
    spec, flatten, p2p, rank = case
    plan = creation_plan(spec, flatten=flatten, p2p_groups=p2p, rank=rank)
    with fake_world(rank, spec.world_size), record_new_groups() as calls:
        DeepSpeedDeviceMesh(spec, flatten=flatten, p2p_groups=p2p)
    assert plan.calls_per_rank == len(calls)
    assert plan.communicators_per_rank >= plan.calls_per_rank
    assert sum(g.calls for g in plan.groups if g.eager) == plan.calls_per_rank


def test_plan_lists_eager_and_lazy_groups():
    spec = MeshSpec.build(8192, pp=8, tp=8, ep=8)
    plan = creation_plan(spec, rank=8191)
    assert (plan.calls_per_rank, plan.communicators_per_rank) == (5, 5)
    assert plan.communicators_in_world == 1024 + 64 + 1024 + 1024 + 512  # pp, dp, tp, ep, edp = 3,648
    eager = [g.dims for g in plan.groups if g.eager]
    lazy = [g.dims for g in plan.groups if not g.eager]
    assert eager == ["pp", "dp", "tp", "ep", "edp"] and "p2p" in lazy and "ep/edp" in lazy
    text = "\n".join(format_plan(plan.to_dict()))
    assert "5 calls on this rank" in text and "lazy  p2p" in text


def test_shared_and_world_groups_cost_no_call():
    plan = creation_plan(MeshSpec.build(8, pp=2), flatten=[("pp", "dp")], p2p_groups=True, rank=1)
    by_dims = {g.dims: g for g in plan.groups}
    assert by_dims["ppxdp"].calls == 0 and "default group" in by_dims["ppxdp"].note
    assert by_dims["p2p"].calls == 0 and "shared" in by_dims["p2p"].note
    assert plan.calls_per_rank == 2 and plan.communicators_per_rank == 3
