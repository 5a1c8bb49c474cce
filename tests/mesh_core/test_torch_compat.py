"""mesh_core.torch_compat: the declared torch range (one clear error outside it, before any group),
torch's naming across releases, split_group's non-member value and options, the mesh device."""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

from fakenccl import NON_GROUP_MEMBER, nccl_world, run_ranks
from fakepg import fake_world, group_count
from mesh_core import DeepSpeedDeviceMesh, torch_compat
from mesh_core.registry import registry_for_world
from mesh_core.torch_compat import UnsupportedTorchError

pytestmark = pytest.mark.torch_releases

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# --- the supported range ------------------------------------------------------------------------
@pytest.mark.parametrize(
    "version,ok",
    [
        ("2.5.1", False),
        ("2.6.0", True),
        ("2.6.0+cu124", True),
        ("2.8.0+cu128", True),
        ("2.13.0+cpu", True),
        ("2.14.1", True),
        ("2.14.1+cu130", True),
        ("2.14.2", True),
        ("2.15.0", True),
        ("2.15.0+cu132", True),
        ("2.15.0a0+git1234", True),
        ("2.15.1", False),
        ("2.16.0", False),
        ("1.13.1", False),
        ("nightly", False),
    ],
)
def test_range(version, ok):
    assert torch_compat.is_supported(version) is ok


def test_the_installed_torch_is_in_the_range():
    assert torch_compat.check_torch() == torch.__version__


def test_declared_range_is_the_same_everywhere():
    with open(os.path.join(ROOT, "pyproject.toml"), encoding="utf-8") as fh:
        assert f'"torch{torch_compat.SUPPORTED}"' in fh.read()
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as fh:
        assert f"torch {torch_compat.SUPPORTED}" in fh.read()
    assert torch_compat.SUPPORTED == ">={},<={}".format(
        *(".".join(map(str, r)) for r in (torch_compat.OLDEST, torch_compat.NEWEST))
    )


@pytest.mark.parametrize("version", ["2.5.1", "2.15.1"])
def test_build_refuses_an_unsupported_torch_before_any_group(monkeypatch, version):
    with fake_world(0, 4):
        before = group_count()
        monkeypatch.setattr(torch, "__version__", version)
        for build in (
            lambda: DeepSpeedDeviceMesh.build(tp=2),
            lambda: DeepSpeedDeviceMesh.from_config({"mesh": {"tp": 2}}),
        ):
            with pytest.raises(UnsupportedTorchError) as err:
                build()
            assert str(err.value).startswith(
                f"ds-mesh supports torch {torch_compat.SUPPORTED} (2.6.0 through 2.15.0); "
                f"the installed torch is {version}."
            )
        assert group_count() == before and registry_for_world().created == 0


@pytest.mark.deepspeed
def test_install_refuses_an_unsupported_torch_and_patches_nothing(monkeypatch):
    import importlib

    import deepspeed  # noqa: F401
    from test_install import differences, snapshot_deepspeed

    installer = importlib.import_module("compat.install")  # the module (compat.install is also the function)
    installer.uninstall()
    before = snapshot_deepspeed()
    monkeypatch.setattr(torch, "__version__", "2.5.1")
    with pytest.raises(UnsupportedTorchError, match="the installed torch is 2.5.1"):
        installer.install()
    assert not installer.is_installed() and installer.patched_names() == []
    monkeypatch.undo()
    assert differences(before, snapshot_deepspeed()) == []


# --- naming across releases ---------------------------------------------------------------------
def test_group_name_is_a_plain_str_where_torch_has_no_GroupName(monkeypatch):
    assert torch_compat.group_name("mesh_core.x.0") == "mesh_core.x.0"
    monkeypatch.delattr(c10d, "GroupName", raising=False)  # torch 2.6 - 2.9 (CI also runs the suite on 2.6)
    name = torch_compat.group_name("mesh_core.x.0")
    assert type(name) is str and name == "mesh_core.x.0"


