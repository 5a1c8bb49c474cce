"""compat.install(): what it patches, that uninstall() restores it, both import orders, the
DS_MESH=1 start-up hook, the ``deepspeed.initialize`` wrapper (config "mesh" section, mpu= /
mesh_param= translation, conflicts, TODOV1 warnings) and two engines in one world.

Engines are built with the real deepspeed under the fake process group (one process acting as one
rank of a world of 4); the 4-process gloo training runs are in test_e2e_shim.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types
import warnings

import pytest
import torch
import torch.distributed as dist
import wrapt
from megatron_mpu import ALL_GETTERS, MegatronMPU
from torch.testing._internal.distributed.fake_pg import FakeStore

import compat.install as installer
from compat.deprecation import LegacyAPIDeprecationWarning
from fakepg import FAKE_RANK, FAKE_WORLD, fake_world, group_count
from mesh_core import MeshSpecError

pytestmark = [pytest.mark.deepspeed, pytest.mark.torch_releases]
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RANK, WORLD = FAKE_RANK, FAKE_WORLD  # the conftest `world` fixture


def snapshot_deepspeed() -> dict[str, dict[str, object]]:
    """Every attribute of every imported deepspeed module (and the patched classes' methods)."""
    import deepspeed.runtime.config as config
    import deepspeed.runtime.engine as engine
    import deepspeed.runtime.pipe.engine as pipe_engine

    snap = {name: dict(vars(mod)) for name, mod in sys.modules.items() if name.startswith("deepspeed") and mod}
    for cls in (config.DeepSpeedConfig, engine.DeepSpeedEngine, pipe_engine.PipelineEngine):
        snap[f"{cls.__module__}.{cls.__name__}"] = dict(vars(cls))
    return snap


def differences(before: dict, after: dict) -> list[str]:
    return [
        f"{owner}.{name}"
        for owner, names in before.items()
        for name, value in names.items()
        if after.get(owner, {}).get(name, value) is not value
    ]


def tiny_config(**extra) -> dict:
    return {
        "train_micro_batch_size_per_gpu": 1,
        "optimizer": {"type": "Adam", "params": {"torch_adam": True}},
        "steps_per_print": 10**6,
        **extra,
    }


def assert_migration_row_exists(message: str) -> None:
    """The ``ds-migrate --explain <code>`` a TODOV1 warning names prints a catalog row (a MIGRATION.md row)."""
    import ds_mesh_advice

    code = " ".join(message.split()).rsplit("(ds-migrate --explain ", 1)[1].removesuffix(")").strip("'")
    (row,) = [r for r in ds_mesh_advice.find(code) if isinstance(r, ds_mesh_advice.Row)]
    with open(os.path.join(ROOT, "MIGRATION.md"), encoding="utf-8") as fh:
        assert f"| {row.api} |" in fh.read(), row.api


def ranks(group) -> list[int]:
    return sorted(dist.get_process_group_ranks(group))


# --- patching and restoring ------------------------------------------------------------------
def test_install_routes_every_binding_and_uninstall_restores_every_name():
    import deepspeed
    import deepspeed.runtime.pipe.module as pipe_module
    import deepspeed.utils as ds_utils
    from deepspeed.runtime.engine import DeepSpeedEngine
    from deepspeed.utils import groups

    import compat.groups
    import compat.topology

    installer.uninstall()
    before = snapshot_deepspeed()
    before_forward = vars(DeepSpeedEngine)["forward"]
    installer.install()
    try:
        installer.install()  # twice is harmless: nothing is wrapped twice
        changed = differences(before, snapshot_deepspeed())
        assert groups._get_data_parallel_group is compat.groups._get_data_parallel_group
        # star-import copies in deepspeed.utils and from-import copies in pipe/module.py
        assert ds_utils.get_data_parallel_group is compat.groups.get_data_parallel_group
        assert pipe_module.PipelineParallelGrid is compat.topology.PipelineParallelGrid
        assert pipe_module.PipeDataParallelTopology is compat.topology.PipeDataParallelTopology
        assert isinstance(deepspeed.initialize, wrapt.FunctionWrapper)
        forward = vars(DeepSpeedEngine)["forward"]
        assert forward is not before_forward and forward.__wrapped__ is before_forward  # scoped once, not twice
        assert not isinstance(deepspeed.initialize.__wrapped__, wrapt.FunctionWrapper)
        assert type(groups) is not types.ModuleType
        # the module state the engine writes is one source of truth with compat.groups
        marker = object()
        groups.mpu = marker
        assert compat.groups.mpu is marker and groups.mpu is marker
        groups.mpu = None
        assert "deepspeed.utils.get_data_parallel_group" in changed
        assert len(installer.patched_names()) == len(set(installer.patched_names()))
    finally:
        installer.uninstall()
    assert differences(before, snapshot_deepspeed()) == []
    assert type(groups) is types.ModuleType
    assert not installer.is_installed()
    assert changed, "install() patched nothing"


def test_every_legacy_groups_function_is_routed():
    from deepspeed.utils import groups

    import compat.groups

    installer.uninstall()
    legacy = [
        n
        for n, v in vars(groups).items()
        if isinstance(v, types.FunctionType) and v.__module__ == "deepspeed.utils.groups"
    ]
    installer.install()
    try:
        assert len(legacy) > 50
        assert [n for n in legacy if getattr(groups, n) is not getattr(compat.groups, n, None)] == []
    finally:
        installer.uninstall()


def test_groups_state_survives_destroy_process_group(shim, monkeypatch):
    import deepspeed
    import deepspeed.comm as dscomm
    from deepspeed.utils import groups

    import compat.groups
    from fakepg import init_deepspeed_comm

    monkeypatch.setenv("LOCAL_RANK", str(RANK))
    meshes = []
    for _ in range(2):  # a world, torn down, then a fresh one
        with fake_world(RANK, WORLD):
            init_deepspeed_comm()
            engine = deepspeed.initialize(model=torch.nn.Linear(4, 4), config=tiny_config())[0]
            meshes.append(engine.mesh_device)
            assert groups.mesh_device is compat.groups.mesh_device
            groups.mpu = object()
            assert compat.groups.mpu is groups.mpu
            dscomm.destroy_process_group()  # calls groups._release_process_group_references()
            assert groups.mpu is None and compat.groups.mpu is None and compat.groups.bound_mesh() is None
            assert not dist.is_initialized()
            # a fresh world for fake_world's own teardown
            dist.init_process_group("fake", store=FakeStore(), rank=RANK, world_size=WORLD)
    assert meshes[0] is not meshes[1]


IMPORT_ORDER_SCRIPT = r"""
import json, os, sys, torch
sys.path.insert(0, {tests!r}); sys.path.insert(0, {root!r})
import compat.install as installer
if {before}:
    installer.install()
import deepspeed
if not {before}:
    installer.install()
import compat.groups, compat.topology
from deepspeed.runtime.pipe import module as pipe_module
from fakepg import fake_world
os.environ.update(LOCAL_RANK="1", RANK="1", WORLD_SIZE="4")
out = {{
    "utils_copy": deepspeed.utils.get_data_parallel_group is compat.groups.get_data_parallel_group,
    "grid": pipe_module.PipelineParallelGrid is compat.topology.PipelineParallelGrid,
}}
with fake_world(1, 4, deepspeed_comm=True):
    engine, *_ = deepspeed.initialize(model=torch.nn.Linear(4, 4), config={config!r})
    out["mesh"] = type(engine.mesh_device).__name__
    out["dp_is_mesh_dp"] = engine.data_parallel_group is engine.mesh_device.get_group("dp")
print("RESULT" + json.dumps(out))
"""


def run_python(code: str, env: dict | None = None) -> str:
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1", **(env or {})),
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc.stdout


@pytest.mark.parametrize("before", [True, False], ids=["install-before-import", "install-after-import"])
def test_install_before_and_after_import_deepspeed(before):
    code = IMPORT_ORDER_SCRIPT.format(
        tests=os.path.dirname(os.path.dirname(__file__)), root=ROOT, before=before, config=tiny_config(mesh={"dp": 4})
    )
    line = next(l for l in run_python(code).splitlines() if l.startswith("RESULT"))
    assert json.loads(line[len("RESULT") :]) == {
        "utils_copy": True,
        "grid": True,
        "mesh": "EngineMesh",
        "dp_is_mesh_dp": True,
    }


UNCHANGED_SCRIPT = r"""
import os, sys, torch
sys.path.insert(0, {tests!r})
import deepspeed  # the script never imports compat
from fakepg import fake_world
os.environ.update(LOCAL_RANK="1", RANK="1", WORLD_SIZE="4")
with fake_world(1, 4, deepspeed_comm=True):
    engine, *_ = deepspeed.initialize(model=torch.nn.Linear(4, 4), config={config!r})
    print("MESH", type(getattr(engine, "mesh_device", None)).__name__)
"""


@pytest.mark.parametrize("value,expected", [("1", "EngineMesh"), ("0", "NoneType")])
def test_ds_mesh_env_opt_in_runs_unchanged_script_on_the_mesh(tmp_path, value, expected):
    site_dir = tmp_path / "site"
    site_dir.mkdir()
    pth = installer.write_pth(str(site_dir))
    script = tmp_path / "train.py"
    script.write_text(UNCHANGED_SCRIPT.format(tests=os.path.dirname(os.path.dirname(__file__)), config=tiny_config()))
    # site.addsitedir processes the .pth exactly as interpreter start-up does for site-packages
    code = (
        f"import site, runpy, sys; sys.path.insert(0, {ROOT!r}); site.addsitedir({str(site_dir)!r}); "
        f"runpy.run_path({str(script)!r}, run_name='__main__')"
    )
    out = run_python(code, env={"DS_MESH": value, "PYTHONPATH": ROOT})
    assert os.path.basename(pth) == "ds_mesh.pth"
    assert f"MESH {expected}" in out


def test_package_level_install_works_after_the_submodule_is_imported():
    import compat
    import compat.install  # noqa: F401  (binds the package attribute "install" to the submodule)

    try:
        compat.install()
        assert installer.is_installed()
    finally:
        compat.uninstall()
    assert not installer.is_installed()


def test_install_from_env_reads_the_variable():
    assert installer.install_from_env({}) is False
    assert installer.install_from_env({"DS_MESH": "0"}) is False
    assert not installer.is_installed()


# --- the initialize wrapper ------------------------------------------------------------------
def test_mesh_param_is_translated_into_the_engine_mesh_and_warns_once(shim, world):
    import deepspeed

    # a first engine imports what the engine imports (sympy adds a filter: a real change re-arms every site)
    with warnings.catch_warnings(record=True) as first:  # its own call site's warning, kept out of the summary
        engines = [deepspeed.initialize(model=torch.nn.Linear(4, 4), config=tiny_config(), mesh_param=(2, 2))[0]]
    assert [w for w in first if issubclass(w.category, LegacyAPIDeprecationWarning) and "mesh_param" in str(w.message)]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):  # one call site, called twice: one warning
            engines.append(
                deepspeed.initialize(model=torch.nn.Linear(4, 4), config=tiny_config(), mesh_param=(2, 2))[0]
            )
    ours = [w for w in caught if issubclass(w.category, LegacyAPIDeprecationWarning) and w.filename == __file__]
    assert len(ours) == 1 and str(ours[0].message).startswith("TODOV1: deepspeed.initialize(mesh_param=...)")
    assert_migration_row_exists(str(ours[0].message))
    engine = engines[0]
    mesh = engine.mesh_device
    assert mesh.spec.shape == {"dp": 2, "sp": 2}
    # the legacy mesh_param layout: sp consecutive, dp strided
    assert ranks(engine.seq_parallel_group) == [0, 1] == mesh.get_group_ranks("sp")
    assert ranks(engine.data_parallel_group) == [1, 3] == mesh.get_group_ranks("dp")
    assert engine.data_parallel_group is mesh.get_group("dp")
    # ZeRO/gradient group: dp x sp, whichever way the layout was stated
    assert engine.seq_data_parallel_group is mesh.get_group(("dp", "sp"))
    # legacy torch-DeviceMesh calls on engine.mesh_device keep working
    assert mesh.get_group(mesh_dim="data_parallel") is mesh.get_group("dp")
    assert mesh.get_group("sequence_parallel") is mesh.get_group("sp")
    assert mesh.size(mesh_dim="sequence_parallel") == 2 and mesh.size() == WORLD
    assert mesh.get_local_rank("sequence_parallel") == 1 and mesh.get_local_rank("data_parallel") == 0
    assert mesh.mesh.tolist() == [[0, 1], [2, 3]]
    assert engine.train_batch_size() == 2  # batches sized by dp, as with deepspeed's own mesh


