"""Rewrites inside DeepSpeed's own package (issue 10b) compute what legacy computed.

The legacy side is the real deepspeed 0.19.8 (its ``PipelineParallelGrid``, its
``deepspeed.utils.groups`` with ``groups.mpu`` = the pipeline grid, as the pipeline engine sets it);
the migrated side is the codemods' output for DeepSpeed modules, run on the mesh runtime (compat
installed) in the state the runtime is in where those lines run: the engine's groups state active
(its construction or one of its scoped entry points). Each probe runs as several ranks of fake
worlds of several layouts; group results are compared as rank sets, and the rewritten reads must
create no process group. The construction-time half of the argument (the runtime makes the engine's
mesh current while ``deepspeed.initialize`` builds it) is checked on a real engine.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from codemods import migrate_code
from codemods.rules.groups_getters import SIMPLE
from fakepg import fake_world, plain, record_new_groups
from todo_lines import inline

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

# (world, pp, tp, dp)
LAYOUTS = [(4, 2, 1, 2), (8, 2, 2, 2), (8, 1, 2, 4), (8, 4, 2, 1), (16, 2, 4, 2)]
SAMPLE_RANKS = 4  # ranks per layout (spread over the world)


def _ranks_of(world: int) -> list[int]:
    step = max(world // SAMPLE_RANKS, 1)
    return list(range(0, world, step))[:SAMPLE_RANKS] + ([world - 1] if world > SAMPLE_RANKS else [])


def _load(source: str, namespace: dict) -> dict:
    exec(compile(source, "<probe>", "exec"), namespace)
    return namespace


# --- the pipeline grid (deepspeed.runtime.pipe.{engine,module,p2p}) -----------------------------------
GRID_PROBE = """
from deepspeed import comm as dist


def probe(self, pp, dp, tp):
    return {{
        "global_rank": {g}.get_global_rank(),
        "stage": {g}.get_stage_id(),
        "model_group": {g}.get_model_parallel_group(),
        "pipe_group": {g}.get_pipe_parallel_group(),
        "slice_group": {g}.get_slice_parallel_group(),
        "slice_rank": {g}.get_slice_parallel_rank(),
        "slice_size": {g}.get_slice_parallel_world_size(),
        "last_stage": {g}.stage_to_global(pp - 1),
        "to_stage": [{g}.stage_to_global(stage_id=s) for s in range(pp)],
        "to_stage_dp": [{g}.stage_to_global(stage_id=s, data=d) for s in range(pp) for d in range(dp)],
        "to_stage_dp_tp": [{g}.stage_to_global(stage_id=s, data=d, model=m)
                           for s in range(pp) for d in range(dp) for m in range(tp)],
    }}
