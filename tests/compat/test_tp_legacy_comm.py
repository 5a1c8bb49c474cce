"""``deepspeed.utils.groups._init_tp_mesh_device`` under the shim, legacy vs shim in one process.

DeepSpeed's own unit tests (``unit/model_parallelism/test_autotp_training.py``) replace
``deepspeed.comm``'s ``get_world_size`` / ``get_rank`` / ``new_group`` / ``initialize_mesh_device``
with fakes (no process group at all) and expect DeepSpeed's call sequence and return values. The
shim calls such replacements the way DeepSpeed does; with deepspeed.comm untouched, the groups come
from the mesh (no replacement in sight, nothing created outside mesh_core).
"""

from __future__ import annotations

import importlib

import pytest
import torch.distributed as dist

from compat import group_trace
from fakepg import FAKE_RANK, FAKE_WORLD
from mesh_core.runtime_hooks import registry_for_world

pytestmark = [
    pytest.mark.deepspeed,
    pytest.mark.filterwarnings("ignore::compat.deprecation.LegacyAPIDeprecationWarning"),
    pytest.mark.torch_releases,
]
SPLIT_ERROR = "No backend for the parent process group or its backend does not support splitting"


class FakeMesh:
    """What a replaced ``initialize_mesh_device`` may hand back: ``get_group(mesh_dim=...)``."""

    def __init__(self, shape, names):
        self.shape, self.names = tuple(shape), tuple(names)

    def get_group(self, mesh_dim):
        return ("mesh", mesh_dim)


def _patch_comm(monkeypatch, groups, *, rank, initialize_mesh_device, calls):
    def fake_new_group(ranks):
        calls.append(("new_group", tuple(ranks)))
        return tuple(ranks)

    def fake_initialize_mesh_device(shape, names):
        calls.append(("initialize_mesh_device", tuple(shape), tuple(names)))
        if initialize_mesh_device == "split_error":
            raise RuntimeError(SPLIT_ERROR)
        if initialize_mesh_device == "other_error":
            raise RuntimeError("some other DeviceMesh failure")
        return FakeMesh(shape, names)

    for name in ("_DATA_PARALLEL_GROUP", "_MODEL_PARALLEL_GROUP", "_TENSOR_MODEL_PARALLEL_GROUP"):
        monkeypatch.setattr(groups, name, None)
    monkeypatch.setattr(groups.dist, "get_world_size", lambda group=None: 4)
    monkeypatch.setattr(groups.dist, "get_rank", lambda group=None: rank)
    monkeypatch.setattr(groups.dist, "new_group", fake_new_group)
    monkeypatch.setattr(groups.dist, "initialize_mesh_device", fake_initialize_mesh_device)
    monkeypatch.setattr(groups, "log_dist", lambda *args, **kwargs: None)


def _observe(groups, *, rank, detail, initialize_mesh_device, tp=2):
    """Call sequence, return value (or error) and getter answers of ``groups._init_tp_mesh_device``."""
    calls: list = []
    with pytest.MonkeyPatch.context() as monkeypatch:
        _patch_comm(monkeypatch, groups, rank=rank, initialize_mesh_device=initialize_mesh_device, calls=calls)
        if detail:
            monkeypatch.setenv("TORCH_DISTRIBUTED_DEBUG", "DETAIL")
        else:
            monkeypatch.delenv("TORCH_DISTRIBUTED_DEBUG", raising=False)
        try:
            result = groups._init_tp_mesh_device(tensor_model_parallel_size=tp)
        except RuntimeError as exc:
            return calls, ("raised", str(exc)), None
        # (the size / rank getters are not compared: DeepSpeed asks the fake get_world_size(group=...),
        # which answers 4 for every group; the shim answers the layout's sizes, checked below)
        getters = (
            groups.get_data_parallel_group(),
            groups.get_tensor_model_parallel_group(),
            groups.get_model_parallel_group(),
        )
        if _shim_installed():
            getters += (
                (
                    groups.get_tensor_model_parallel_world_size(),
                    groups.get_tensor_model_parallel_rank(),
                    groups.get_data_parallel_world_size(),
                    groups.get_data_parallel_rank(),
                    groups.get_tensor_model_parallel_src_rank(),
                ),
            )
        again = groups._init_tp_mesh_device(tensor_model_parallel_size=tp)  # groups exist: None, no calls
    return calls, (result, again), getters


def _installer():
    return importlib.import_module("compat.install")  # the module (compat.install may name the function)


def _shim_installed() -> bool:
    return _installer().is_installed()


