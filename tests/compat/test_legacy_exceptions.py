"""What code that waits for a legacy exception sees: deepspeed 0.19.8 vs the shim vs migrated code.

Before ``deepspeed.initialize`` (no mpu, no device mesh) legacy ``deepspeed.utils.groups`` answers
some getters and raises in others (``_get_sequence_parallel_group``: ``KeyError``, code such as an SP
manager takes it for "retry later"). On fake ranks of 4 and 8, every getter that takes no argument is
called plain, under ``compat.install()`` and in the form the codemods write
(``codemods.rules.groups_getters.SIMPLE`` on ``current_mesh()``): the same values, and an error of the
legacy type where legacy raised. The bwc helpers and an mpu without pipeline getters are compared
the same way (``codemods.rules.mpu_internal.BWC`` on ``mesh_of(mpu)``).
"""

from __future__ import annotations

import inspect
import types

import pytest
import torch.distributed as dist
from megatron_mpu import MegatronMPU

from fakepg import fake_world

pytestmark = [
    pytest.mark.deepspeed,
    pytest.mark.filterwarnings("ignore::compat.deprecation.LegacyAPIDeprecationWarning"),
    pytest.mark.torch_releases,
]

WORLDS = [(1, 4), (7, 8)]

# lettered getters legacy serves only from AutoTP groups (AssertionError without them, even after
# deepspeed.initialize); their migrated form answers the mesh's groups. Whether a site may depend on
# that error is decided where the call is rewritten (the codemods), not by the mesh.
LETTERED_ANSWERED_BY_THE_MESH = {
    "get_data_parallel_group",
    "get_data_parallel_rank",
    "get_data_parallel_world_size",
    "get_model_parallel_group",
    "get_model_parallel_rank",
    "get_model_parallel_world_size",
    "get_tensor_model_parallel_group",
    "get_tensor_model_parallel_rank",
    "get_tensor_model_parallel_src_rank",
    "get_tensor_model_parallel_world_size",
}


def outcome(call):
    """``("ok", comparable value)`` or ``("raised", exception)``."""
    try:
        value = call()
    except Exception as err:  # noqa: BLE001 - the exception is what is compared
        return ("raised", err)
    if isinstance(value, dist.ProcessGroup):
        return ("ok", ("group", sorted(dist.get_process_group_ranks(value))))
    if isinstance(value, range):
        value = list(value)
    return ("ok", value if isinstance(value, (int, list, str, type(None))) else type(value).__name__)


def agrees(legacy, other) -> bool:
    """Same value, or an error that is an instance of the legacy error's type."""
    if legacy[0] == "raised":
        return other[0] == "raised" and isinstance(other[1], type(legacy[1]))
    return legacy == other


def groups_getters(module):
    """The module's own getters that take no argument (``get_*`` / ``_get_*``)."""
    found = {}
    for name, fn in vars(module).items():
        if not isinstance(fn, types.FunctionType) or not name.startswith(("get_", "_get_")):
            continue
        if name == "get_accelerator" or any(p.default is p.empty for p in inspect.signature(fn).parameters.values()):
            continue
        found[name] = fn
    return found


def legacy_and_shim(rank, world):
    import importlib

    import deepspeed.utils.groups as groups

    installer = importlib.import_module("compat.install")
    installer.uninstall()
    with fake_world(rank, world, deepspeed_comm=True):
        legacy = {name: outcome(fn) for name, fn in groups_getters(groups).items()}
    installer.install()
    try:
        with fake_world(rank, world, deepspeed_comm=True):
            shim = {name: outcome(getattr(groups, name)) for name in legacy}
    finally:
        installer.uninstall()
    return legacy, shim


def migrated(rank, world):
    """Each SIMPLE rewrite evaluated on ``current_mesh()`` before any engine (no default mesh)."""
    from codemods.rules.groups_getters import SIMPLE
    from mesh_core import set_default_mesh
    from mesh_core.roles.current import current_mesh

    set_default_mesh(None)
    with fake_world(rank, world, deepspeed_comm=True):
        return {
            name: outcome(lambda t=template: eval(t.format(mesh="current_mesh()"), {"current_mesh": current_mesh}))
            for name, template in SIMPLE.items()
        }