def test_config_mesh_section_gives_the_same_engine_as_mesh_param(shim, world):
    import deepspeed

    by_section = deepspeed.initialize(model=torch.nn.Linear(4, 4), config=tiny_config(mesh={"sp": 2}))[0]
    by_keys = deepspeed.initialize(
        model=torch.nn.Linear(4, 4), config=tiny_config(data_parallel_size=2, sequence_parallel_size=2)
    )[0]
    for engine in (by_section, by_keys):
        assert engine.mesh_device.spec.shape == {"dp": 2, "sp": 2}
        assert ranks(engine.seq_parallel_group) == [0, 1] and ranks(engine.data_parallel_group) == [1, 3]
    assert by_section.mesh_device is not by_keys.mesh_device  # one mesh per engine ...
    assert by_section.data_parallel_group is by_keys.data_parallel_group  # ... sharing communicators


def test_config_file_from_args_with_mesh_section(shim, world, tmp_path):
    import argparse

    import deepspeed

    path = tmp_path / "ds_config.json"
    # autotp_size 1: tp groups only (a plain Linear has no AutoTP policy; mesh.tp alone enables AutoTP)
    path.write_text(json.dumps(tiny_config(mesh={"tp": 2}, tensor_parallel={"autotp_size": 1})))
    args = argparse.Namespace(deepspeed_config=str(path), local_rank=RANK)
    engine = deepspeed.initialize(args=args, model=torch.nn.Linear(4, 4))[0]
    assert engine.mesh_device.spec.shape == {"dp": 2, "tp": 2}
    assert args.deepspeed_config == str(path)  # the caller's args are not modified