CASES = [
    pytest.param(True, "fail", id="debug-detail"),
    pytest.param(False, "split_error", id="split-error-fallback"),
    pytest.param(False, "mesh", id="replaced-initialize_mesh_device"),
    pytest.param(False, "other_error", id="other-error-raises"),
]


@pytest.mark.parametrize("detail,initialize_mesh_device", CASES)
@pytest.mark.parametrize("rank", [0, 1, 2, 3])
def test_replaced_deepspeed_comm_is_called_like_legacy(detail, initialize_mesh_device, rank):
    import deepspeed  # noqa: F401
    from deepspeed.utils import groups

    installer = _installer()

    assert not installer.is_installed()
    legacy = _observe(groups, rank=rank, detail=detail, initialize_mesh_device=initialize_mesh_device)
    installer.install()
    try:
        # a fresh process as in DeepSpeed's harness: no groups state (or engines' grids) left by other tests
        importlib.import_module("compat.groups")._release_process_group_references()
        shim = _observe(groups, rank=rank, detail=detail, initialize_mesh_device=initialize_mesh_device)
    finally:
        installer.uninstall()
    layout = shim[2][3] if shim[2] is not None else None
    assert shim[:2] == legacy[:2]  # same calls in the same order, same return values (or error)
    if legacy[2] is None:
        assert shim[2] is None
        return
    assert shim[2][:3] == legacy[2]  # the getters hand out what the replacement returned
    assert layout == (2, rank % 2, 2, rank // 2, rank - rank % 2)  # tp size / rank, dp size / rank, src
    expected = {
        "fail": [("new_group", r) for r in ((0, 2), (1, 3), (0, 1), (2, 3))],
        "split_error": [("initialize_mesh_device", (2, 2), ("data_parallel", "tensor_parallel"))]
        + [("new_group", r) for r in ((0, 2), (1, 3), (0, 1), (2, 3))],
        "mesh": [("initialize_mesh_device", (2, 2), ("data_parallel", "tensor_parallel"))],
    }[initialize_mesh_device]
    assert legacy[0] == expected


# (shim before world: the world teardown then resets the shim's groups state, as DeepSpeed's does)
def test_legacy_global_writes_reach_the_shim_state(shim, world):
    from deepspeed.utils import groups

    import compat.groups as cgroups

    dp_group, tp_group = groups._init_tp_mesh_device(2)
    assert groups._TENSOR_MODEL_PARALLEL_GROUP is tp_group and groups._DATA_PARALLEL_GROUP is dp_group
    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.setattr(groups, "_TENSOR_MODEL_PARALLEL_GROUP", None)  # DeepSpeed's tests reset TP like this
        monkeypatch.setattr(groups, "_DATA_PARALLEL_GROUP", None)
        assert cgroups._state.tp_group is None and cgroups._state.dp_group is None
        again = groups._init_tp_mesh_device(2)  # rebuilt, not "already exists"
        assert again == (dp_group, tp_group)  # the same rank sets: the registry's communicators
    # the undo wrote the old values back through the state; nothing shadows compat's views
    assert "_TENSOR_MODEL_PARALLEL_GROUP" not in vars(cgroups) and "_DATA_PARALLEL_GROUP" not in vars(cgroups)
    assert groups.get_tensor_model_parallel_group() is tp_group


@pytest.mark.parametrize("detail", [False, True], ids=["mesh", "debug-detail"])
def test_untouched_deepspeed_comm_serves_tp_groups_from_the_mesh(shim, world, monkeypatch, detail):
    from deepspeed.utils import groups

    if detail:
        monkeypatch.setenv("TORCH_DISTRIBUTED_DEBUG", "DETAIL")
    else:
        monkeypatch.delenv("TORCH_DISTRIBUTED_DEBUG", raising=False)
    monkeypatch.setenv("DS_MESH_STRICT", "1")  # a group created outside mesh_core raises
    with group_trace.trace() as records:
        dp_group, tp_group = groups._init_tp_mesh_device(2)
    assert all(r.inside_mesh_core for r in records), records
    assert sorted(dist.get_process_group_ranks(tp_group)) == [0, 1]  # rank 1 of 4: tp block (0, 1)
    assert sorted(dist.get_process_group_ranks(dp_group)) == [1, 3]
    assert registry_for_world().has([0, 1]) and registry_for_world().has([1, 3])
    assert groups.get_tensor_model_parallel_rank() == FAKE_RANK % 2
    assert groups.get_data_parallel_world_size() == FAKE_WORLD // 2