@pytest.mark.parametrize("rank,world", WORLDS)
def test_groups_getters_before_initialize_plain_shim_and_migrated(rank, world):
    import deepspeed  # noqa: F401

    legacy, shim = legacy_and_shim(rank, world)
    assert legacy["_get_sequence_parallel_group"][0] == "raised"
    assert type(legacy["_get_sequence_parallel_group"][1]) is KeyError
    assert legacy["_get_sequence_parallel_world_size"] == ("ok", 1)
    assert {n: o for n, o in shim.items() if not agrees(legacy[n], o)} == {}

    ours = migrated(rank, world)
    differ = {n for n, o in ours.items() if not agrees(legacy[n], o)}
    assert differ == LETTERED_ANSWERED_BY_THE_MESH
    assert all(legacy[n][0] == "raised" and isinstance(legacy[n][1], AssertionError) for n in differ)
    # the error code waits for says what to do, and is still legacy's KeyError
    err = ours["_get_sequence_parallel_group"][1]
    assert isinstance(err, KeyError) and err.args[0] == "No sequence parallel group found"
    assert "sequence-parallel" in str(err) and '"sp"' in str(err)
    shim_err = shim["_get_sequence_parallel_group"][1]
    assert isinstance(shim_err, KeyError) and shim_err.args[0] == "No sequence parallel group found"


def test_the_world_mesh_has_sp_of_one_and_no_sp_group():
    """current_mesh()'s fallback is still a DeepSpeedDeviceMesh; only its SP group query raises."""
    from mesh_core import DeepSpeedDeviceMesh, set_default_mesh
    from mesh_core.roles.current import current_mesh

    set_default_mesh(None)
    with fake_world(2, 8):
        mesh = current_mesh()
        assert isinstance(mesh, DeepSpeedDeviceMesh)
        assert (mesh.size("sp"), mesh.get_local_rank("sp"), mesh.size("dp")) == (1, 0, 8)
        assert sorted(dist.get_process_group_ranks(mesh.get_group("dp"))) == list(range(8))
        assert sorted(dist.get_process_group_ranks(mesh.get_group(("dp", "sp")))) == list(range(8))
        for dims in ("sp", ("sp",)):
            with pytest.raises(KeyError, match="No sequence parallel group found"):
                mesh.get_group(dims)
        # a mesh that does have SP answers it
        sp_mesh = DeepSpeedDeviceMesh.build(dp=4, sp=2, verify=False)
        set_default_mesh(sp_mesh)
        try:
            assert sorted(dist.get_process_group_ranks(current_mesh().get_group("sp"))) == [2, 3]
        finally:
            set_default_mesh(None)


# --- bwc helpers and an mpu without pipeline getters ----------------------------------------------
def tensor_data_mpu(world: int) -> MegatronMPU:
    """A Megatron-style mpu with data and tensor groups only (tp=2 consecutive, dp strided; each rank
    creates its own two groups), tp also under get_model_parallel_*."""
    return MegatronMPU.of_rank_lists(
        {"dp": [list(range(t, world, 2)) for t in range(2)], "tp": [[b, b + 1] for b in range(0, world, 2)]},
        member_only=True,
        names={"data_parallel": "dp", "tensor_model_parallel": "tp", "model_parallel": "tp"},
        getters=("group", "world_size", "rank"),
    )


@pytest.mark.parametrize("rank,world", WORLDS)
@pytest.mark.parametrize("with_mpu", [True, False])
def test_bwc_helpers_plain_shim_and_migrated(rank, world, with_mpu):
    import deepspeed.utils.bwc as legacy_bwc

    import compat.mpu as compat_bwc
    from codemods.rules.mpu_internal import BWC
    from mesh_core.roles.mpu_mesh import mesh_of

    with fake_world(rank, world):
        mpu = tensor_data_mpu(world) if with_mpu else None
        for name, (query, absent) in BWC.items():
            legacy = outcome(lambda: getattr(legacy_bwc, name)(mpu))
            ours = outcome(lambda: getattr(compat_bwc, name)(mpu))
            rewritten = f"mesh_of(mpu).{query} if mpu is not None else {absent}"  # what the codemod writes
            moved = outcome(lambda: eval(rewritten, {"mesh_of": mesh_of, "mpu": mpu}))
            assert agrees(legacy, ours), (name, legacy, ours)
            assert agrees(legacy, moved), (name, legacy, moved)
        if with_mpu:  # the pipeline answers of an mpu that has no pipeline getters
            assert outcome(lambda: legacy_bwc.bwc_pipeline_parallel_world_size(mpu)) == ("ok", 1)
            err = outcome(lambda: mesh_of(mpu).get_group("pp"))[1]
            assert isinstance(err, AssertionError) and isinstance(err, AttributeError)
            assert "does not support a pipeline parallel group" in str(err)
            assert mesh_of(mpu).get_local_rank("pp") == 0


