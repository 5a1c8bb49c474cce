"""Cross-rank mesh consistency: a clear error on every rank instead of a hang."""

from __future__ import annotations

import json
import os
import warnings

import pytest
import torch.distributed as dist

from fakepg import fake_world
from mesh_core import AbsentRanksError, DeepSpeedDeviceMesh, MeshSpec, MeshSpecError
from mesh_core.consistency import check_same_mesh, describe_disagreement, digest, mesh_fields
from spawn import run_ranks

pytestmark = pytest.mark.torch_releases

WORLD = 4
TIMEOUT_S = 120


def test_digest_is_stable_and_sensitive_to_every_field():
    base = mesh_fields(MeshSpec.build(8, pp=2, tp=2), flatten=[("dp",)], p2p_groups=False)
    assert digest(base) == digest(dict(reversed(list(base.items()))))
    variants = [
        mesh_fields(MeshSpec.build(8, pp=2, tp=4), flatten=[("dp",)], p2p_groups=False),
        mesh_fields(MeshSpec.build(8, pp=2, tp=2, order=("pp", "tp", "dp")), flatten=[("dp",)], p2p_groups=False),
        mesh_fields(MeshSpec.build(8, pp=2, tp=2, ep=2), flatten=[("dp",)], p2p_groups=False),
        mesh_fields(MeshSpec.build(8, ranks=range(4), tp=2), flatten=[("dp",)], p2p_groups=False),
        mesh_fields(MeshSpec.build(8, pp=2, tp=2), flatten=[], p2p_groups=False),
        mesh_fields(MeshSpec.build(8, pp=2, tp=2), flatten=[("dp",)], p2p_groups=True),
    ]
    digests = {tuple(digest(base))} | {tuple(digest(v)) for v in variants}
    assert len(digests) == len(variants) + 1


def test_disagreement_names_fields_and_ranks():
    agree = mesh_fields(MeshSpec.build(8, pp=2, tp=2), p2p_groups=False)
    differ = mesh_fields(MeshSpec.build(8, pp=2, tp=4), p2p_groups=True)
    message = describe_disagreement([agree] * 5 + [differ] + [agree] * 2)
    assert "dims: 'pp=2, dp=2, tp=2' on ranks 0..4,6..7; 'pp=2, dp=1, tp=4' on rank 5" in message
    assert "p2p_groups: 'False' on ranks 0..4,6..7; 'True' on rank 5" in message
    assert "ep:" not in message and "world_size:" not in message


def test_skipped_on_the_fake_backend(monkeypatch):
    def fail(*args, **kwargs):
        raise AssertionError("no collective may run on the fake backend")

    for name in ("all_gather_single", "all_gather_into_tensor", "all_gather_object"):
        monkeypatch.setattr(dist, name, fail, raising=False)
    with fake_world(1, 16):
        check_same_mesh(MeshSpec.build(16, tp=2))
        DeepSpeedDeviceMesh(MeshSpec.build(16, pp=2, tp=2))


def _worker(rank: int, init_file: str, out_dir: str) -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    warnings.simplefilter("error", FutureWarning)  # the check must not warn on every mesh
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    outcome = {}
    same = DeepSpeedDeviceMesh(MeshSpec.build(WORLD, pp=2, tp=2))  # agreeing ranks: no error
    outcome["same"] = dist.get_process_group_ranks(same.get_group("tp"))
    cases = {
        "rank 3 differs in dims": (MeshSpec.build(WORLD, tp=4 if rank == 3 else 2), {}),
        "rank 0 differs in p2p": (MeshSpec.build(WORLD, pp=2), {"p2p_groups": rank == 0}),
    }
    for name, (spec, kwargs) in cases.items():
        try:
            DeepSpeedDeviceMesh(spec, **kwargs)
            outcome[name] = "no error"
        except MeshSpecError as err:
            outcome[name] = str(err)
    outcome["unverified"] = DeepSpeedDeviceMesh(MeshSpec.build(WORLD, dp=4), verify=False).size("dp")
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as fh:
        json.dump(outcome, fh)
    dist.barrier()  # no rank tears gloo down while a peer still talks to it (abort at exit)
    dist.destroy_process_group()


@pytest.mark.multiprocess
def test_disagreeing_ranks_all_raise_instead_of_hanging(tmp_path):
    run_ranks(
        _worker,
        (str(tmp_path / "store"), str(tmp_path)),
        world=WORLD,
        timeout_s=TIMEOUT_S,
        hang="the mismatch hung instead of raising",
    )
    for rank in range(WORLD):
        outcome = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert outcome["same"] == ([0, 1] if rank < 2 else [2, 3])
        dims_error = outcome["rank 3 differs in dims"]
        assert "ranks disagree on the mesh" in dims_error
        assert "dims: 'dp=2, tp=2' on ranks 0..2; 'dp=1, tp=4' on rank 3" in dims_error
        p2p_error = outcome["rank 0 differs in p2p"]
        assert "p2p_groups: 'True' on rank 0; 'False' on ranks 1..3" in p2p_error
        assert "dims:" not in p2p_error
        assert outcome["unverified"] == 4


def test_sub_world_check_names_missing_members(monkeypatch):
    """A member whose peers build another mesh (or none) gets a clear error after the timeout,
    not a hang; agreeing members pass; a member with other dims is named."""
    from datetime import timedelta

    from torch.distributed import distributed_c10d as c10d

    import mesh_core.consistency as consistency

    store = dist.HashStore()
    monkeypatch.setattr(c10d, "_get_default_store", lambda: store)
    with fake_world(1, 8):
        spec = MeshSpec.build(8, ranks=[1, 2], tp=2)
        with pytest.raises(
            MeshSpecError,
            match=r"only 1 of the 2 ranks .* \(arrived: rank 1; missing: rank 2; "
            r"rank 2 built no mesh at all in this world\)",
        ) as caught:
            consistency._check_over_store(spec, mesh_fields(spec), timedelta(seconds=0.2))
        assert isinstance(caught.value, AbsentRanksError)
        assert (caught.value.arrived, caught.value.missing, caught.value.quiet) == ([1], [2], [2])
        # rank 2's description, as if it had arrived first with other dims, then rank 1 checks
        other = MeshSpec.build(8, ranks=[1, 2], dp=2)
        prefix = f"{consistency.STORE_PREFIX}/"
        counts = consistency._CHECKS[c10d._get_default_group()]
        set_id = next(iter(counts))
        key = f"{prefix}{set_id}/{counts[set_id]}"
        mine = "".join(f"{w & 0xFFFFFFFFFFFFFFFF:016x}" for w in digest(mesh_fields(other)))
        store.set(f"{key}/fields/2", json.dumps(mesh_fields(other)))
        store.set(f"{key}/digest_of/2", mine)
        store.add(f"{key}/digest/{mine}", 1)
        store.append(f"{key}/who", "2,")
        store.add(f"{key}/arrived", 1)
        with pytest.raises(MeshSpecError, match="dims: 'dp=1, tp=2' on rank 1; 'dp=2' on rank 2"):
            consistency._check_over_store(spec, mesh_fields(spec), timedelta(seconds=5))