@pytest.mark.parametrize(
    "kwargs,both",
    [
        ({"config": tiny_config(mesh={"dp": 4}), "mesh_param": (2, 2)}, ("config 'mesh' section", "mesh_param=(2, 2)")),
        (
            {"config": tiny_config(mesh={"sp": 2}, sequence_parallel_size=4)},
            ("config 'mesh' section", "sequence_parallel_size"),
        ),
        (
            {"config": tiny_config(mesh={"tp": 2}, tensor_parallel={"autotp_size": 4})},
            ("config 'mesh' section", "tensor_parallel.autotp_size"),
        ),
        ({"config": tiny_config(mesh={"pp": 2})}, ("pp=2", "not a PipelineModule")),
        ({"config": tiny_config(mesh={"dp": 3})}, ("dp=3", "world_size=4")),
        ({"config": tiny_config(mesh={"cp": 2})}, ("'cp'", "valid keys")),
    ],
    ids=[
        "section-vs-mesh_param",
        "section-vs-sp-key",
        "section-vs-autotp",
        "pp-without-pipeline",
        "bad-size",
        "unknown-key",
    ],
)
def test_conflicting_or_bad_layouts_fail_naming_both_before_any_group(shim, world, kwargs, both):
    import deepspeed

    before = group_count()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LegacyAPIDeprecationWarning)
        with pytest.raises(MeshSpecError) as err:
            deepspeed.initialize(model=torch.nn.Linear(4, 4), **kwargs)
    assert all(text in str(err.value) for text in both), str(err.value)
    assert group_count() == before