def _engine_mpu_pipeline_answers(rank, world, monkeypatch, *, shim_installed):
    import contextlib
    import io

    import deepspeed
    import deepspeed.utils.bwc as legacy_bwc
    import torch

    for name, value in (("LOCAL_RANK", rank), ("RANK", rank), ("WORLD_SIZE", world)):
        monkeypatch.setenv(name, str(value))
    config = {
        "train_micro_batch_size_per_gpu": 1,
        "optimizer": {"type": "Adam", "params": {"torch_adam": True}},
        "steps_per_print": 10**6,
    }
    with fake_world(rank, world, deepspeed_comm=True), contextlib.redirect_stdout(io.StringIO()):
        mpu = tensor_data_mpu(world)
        engine, *_ = deepspeed.initialize(model=torch.nn.Linear(4, 4), config=config, mpu=mpu)
        assert (type(engine.mpu).__name__ == "MeshMPU") == shim_installed
        out = {
            "has pipe getters": [
                hasattr(engine.mpu, n) for n in ("get_pipe_parallel_group", "get_pipeline_model_parallel_world_size")
            ],
            "pp size": outcome(lambda: legacy_bwc.bwc_pipeline_parallel_world_size(engine.mpu)),
            "pp group": outcome(lambda: legacy_bwc.bwc_pipeline_parallel_group(engine.mpu)),
            "tp size": outcome(lambda: legacy_bwc.bwc_tensor_model_parallel_world_size(engine.mpu)),
            "dp": sorted(dist.get_process_group_ranks(engine.data_parallel_group)),
        }
        from deepspeed.utils import groups

        groups.mpu = None
        return out


@pytest.mark.parametrize("rank,world", WORLDS)
def test_the_engines_mpu_of_an_mpu_without_pipeline_getters(rank, world, monkeypatch):
    """deepspeed.initialize(mpu=<an mpu with no pipeline getters>): DeepSpeed's bwc helpers on
    engine.mpu answer pipeline size 1 and assert for the group, plain and under the shim."""
    import importlib

    import deepspeed  # noqa: F401

    installer = importlib.import_module("compat.install")
    installer.uninstall()
    legacy = _engine_mpu_pipeline_answers(rank, world, monkeypatch, shim_installed=False)
    installer.install()
    try:
        shimmed = _engine_mpu_pipeline_answers(rank, world, monkeypatch, shim_installed=True)
    finally:
        installer.uninstall()
    assert legacy["pp size"] == ("ok", 1) and legacy["pp group"][0] == "raised"
    assert legacy["has pipe getters"] == shimmed["has pipe getters"] == [False, False]
    for key in legacy:
        assert agrees(legacy[key], shimmed[key]) if key.startswith("pp") else legacy[key] == shimmed[key], key


@pytest.mark.parametrize("rank,world", WORLDS)
def test_expert_getters_before_any_expert_group(rank, world):
    """Legacy's named expert getters assert before any MoE layer built its groups; so does the shim.
    Their migrated form (``codemods.rules.groups_getters.EXPERT`` on ``current_mesh()``) builds the groups
    and answers: the mesh cannot tell a reader from the builder it also stands for, so a site that
    waits for that AssertionError is the codemods' to flag."""
    import importlib

    import deepspeed.utils.groups as groups

    from codemods.rules.groups_getters import EXPERT
    from mesh_core import set_default_mesh
    from mesh_core.roles.current import current_mesh

    installer = importlib.import_module("compat.install")
    results = {}
    for mode in ("legacy", "shim", "migrated"):
        if mode == "shim":
            installer.install()
        else:
            installer.uninstall()
        set_default_mesh(None)
        with fake_world(rank, world, deepspeed_comm=True):
            if mode == "migrated":
                results[mode] = {
                    n: outcome(lambda t=t: eval(t.format(mesh="current_mesh()", n=2), {"current_mesh": current_mesh}))
                    for n, t in EXPERT.items()
                }
            else:
                results[mode] = {n: outcome(lambda n=n: getattr(groups, n)("ep_size_2")) for n in EXPERT}
    installer.uninstall()
    assert all(o[0] == "raised" and isinstance(o[1], AssertionError) for o in results["legacy"].values())
    assert all(agrees(results["legacy"][n], results["shim"][n]) for n in EXPERT)
    assert all(o[0] == "ok" for o in results["migrated"].values())