# --- split_group --------------------------------------------------------------------------------
@pytest.mark.parametrize("non_member", [None, NON_GROUP_MEMBER], ids=["torch<=2.13", "torch>=2.14"])
def test_a_rank_in_no_new_split_falls_back_to_a_member_only_group(non_member):
    """Partitions sharing some sets: rank 0's set was split before and released, the next split makes
    only other sets, so split_group hands rank 0 its non-member value (-100 on 2.14), never a group."""

    def scenario(rank):
        registry = registry_for_world()
        group, keys = registry.split([[0, 1], [2, 3]])
        registry.release(keys)
        group, keys = registry.split([[0, 1], [2], [3]])
        out = sorted(dist.get_process_group_ranks(group))
        assert isinstance(group, dist.ProcessGroup)
        registry.release(keys)
        return out

    logs = run_ranks(scenario, 4, split_non_member=non_member)
    assert [log.result for log in logs] == [[0, 1], [0, 1], [2], [3]]
    assert logs[0].members and logs[0].members[-1][1] == (0, 1)  # rank 0 created it member-only


def test_is_non_member():
    assert torch_compat.is_non_member(None) and torch_compat.is_non_member(NON_GROUP_MEMBER)
    assert not torch_compat.is_non_member(0)
    with fake_world(0, 2):
        assert not torch_compat.is_non_member(dist.group.WORLD)


@pytest.mark.parametrize("release,copied", [((2, 8, 0), True), ((2, 10, 0), False)])
def test_split_group_gets_its_own_options_before_2_10(monkeypatch, release, copied):
    monkeypatch.setattr(torch_compat, "torch_release", lambda version=None: release)
    with nccl_world(0, 4) as log:
        torch_compat.split_group([[0, 1], [2, 3]])
    (options,) = log.split_options
    if copied:
        assert options is not log.parent_options and options == log.parent_options
    else:
        assert options is None  # torch copies the parent's options itself


# --- the device of a mesh ------------------------------------------------------------------------
def test_device_on_cpu_worlds():
    with fake_world(1, 4):
        assert (torch_compat.default_device_type(), torch_compat.default_device()) == ("cpu", torch.device("cpu"))


def test_device_on_a_bound_nccl_world_is_the_bound_one_not_the_current_one():
    with nccl_world(3, 4):
        assert torch_compat.default_device_type() == "cuda"
        assert torch_compat.default_device() == torch.device("cuda", 3)
        with torch_compat.unbound_default_group() as bound:
            assert bound == torch.device("cuda", 3)
            assert c10d._get_default_group().bound_device_id is None
            assert torch_compat.default_device() == torch.device("cuda", 3)  # still the world's device
        assert c10d._get_default_group().bound_device_id == torch.device("cuda", 3)


def test_device_on_an_unbound_nccl_world_is_the_ranks_own_not_the_current_cuda_0(monkeypatch):
    """Before set_device every process's current device is cuda:0 (one GPU for every rank of a node);
    the rank's own is LOCAL_RANK's (what DeepSpeed's engine and torch's DeviceMesh select)."""
    monkeypatch.setenv("LOCAL_RANK", "3")
    with nccl_world(3, 4, bound=False):
        assert torch_compat.default_device_type() == "cuda"
        assert torch_compat.default_device() == torch.device("cuda", 3)
    monkeypatch.delenv("LOCAL_RANK")
    with nccl_world(3, 4, bound=False):  # no launcher said which: the current device, as torch's collectives
        assert torch_compat.default_device() == torch.device("cuda", 0)