def test_pipeline_module_and_config_mesh_must_agree(shim, world):
    import deepspeed
    from deepspeed.pipe import PipelineModule

    model = PipelineModule(
        layers=[torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)], num_stages=2, loss_fn=torch.nn.MSELoss()
    )
    before = group_count()
    with pytest.raises(MeshSpecError, match=r"config 'mesh' section sets pp=4 but PipelineModule topology sets pp=2"):
        deepspeed.initialize(model=model, config=tiny_config(mesh={"pp": 4, "dp": 1}))
    assert group_count() == before
    engine = deepspeed.initialize(
        model=model, config=tiny_config(mesh={"pp": 2}, train_micro_batch_size_per_gpu=2, gradient_accumulation_steps=1)
    )[0]
    assert engine.mesh_device is model.mpu().mesh
    assert engine.mesh_device.get_group("pp") is engine.grid.get_pipe_parallel_group()


def test_a_mesh_built_beforehand_becomes_the_engine_mesh(shim, world):
    import deepspeed

    from mesh_core import DeepSpeedDeviceMesh

    mesh = DeepSpeedDeviceMesh.build(tp=2)
    engine = deepspeed.initialize(model=torch.nn.Linear(4, 4), config=tiny_config(), mesh=mesh)[0]
    assert engine.mesh_device is mesh and engine.data_parallel_group is mesh.get_group("dp")
    before = group_count()
    with pytest.raises(MeshSpecError, match=r"config 'mesh' section sets sp=2 but mesh= sets sp=1"):
        deepspeed.initialize(model=torch.nn.Linear(4, 4), config=tiny_config(mesh={"sp": 2}), mesh=mesh)
    with pytest.raises(MeshSpecError, match="mesh= must be a DeepSpeedDeviceMesh"):
        deepspeed.initialize(model=torch.nn.Linear(4, 4), config=tiny_config(), mesh="tp=2")
    assert group_count() == before


