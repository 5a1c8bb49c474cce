"""Every process group of real jobs comes from mesh_core under the shim (strict mode), with the
same rank sets and losses as legacy: pipeline with tied layers, ALST Ulysses, ZeRO-3 + hpZ, MoE,
AutoTP (tests/e2e/trace_jobs.py on 4 gloo ranks)."""

import math
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "e2e"))
from runner import WORLD, torchrun  # noqa: E402

pytestmark = [pytest.mark.multiprocess, pytest.mark.deepspeed]
JOBS = ("pipe_tied", "ulysses", "zero3_hpz", "moe", "autotp")


@pytest.fixture(scope="module")
def traced(tmp_path_factory):
    return torchrun("trace_jobs.py", str(tmp_path_factory.mktemp("trace")), *JOBS, timeout=600)


@pytest.mark.parametrize("job", JOBS)
def test_no_group_outside_mesh_core(traced, job):
    for rank in range(WORLD):
        outside = [c for c in traced[rank][job]["shim"]["created"] if not c[1]]
        assert outside == [], f"{job}: rank {rank} created groups outside mesh_core: {outside}"


@pytest.mark.parametrize("job", JOBS)
def test_legacy_rank_sets_served_by_the_mesh(traced, job):
    for rank in range(WORLD):
        legacy = {tuple(r) for r, _, _ in traced[rank][job]["legacy"]["created"]}
        assert legacy, f"{job}: legacy created no groups (the tracer saw nothing)"
        served = traced[rank][job]["shim"]["served"]
        assert served and all(served.values()), f"{job}: rank {rank} rank sets not held by the registry: {served}"


@pytest.mark.parametrize("job", JOBS)
def test_same_losses(traced, job):
    for rank in range(WORLD):
        legacy, shim = traced[rank][job]["legacy"]["losses"], traced[rank][job]["shim"]["losses"]
        assert all(math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-7) for a, b in zip(legacy, shim)), (job, legacy, shim)
