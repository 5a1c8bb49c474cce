"""torch's nccl2 engine (ProcessGroupNCCL2: torch 2.15's ``nccl`` by default, 2.14's with
``TORCH_DIST_USE_NCCL2=1``) on the fake NCCL world: recognised by the world's backend object and
refused on every path that creates a group, on every rank, before any group, with one error naming the
setting and the way back; ``TORCH_DIST_USE_NCCL2=0`` on 2.15 is stock NCCL and keeps the contract;
a gloo world is not concerned (docs/nccl.md, "Settings ds-mesh refuses")."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from fakenccl import nccl_world, run_ranks
from fakepg import fake_world, group_count

pytestmark = pytest.mark.torch_releases

WORLD = 4


def _mesh(**kwargs):
    from mesh_core import DeepSpeedDeviceMesh

    return DeepSpeedDeviceMesh.build(verify=False, **kwargs)


def _member_group():
    from mesh_core.registry import registry_for_world

    return registry_for_world().new_member_group([0, 1])


PATHS = {  # every way ds-mesh creates a group on a world
    "world mesh (split path)": lambda: _mesh(tp=2, dp=2),
    "sub-world mesh (member-only)": lambda: _mesh(ranks=[0, 1], tp=2),
    "flattened dims": lambda: _mesh(tp=2, dp=2, flatten=[("dp", "tp")]),
    "member-only group (legacy getters, routed new_group, one-rank groups)": _member_group,
}


@pytest.fixture
def nccl2_setting(monkeypatch, request):
    """TORCH_DIST_USE_NCCL2 as the job had it when torch registered its backends."""
    if request.param is None:
        monkeypatch.delenv("TORCH_DIST_USE_NCCL2", raising=False)
    else:
        monkeypatch.setenv("TORCH_DIST_USE_NCCL2", request.param)
    return request.param


@pytest.mark.parametrize("path", sorted(PATHS))
@pytest.mark.parametrize(
    "release,nccl2_setting",
    [("2.15", None), ("2.15", "1"), ("2.14", "1")],
    indirect=["nccl2_setting"],
    ids=["2.15-default", "2.15-USE_NCCL2=1", "2.14-USE_NCCL2=1"],
)
def test_nccl2_is_refused_on_every_path_and_rank_before_any_group(release, nccl2_setting, path):
    from mesh_core.torch_compat import UnsupportedSettingError

    for rank in range(WORLD):
        with nccl_world(rank, WORLD, release=release, engine="auto") as log:
            before = group_count()
            with pytest.raises(UnsupportedSettingError) as err:
                PATHS[path]()
            assert group_count() == before and log.world == [] and log.members == [] and log.names == []
        text = str(err.value)
        assert text.startswith(
            f"the world's NCCL backend is nccl2 (ProcessGroupNCCL2; TORCH_DIST_USE_NCCL2={nccl2_setting or '<unset>'}"
        )
        way_back = (
            "set TORCH_DIST_USE_NCCL2=0 before the job starts"
            if release == "2.15"
            else "unset TORCH_DIST_USE_NCCL2 (or set it to 0)"
        )
        assert way_back in text, text


@pytest.mark.parametrize("nccl2_setting", [None, "1"], indirect=True)
def test_the_2_15_default_and_use_nccl2_1_are_the_same_engine(nccl2_setting):
    from mesh_core import torch_compat

    with nccl_world(0, WORLD, release="2.15", engine="auto"):
        assert torch_compat.nccl_engine() == "nccl2"


@pytest.mark.parametrize(
    "release,nccl2_setting", [("2.15", "0"), ("2.14", None), ("2.14", "0"), ("2.13", "1")], indirect=["nccl2_setting"]
)
def test_stock_nccl_is_not_nccl2(release, nccl2_setting):
    from mesh_core import torch_compat

    with nccl_world(0, WORLD, release=release, engine="auto"):
        assert torch_compat.nccl_engine() is None


def test_nccl2_binds_the_world_by_itself():
    """``_nccl2_device``: a world init_process_group("nccl") made without device_id is bound anyway."""
    from mesh_core import torch_compat

    with nccl_world(1, WORLD, engine="nccl2", bound=False, local_rank=5):
        assert torch_compat.bound_device() == torch.device("cuda", 5 % WORLD)


@pytest.mark.parametrize("nccl2_setting", ["0"], indirect=True)
def test_torch_dist_use_nccl2_0_on_2_15_keeps_the_contract(nccl2_setting):
    """The way back: stock ProcessGroupNCCL, whose every row of docs/nccl.md the other contract tests play."""
    from mesh_core.registry import registry_for_world

    def scenario(rank):
        mesh = _mesh(tp=2, dp=2)  # every rank: the split path
        if rank < 2:
            sub = _mesh(ranks=[0, 1], tp=2)  # members only
            registry_for_world().connect()  # the connect plan's explicit point (docs/nccl.md)
            dist.all_reduce(torch.zeros(1, device=torch.device("cuda", rank)), group=sub.get_group("tp"))
            sub.destroy()
        return mesh.get_group("tp").group_name

    logs = run_ranks(scenario, WORLD, release="2.15", engine="auto")
    assert all(log.world == logs[0].world != [] for log in logs) and all(log.lazy_inits == [] for log in logs)


@pytest.mark.parametrize("nccl2_setting", [None, "1"], indirect=True)
def test_a_gloo_world_on_2_15_is_not_concerned(monkeypatch, nccl2_setting):
    monkeypatch.setattr(torch, "__version__", "2.15.0")
    with fake_world(0, WORLD):
        from mesh_core import torch_compat

        torch_compat.check_settings()
        assert torch_compat.nccl_engine() is None


# --- lazy_init (torch 2.15's official member-only creation; ds-mesh does not use it yet: docs/nccl.md) ---
def _plain_member_group(options, **kwargs):
    """torch's own member-only new_group, as a script would write it: ranks 0, 1 make [0, 1], ranks 2, 3
    make [2, 3] (so torch's group counter stays equal), then an all_reduce over it."""

    def scenario(rank):
        mine = [0, 1] if rank < 2 else [2, 3]
        group = dist.new_group(mine, use_local_synchronization=True, pg_options=options, **kwargs)
        dist.all_reduce(torch.zeros(1, device=torch.device("cuda", rank)), group=group)

    return scenario


def test_on_nccl2_a_member_only_new_group_without_lazy_init_splits_the_bound_world():
    from fakenccl import ContractViolation, NcclOptions

    with pytest.raises(ContractViolation, match="every world rank must join each ncclCommSplit"):
        run_ranks(_plain_member_group(NcclOptions()), WORLD, release="2.15", engine="nccl2", bound=False)


def test_on_nccl2_lazy_init_makes_no_split_and_connects_at_the_first_collective():
    from fakenccl import NcclOptions

    logs = run_ranks(
        _plain_member_group(NcclOptions(lazy_init=True)), WORLD, release="2.15", engine="nccl2", bound=False
    )
    assert all(log.world == [] for log in logs)
    assert [len(log.lazy_inits) for log in logs] == [1, 1, 1, 1]  # each member, at the all_reduce


@pytest.mark.parametrize("nccl2_setting", ["0"], indirect=True)
def test_lazy_init_on_stock_nccl_makes_no_split_and_a_device_connects_it_at_creation(nccl2_setting):
    from fakenccl import NcclOptions

    def scenario(rank):
        _plain_member_group(NcclOptions(lazy_init=True), device_id=torch.device("cuda", rank))(rank)

    logs = run_ranks(scenario, WORLD, release="2.15", engine="auto")
    assert all(log.world == [] and log.lazy_inits == [] for log in logs)