# --- several engines in one world ------------------------------------------------------------
def test_two_models_get_their_own_meshes_and_share_identical_rank_sets(shim, world):
    import deepspeed

    from compat import groups as compat_groups

    actor = deepspeed.initialize(
        model=torch.nn.Linear(4, 4), config=tiny_config(mesh={"tp": 2}, tensor_parallel={"autotp_size": 1})
    )[0]
    before = group_count()
    reference = deepspeed.initialize(model=torch.nn.Linear(4, 4), config=tiny_config(mesh={"dp": 2, "sp": 2}))[0]
    am, rm = actor.mesh_device, reference.mesh_device
    assert am is not rm
    assert am.spec.shape == {"dp": 2, "tp": 2} and rm.spec.shape == {"dp": 2, "sp": 2}
    assert ranks(actor.data_parallel_group) == [1, 3] and ranks(reference.seq_parallel_group) == [0, 1]
    # identical rank sets ([0,1] as actor tp / reference sp, [1,3] as both dp) are one communicator
    assert am.get_group("tp") is rm.get_group("sp")
    assert am.get_group("dp") is rm.get_group("dp")
    assert group_count() == before  # the reference model needed no new communicator
    # nothing leaks: each engine runs with its own groups; afterwards the previous state is back
    seen = []
    for engine in (actor, reference, actor):
        engine.module.register_forward_hook(lambda *_: seen.append(compat_groups.bound_mesh()))
        loss = engine(torch.randn(2, 4)).sum()
        engine.backward(loss)
        engine.step()
        # two layouts alive: outside the steps no grid is served (issue 11, wrong-grid protection)
        assert compat_groups.bound_mesh() is None and compat_groups._WRONG_GRID is not None
    assert seen[0] is am and seen[1] is rm
    assert reference.seq_data_parallel_group is rm.get_group(("dp", "sp"))
    assert actor.seq_data_parallel_group is am.get_group("dp")


# --- the layout sources, as pure data (no process group) ---------------------------------------
class _SizesMPU:
    """A Megatron-style mpu reporting fixed sizes."""

    def __init__(self, dp: int, tp: int) -> None:
        self._dp, self._tp = dp, tp

    def get_data_parallel_world_size(self):
        return self._dp

    def get_tensor_model_parallel_world_size(self):
        return self._tp