@pytest.mark.parametrize(
    "config,expected",
    [
        ("cuda:nccl", "cuda"),
        ("cpu:gloo,cuda:nccl", "cuda"),
        ("cpu:gloo,cuda:gloo", "cpu"),
        ("gloo", "cpu"),
        ("nccl", "cuda"),
        ("xccl", "xpu"),
        ("cpu:fake,cuda:fake", "cpu"),
        ("cpu:mpi,cuda:mpi", "cpu"),
    ],
)
def test_device_type_follows_the_backend_config(monkeypatch, config, expected):
    with fake_world(0, 2):
        monkeypatch.setattr(dist, "get_backend_config", lambda group=None: config)
        assert torch_compat.default_device_type() == expected


def test_the_bound_device_is_restored_when_creation_fails(monkeypatch):
    from mesh_core import registry as registry_mod

    def failing(*args, **kwargs):
        assert c10d._get_default_group().bound_device_id is None  # cleared for the creation
        raise RuntimeError("NCCL error")

    with nccl_world(0, 4), monkeypatch.context() as patch:
        patch.setattr(dist, "new_group", failing)
        with pytest.raises(RuntimeError, match="NCCL error"):
            registry_mod.new_member_group([0, 1], "mesh_core.x.0")
        assert c10d._get_default_group().bound_device_id == torch.device("cuda", 0)


def test_device_with_no_world_and_of_an_unknown_backend(monkeypatch):
    assert torch_compat.default_device_type() == "cpu"  # no world, no accelerator
    with fake_world(0, 2):
        monkeypatch.setattr(dist, "get_backend_config", lambda group=None: "custom")
        assert torch_compat.default_device_type() == "cpu"


def test_device_of_an_nccl_world_torch_sees_no_accelerator_in(monkeypatch):
    with nccl_world(2, 4, bound=False), monkeypatch.context() as patch:  # undone before the harness's own
        patch.setattr(torch.accelerator, "is_available", lambda: False)
        assert torch_compat.default_device() == torch.device("cuda")
    assert torch.accelerator.is_available() is torch.cuda.is_available()  # nothing left patched


def test_backend_questions_on_an_nccl_world():
    from mesh_core.consistency import world_timeout

    with nccl_world(0, 4) as log:
        assert world_timeout() == log.parent_options._timeout  # the NCCL backend's own timeout
        world = torch_compat.default_group()
        assert torch_compat.backend_supports_splitting(world, torch.device("cuda", 0))
        assert not torch_compat.backend_supports_splitting(world, torch.device("mps"))  # no backend for it


class _PybindLikeOptions:
    """Options that, like torch 2.6's ProcessGroupNCCL.Options, cannot be deep-copied."""

    def __init__(self) -> None:
        self.is_high_priority_stream, self._timeout, self.config, self.split_from = False, None, None, None

    def __deepcopy__(self, memo):
        raise TypeError("cannot pickle 'torch._C._distributed_c10d.Options' object")


def test_own_options_copies_options_that_cannot_be_deep_copied():
    from datetime import timedelta

    parent = _PybindLikeOptions()
    parent.is_high_priority_stream, parent._timeout, parent.split_from = True, timedelta(seconds=77), "parent backend"
    child = torch_compat.own_options(parent)
    assert child is not parent and type(child) is _PybindLikeOptions
    assert (child.is_high_priority_stream, child._timeout, child.split_from) == (True, timedelta(seconds=77), None)


@pytest.mark.skipif(not hasattr(dist, "ProcessGroupNCCL"), reason="a CPU build of torch has no ProcessGroupNCCL")
def test_own_options_of_real_nccl_options():
    """The real NCCL options of the installed torch (CUDA builds; CI's torch-release venvs)."""
    from datetime import timedelta

    parent = dist.ProcessGroupNCCL.Options(is_high_priority_stream=True)
    parent._timeout = timedelta(seconds=77)
    child = torch_compat.own_options(parent)
    child._timeout = timedelta(seconds=1)  # what split_group does to the options it is given
    assert isinstance(child, dist.ProcessGroupNCCL.Options) and child.is_high_priority_stream
    assert parent._timeout == timedelta(seconds=77)