"""
GRID_MODULES = {
    "deepspeed.runtime.pipe.engine": "self.grid",
    "deepspeed.runtime.pipe.module": "self._grid",
    "deepspeed.runtime.pipe.p2p": "_grid",
}


class _Holder:
    def __init__(self, grid) -> None:
        self.grid = self._grid = grid


def _grid_sources(module: str) -> tuple[str, str]:
    source = GRID_PROBE.format(g=GRID_MODULES[module])
    migrated = migrate_code(source, module=module, package=module.rpartition(".")[0])
    return source, migrated.code


@pytest.mark.parametrize("module", sorted(GRID_MODULES))
def test_every_grid_call_of_the_pipeline_package_is_rewritten(module):
    source, code = _grid_sources(module)
    grid = GRID_MODULES[module]
    assert source.count(f"{grid}.") == code.count(f"{grid}.mesh.") == 11
    assert "TODOV1" not in code
    assert migrate_code(code, module=module, package=module.rpartition(".")[0]).code == code


def _grid_results(source: str, topology_cls, grid_cls, world: int, pp: int, tp: int, dp: int, *, migrated: bool):
    out = {}
    for rank in _ranks_of(world):
        with fake_world(rank, world, deepspeed_comm=True):
            grid = grid_cls(topology=topology_cls(num_pp=pp, num_mp=tp, num_dp=dp))
            namespace = _load(source, {"_grid": grid})
            with record_new_groups() as created:
                out[rank] = plain(namespace["probe"](_Holder(grid), pp, dp, tp))
            if migrated:
                assert created == [], f"rank {rank}: the rewritten grid reads created groups {created}"
    return out


@pytest.mark.deepspeed
@pytest.mark.parametrize("module", sorted(GRID_MODULES))
@pytest.mark.parametrize("world,pp,tp,dp", LAYOUTS)
def test_rewritten_grid_calls_equal_the_legacy_grid(module, world, pp, tp, dp, monkeypatch):
    import deepspeed  # noqa: F401
    import deepspeed.runtime.pipe.topology as legacy_topology

    import compat.install as installer

    monkeypatch.setenv("LOCAL_RANK", "0")
    source, code = _grid_sources(module)
    legacy = _grid_results(
        source,
        legacy_topology.PipeModelDataParallelTopology,
        legacy_topology.PipelineParallelGrid,
        world,
        pp,
        tp,
        dp,
        migrated=False,
    )
    installer.install()
    try:
        # the mesh runtime routes the legacy names to compat's grid, built on a mesh (grid.mesh)
        new = _grid_results(
            code,
            legacy_topology.PipeModelDataParallelTopology,
            legacy_topology.PipelineParallelGrid,
            world,
            pp,
            tp,
            dp,
            migrated=True,
        )
    finally:
        installer.uninstall()
    assert new == legacy


# --- deepspeed.utils.groups getters in engine-scoped modules -----------------------------------------
def _groups_probe(engine_class: bool) -> str:
    calls = "\n".join(f'        "{name}": groups.{name}(),' for name in sorted(SIMPLE))
    body = f"    def probe(self):\n        return {{\n{calls}\n        }}\n"
    if engine_class:
        return "from deepspeed.utils import groups\n\n\nclass DeepSpeedEngine:\n" + body
    return "from deepspeed.utils import groups\n\n\nclass Optimizer:\n" + body


GROUPS_MODULES = {"deepspeed.runtime.engine": True, "deepspeed.runtime.zero.stage_1_and_2": False}
# What legacy 0.19.8 raises for (the mesh answers: compat too; DeepSpeed reads these only when its
# layout has the dim): with a pipeline grid as groups.mpu the lettered (AutoTP) getters have no
# AutoTP groups (AssertionError) and the SP group has no SP mpu or mesh_device (KeyError);
_LETTERED = {name for name in SIMPLE if not name.startswith("_")}
LEGACY_RAISES = {
    "pipeline": _LETTERED | {"_get_sequence_parallel_group"},
    # with groups.mpu = groups (AutoTP): the module has no get_data_parallel_group_ranks (AttributeError)
    "autotp": {"_get_sequence_parallel_group", "_get_data_parallel_group_ranks"},
}


def _migrated_groups_probe(module: str) -> str:
    migrated = migrate_code(_groups_probe(GROUPS_MODULES[module]), module=module, package=module.rpartition(".")[0])
    return migrated.code


@pytest.mark.parametrize("module", sorted(GROUPS_MODULES))
def test_every_zero_argument_getter_of_an_engine_scoped_module_is_rewritten(module):
    code = _migrated_groups_probe(module)
    assert "groups." not in code.replace("from deepspeed.utils import groups", "") and "TODOV1" not in code
    accessor = "model_mesh(self)" if GROUPS_MODULES[module] else "current_mesh()"
    assert code.count(accessor) >= len(SIMPLE)


def test_a_getter_in_a_module_that_may_run_before_any_engine_is_left_with_an_actionable_todo():
    # (the lettered AutoTP getters there read the one AutoTP state instead: tests/codemods/test_codemods_autotp.py)
    source = "from deepspeed.utils import groups\nx = groups._get_data_parallel_group()\n"
    out = migrate_code(source, module="deepspeed.module_inject.auto_tp", package="deepspeed.module_inject")
    assert out.todos and not out.sites
    assert (
        "TODOV1: groups._get_data_parallel_group: this DeepSpeed module may run before any engine" in out.spelled_out()
    )
    assert 'call <mesh>.get_group("dp")' in out.spelled_out()


def _legacy_setup(scenario: str, pp: int, tp: int, dp: int) -> None:
    """The legacy groups state an engine of ``scenario`` sets up (deepspeed 0.19.8's engine code)."""
    import deepspeed.runtime.pipe.topology as legacy_topology
    from deepspeed.utils import groups

    if scenario == "pipeline":  # PipelineEngine: groups.mpu = its grid (engine._configure_distributed_model)
        groups.mpu = legacy_topology.PipelineParallelGrid(
            topology=legacy_topology.PipeModelDataParallelTopology(num_pp=pp, num_mp=tp, num_dp=dp)
        )
    else:  # AutoTP (engine._configure_tensor_parallel): self.mpu = groups; mpu._init_tp_mesh_device(tp)
        groups.mpu = groups
        groups._init_tp_mesh_device(tensor_model_parallel_size=tp)


def _legacy_groups(scenario: str, world: int, pp: int, tp: int, dp: int) -> dict:
    from deepspeed.utils import groups

    out = {}
    for rank in _ranks_of(world):
        with fake_world(rank, world, deepspeed_comm=True):  # its teardown resets the groups module
            _legacy_setup(scenario, pp, tp, dp)
            results = {}
            for name in sorted(SIMPLE):
                single = _load(f"from deepspeed.utils import groups\ndef one():\n    return groups.{name}()\n", {})
                try:
                    results[name] = plain(single["one"]())
                except (AssertionError, AttributeError, KeyError):
                    results[name] = "raises"
            out[rank] = results
            groups.mpu = None
    return out


def _runtime_state(scenario: str, pp: int, tp: int, dp: int):
    """The groups state the mesh runtime makes current for that engine (compat.initialize)."""
    import deepspeed.runtime.pipe.topology as routed  # compat's classes once installed
    from deepspeed.utils import groups

    from compat.engine_mesh import EngineMesh, as_engine_mesh
    from compat.engine_scope import GroupsState
    from mesh_core import MeshSpec

    if scenario == "pipeline":
        grid = routed.PipelineParallelGrid(
            topology=routed.PipeModelDataParallelTopology(num_pp=pp, num_mp=tp, num_dp=dp)
        )
        return GroupsState(as_engine_mesh(grid.mesh), grid, None)
    mesh = EngineMesh(MeshSpec.build(dist.get_world_size(), tp=tp), verify=False)
    return GroupsState(mesh, groups, None)


# scenario -> layouts (world, pp, tp, dp)
SCENARIOS = [("pipeline", layout) for layout in LAYOUTS] + [
    ("autotp", layout) for layout in [(4, 1, 2, 2), (8, 1, 2, 4), (8, 1, 4, 2), (16, 1, 4, 4)]
]


@pytest.mark.deepspeed
@pytest.mark.parametrize("scenario,layout", SCENARIOS)
def test_rewritten_getters_equal_legacy_groups_in_the_engines_scope(scenario, layout, monkeypatch):
    """Migrated: the engine's state as the runtime makes it current (compat.engine_scope), the
    engine's ``mesh_device`` None (construction) or its mesh (after initialize)."""
    import deepspeed  # noqa: F401

    import compat.install as installer
    from compat.engine_scope import groups_state

    world, pp, tp, dp = layout
    monkeypatch.setenv("LOCAL_RANK", "0")
    legacy = _legacy_groups(scenario, world, pp, tp, dp)
    sources = {m: _migrated_groups_probe(m) for m in GROUPS_MODULES}
    unmigrated = _load(_groups_probe(False), {})
    installer.install()
    try:
        for rank in _ranks_of(world):
            with fake_world(rank, world, deepspeed_comm=True):
                state = _runtime_state(scenario, pp, tp, dp)
                with groups_state(state):
                    compat_answers = plain(unmigrated["Optimizer"]().probe())
                    for module, engine_class in GROUPS_MODULES.items():
                        namespace = _load(sources[module], {})
                        cls = namespace["DeepSpeedEngine" if engine_class else "Optimizer"]
                        # an engine's mesh_device: None while initialize builds it, its mesh after
                        for mesh_device in (None, state.mesh) if engine_class else (None,):
                            owner = cls()
                            owner.mesh_device = mesh_device
                            with record_new_groups() as created:
                                got = plain(owner.probe())
                            assert created == [], (module, rank, created)
                            assert got == compat_answers, (module, rank)
                            expected = {k: v for k, v in legacy[rank].items() if v != "raises"}
                            assert {k: got[k] for k in expected} == expected, (module, rank)
                            assert {k for k, v in legacy[rank].items() if v == "raises"} <= LEGACY_RAISES[scenario]
    finally:
        installer.uninstall()


# --- the runtime makes the engine's mesh current while it is built and stepped ----------------------
@pytest.mark.deepspeed
@pytest.mark.filterwarnings("ignore::compat.deprecation.LegacyAPIDeprecationWarning")
def test_current_mesh_is_the_engines_mesh_while_it_is_built_and_in_its_scope(shim, world, tmp_path):
    import deepspeed

    from mesh_core import current_mesh, model_mesh, set_default_mesh

    def config(**extra):
        return {"train_micro_batch_size_per_gpu": 1, "steps_per_print": 10**6, **extra}

    seen = []

    def optimizer(params):  # deepspeed calls a client optimizer factory while it builds the engine
        seen.append(current_mesh())
        return torch.optim.SGD(params, lr=0.1)

    actor = deepspeed.initialize(
        model=torch.nn.Linear(4, 4),
        optimizer=optimizer,
        config=config(mesh={"tp": 2}, tensor_parallel={"autotp_size": 1}),
    )[0]
    assert seen == [actor.mesh_device] and actor.mesh_device.size("tp") == 2
    reference = deepspeed.initialize(model=torch.nn.Linear(4, 4), optimizer=optimizer, config=config())[0]
    assert seen[1] is reference.mesh_device and reference.mesh_device.size("tp") == 1
    assert model_mesh(actor) is actor.mesh_device and model_mesh(reference) is reference.mesh_device
    assert current_mesh() is reference.mesh_device  # the engine built last (legacy's groups.mpu)
    inside = []
    actor._save_checkpoint = lambda *_, **__: inside.append(current_mesh())
    actor.save_checkpoint(str(tmp_path))  # a scoped entry point: the actor's mesh, then back
    assert inside == [actor.mesh_device] and current_mesh() is reference.mesh_device
    set_default_mesh(None)


class _Engine:
    mesh_device = None  # as on a DeepSpeedEngine while deepspeed.initialize builds it


def test_model_mesh_falls_back_to_the_current_mesh(world):
    from mesh_core import DeepSpeedDeviceMesh, model_mesh, use_mesh

    mesh = DeepSpeedDeviceMesh.build(tp=2, verify=False)
    with use_mesh(mesh):
        assert model_mesh(_Engine()) is mesh  # mesh_device None: the current mesh
        assert model_mesh(object()) is mesh
    other = _Engine()
    other.mesh_device = DeepSpeedDeviceMesh.build(dp=4, verify=False)
    with use_mesh(mesh):
        assert model_mesh(other) is other.mesh_device
    other.mesh_device = "a torch DeviceMesh"  # not a DeepSpeedDeviceMesh: the current mesh
    with use_mesh(mesh):
        assert model_mesh(other) is mesh


def test_probe_sources_are_valid_python():
    for module in GRID_MODULES:
        compile(_grid_sources(module)[1], module, "exec")
    for module in GROUPS_MODULES:
        compile(_migrated_groups_probe(module), module, "exec")


def test_legacy_getters_on_a_parameter_named_groups_are_flagged_not_rewritten():
    source = (
        "def info(groups):\n"
        "    name = groups._get_max_expert_size_name()\n"
        "    return groups._get_expert_parallel_rank(name), groups.mpu.get_data_parallel_world_size()\n"
        "def other(groups):\n"
        "    return groups.custom()\n"
    )
    out = migrate_code(
        "import deepspeed\n" + source,
        module="deepspeed.runtime.model_checkpointing.utils",
        package="deepspeed.runtime.model_checkpointing",
    )
    # the groups functions on the parameter are flagged; its mpu's getter is answered by that mpu at run
    # time whatever the parameter is (mpu_internal), so it is rewritten
    assert out.todos == {"groups getter": 2} and out.sites == {"mpu/bwc call": 1}
    assert 'mesh_of(groups.mpu).size("dp")' in out.code
    assert "groups._get_max_expert_size_name()  # TODOV1: " in inline(out.code)
    assert "groups._get_max_expert_size_name: a parameter named groups" in out.spelled_out()
    assert "return groups.custom()\n" in out.code