LAYOUTS = [(dp, sp, tp) for dp in (1, 2, 4, 8) for sp in (1, 2, 4) for tp in (1, 2, 4) if dp * sp * tp == 8]


def test_engine_spec_agrees_with_every_source_or_names_two_that_disagree():
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from compat.engine_spec import SECTION_SOURCE, engine_spec

    @settings(max_examples=200, deadline=None)
    @given(st.sampled_from(LAYOUTS), st.data())
    def check(layout, data):
        dp, sp, tp = layout
        sizes = {"dp": dp, "sp": sp, "tp": tp}
        mpu = _SizesMPU(dp, tp) if sp == 1 and data.draw(st.booleans(), "mpu") else None
        mesh_param = (dp, sp) if tp == 1 and mpu is None and data.draw(st.booleans(), "mesh_param") else None
        stated = {d: [] for d in sizes}  # dim -> sources stating it
        if mpu is not None:
            stated["dp"].append("mpu"), stated["tp"].append("mpu")
        if mesh_param is not None:
            stated["dp"].append("mesh_param"), stated["sp"].append("mesh_param")
        config: dict = {}
        section = {}
        for dim, size in sizes.items():
            must = size > 1 and dim != "dp" and not stated[dim]  # dp alone may be left to "auto"
            if must or data.draw(st.booleans(), f"state {dim}"):
                where = data.draw(st.sampled_from(["section", "key"] if dim != "dp" else ["section"]), dim)
                if where == "section":
                    section[dim] = size
                elif dim == "sp":
                    config["sequence_parallel_size"] = size
                else:
                    config["tensor_parallel"] = {"autotp_size": size}
                stated[dim].append(where)
        if section:
            config["mesh"] = section
        spec = engine_spec(config, 8, mpu=mpu, mesh_param=mesh_param)
        assert {d: spec.dim_size(d) for d in sizes} == sizes
        # change the section's value of a dim another source also states: both are named
        doubly = [d for d in section if len(stated[d]) > 1]
        if doubly:
            dim = data.draw(st.sampled_from(doubly), "conflict")
            wrong = dict(config, mesh=dict(section, **{dim: sizes[dim] * 2}))
            with pytest.raises(MeshSpecError) as err:
                engine_spec(wrong, 8, mpu=mpu, mesh_param=mesh_param)
            message = str(err.value)
            assert message.startswith(f"{SECTION_SOURCE} sets {dim}={sizes[dim] * 2} but ")
            assert f"sets {dim}={sizes[dim]};" in message

    check()


@pytest.mark.filterwarnings("ignore::compat.deprecation.LegacyAPIDeprecationWarning")
def test_an_engines_own_groups_serve_its_rank_getters_and_checkpointing(shim, world, tmp_path):
    """Engine methods that read ``groups`` outside forward/backward/step (rank getters, the
    checkpoint writer choice) see that engine's mesh, not the last engine built."""
    import deepspeed

    from compat import groups as compat_groups

    actor = deepspeed.initialize(
        model=torch.nn.Linear(4, 4), config=tiny_config(mesh={"tp": 2}, tensor_parallel={"autotp_size": 1})
    )[0]
    reference = deepspeed.initialize(model=torch.nn.Linear(4, 4), config=tiny_config())[0]
    assert actor.mesh_device.get_local_rank("dp") == 0 and reference.mesh_device.get_local_rank("dp") == RANK
    assert actor.get_data_parallel_rank() == 0 and reference.get_data_parallel_rank() == RANK
    assert actor.get_tensor_parallel_rank() == actor.get_model_parallel_rank() == 1
    seen = []
    for engine in (actor, reference):
        engine._save_checkpoint = lambda *_, **__: seen.append(compat_groups._get_data_parallel_rank())
        engine.save_checkpoint(str(tmp_path))
    assert seen == [0, RANK]
    assert compat_groups.bound_mesh() is None  # the previous state is back: two layouts, none served (issue 11)


def test_the_engine_mesh_runs_on_the_default_groups_device(shim, world, monkeypatch):
    """Like every mesh compat builds, the engine's mesh takes the default group's device type
    (cuda under NCCL), not a hard-wired "cpu"."""
    import deepspeed

    import compat.initialize as compat_initialize

    monkeypatch.setattr(compat_initialize, "default_device_type", lambda: "meta")
    engine = deepspeed.initialize(
        model=torch.nn.Linear(4, 4), config=tiny_config(mesh={"tp": 2}, tensor_parallel={"autotp_size": 1})
    )[0]
    assert engine.mesh_device.device_type == "meta"
    assert engine.mesh_device.device_mesh.device_type == "meta"


def _tensor_outer_mpu() -> MegatronMPU:
    """A Megatron-style mpu whose dp groups are consecutive ranks ([0, 1], [2, 3]) and whose tp
    groups are strided ([0, 2], [1, 3]): a valid layout, just not the mesh's default order."""
    return MegatronMPU.of_rank_lists(
        {"tp": ([0, 2], [1, 3]), "dp": ([0, 1], [2, 3])},
        names={"data_parallel": "dp", "tensor_model_parallel": "tp", "model_parallel": "tp"},
        getters={
            "data_parallel": ALL_GETTERS,
            "tensor_model_parallel": ("group", "world_size", "rank"),
            "model_parallel": ("group", "world_size", "rank"),
        },
    )


@pytest.mark.filterwarnings("ignore::compat.deprecation.LegacyAPIDeprecationWarning")
def test_an_mpu_or_mesh_in_its_own_rank_order_is_taken_as_is_unless_the_config_states_another(shim, world):
    import deepspeed

    from mesh_core import DeepSpeedDeviceMesh

    mpu = _tensor_outer_mpu()
    engine = deepspeed.initialize(model=torch.nn.Linear(4, 4), config=tiny_config(), mpu=mpu)[0]
    assert engine.data_parallel_group is mpu.get_data_parallel_group()  # as without the shim
    assert engine.mesh_device.get_group_ranks("dp") == [0, 1] and engine.mesh_device.get_group_ranks("tp") == [1, 3]
    given = DeepSpeedDeviceMesh.build(order=("tp", "dp"), tp=2, dp=2)
    assert deepspeed.initialize(model=torch.nn.Linear(4, 4), config=tiny_config(), mesh=given)[0].mesh_device is given
    with pytest.raises(MeshSpecError, match="the config.*mpu=MegatronMPU"):
        deepspeed.initialize(model=torch.nn.Linear(4, 4), config=tiny_config(mesh={"order": ["dp", "tp"]}), mpu=mpu)


@pytest.mark.filterwarnings("ignore::compat.deprecation.LegacyAPIDeprecationWarning")
def test_the_ulysses_sequence_parallel_module_as_mpu_runs_on_the_mesh(shim, world):
    """Unchanged Ulysses scripts pass DeepSpeed's parallel_state_sp module as mpu; the engine gets
    the mesh of its layout (sp consecutive, dp across) and keeps the module's sp communicator."""
    import deepspeed
    from deepspeed.runtime.sequence_parallel import parallel_state_sp

    parallel_state_sp.initialize_sequence_parallel(2)
    engine = deepspeed.initialize(model=torch.nn.Linear(4, 4), config=tiny_config(), mpu=parallel_state_sp)[0]
    mesh = engine.mesh_device
    assert mesh.spec.shape == {"dp": 2, "sp": 2}
    assert engine.seq_parallel_group is parallel_state_sp.get_sequence_parallel_group() is mesh.get_group("sp")
    assert ranks(engine.seq_data_parallel_group) == list(range(WORLD)) == mesh.get_group_ranks(("dp", "sp"))
    assert engine.sequence_parallel_size == 2 and engine.train_batch_size() == 2  # as without the shim
    with pytest.raises(MeshSpecError, match="config.*parallel_state_sp"):
        deepspeed.initialize(model=torch.nn.Linear(4, 4), config=tiny_config(mesh={"tp": 2}), mpu=parallel_state_sp)
