"""The site families public trees have (issue 22, items 4 and 6), on fixtures of their shapes
(tests/fixtures/codemods/outside): each legacy script run on the real deepspeed 0.19.8 and its
migrated version run without and with ``compat.install()`` print the same, on several fake-backend
ranks; what is flagged carries advice that, applied, computes the same."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from codemod_scripts import run_fake, run_fake_shim
from codemods import migrate_code
from todo_lines import inline

# the legacy code these tests run (before migration) warns at each legacy call: that is its input
pytestmark = [
    pytest.mark.deepspeed,
    pytest.mark.filterwarnings("ignore::compat.deprecation.LegacyAPIDeprecationWarning"),
]

OUTSIDE = Path(__file__).parent.parent / "fixtures" / "codemods" / "outside"


def source(name: str) -> str:
    return (OUTSIDE / name).read_text()


def assert_same_everywhere(legacy: str, migrated: str, world: int) -> None:
    for rank in sorted({0, 1, world // 2, world - 1}):
        before = run_fake(legacy, rank, world, legacy=True)
        assert before and not any(line.startswith("OUT raised") for line in before), before
        for shim in (False, True):
            after = run_fake_shim(migrated, rank, world, shim=shim)
            assert after == before, f"rank {rank} of {world}, shim={shim}"


@pytest.fixture(autouse=True)
def _local_rank(monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "0")


@pytest.mark.parametrize("world", [4, 8])
def test_an_engines_grid_becomes_mesh_of_queries_that_compute_the_same(world):
    m = migrate_code(source("engine_grid.py"))
    assert m.sites["engine grid"] == 33 and "self.grid.get" not in m.code and "model.grid.get" not in m.code
    assert "grid.get_" not in m.code.split("def check")[0].split("class PartitionedEngine")[1]
    assert set(m.todos) == {"grid construction"}  # the grid this script builds itself (topology codemod)
    assert_same_everywhere(source("engine_grid.py"), m.code, world)


def test_a_grid_of_an_unproven_holder_is_flagged_with_the_rewrite_to_apply():
    m = migrate_code(source("engine_grid_unknown.py"))
    assert m.todos["engine grid"] == 2 and not m.sites
    advice = m.spelled_out()
    assert 'write mesh_of(model.grid).get_local_rank("dp")' in advice
    assert "model.grid.stage_to_global(...) kept" in advice and "<engine>.mesh_device.stage_to_global" in advice
    # the advice, applied, computes the same (mesh_of answers from the grid itself)
    advised = m.code.replace("model.grid.get_data_parallel_rank()", 'mesh_of(model.grid).get_local_rank("dp")')
    advised = "from mesh_core import mesh_of\n" + advised
    assert_same_everywhere(source("engine_grid_unknown.py"), advised, 4)


@pytest.mark.parametrize("world", [4, 8])
def test_a_topology_handed_on_through_super_init_becomes_pipeline_topology(world):
    m = migrate_code(source("pipeline_subclass.py"))
    assert m.sites == {"pipeline topology": 1} and not m.todos
    assert "topo = pipeline_topology(pp=pp, tp=tp, dp=dist.get_world_size() // (pp * tp))" in m.code
    assert "PipeModelDataParallelTopology" not in m.code
    assert_same_everywhere(source("pipeline_subclass.py"), m.code, world)


def test_super_init_of_a_class_whose_first_base_is_not_pipeline_module_keeps_the_topology():
    legacy = source("pipeline_subclass.py").replace(
        "class TinyPipe(PipelineModule):", "class TinyPipe(Mixin, PipelineModule):"
    )
    legacy = legacy.replace("class TinyPipe", "class Mixin:\n    pass\n\n\nclass TinyPipe", 1)
    m = migrate_code(legacy)
    assert "pipeline_topology(pp=" not in m.code.split("TODOV1")[0] and m.todos


def test_a_topology_a_megatron_mpu_reads_keeps_a_topology_and_the_advice_is_right():
    legacy = source("megatron_topology.py")
    m = migrate_code(legacy)
    assert m.todos == {"pipeline topology": 1} and not m.sites and m.code != legacy
    todo = re.search(r"# TODOV1: (.*)", m.spelled_out()).group(1)
    assert "initialize_model_parallel(...) reads it as a ProcessTopology" in todo
    assert "DeepSpeedDeviceMesh" not in todo and "MeshSpec" not in todo  # a mesh would break the mpu
    advised_call = re.search(r"hand it (mesh_core\.pipeline_topology\(.*?\)); the same axes", todo).group(1)
    assert advised_call == "mesh_core.pipeline_topology(pp=pp, tp=mp, dp=world // (pp * mp))"
    # apply the advice: the same program with the advised topology prints the same as legacy
    advised = "import mesh_core\n" + re.sub(
        r"PipeModelDataParallelTopology\(num_pp=.*?\)\)  # TODOV1: .*", advised_call, inline(m.code)
    )
    assert "PipeModelDataParallelTopology(" not in advised.split("import PipeModelDataParallelTopology")[1]
    assert_same_everywhere(legacy, advised, 8)


@pytest.mark.parametrize("world", [4, 8])
def test_calls_on_the_mpu_handed_to_initialize_become_mesh_of_queries(world):
    m = migrate_code(source("megatron_mpu_calls.py"))
    assert m.sites["mpu call"] == 9 and "mpu.get_" not in m.code
    assert "mesh=None if mpu is None else DeepSpeedDeviceMesh.from_mpu(mpu)" in m.code  # initialize codemod
    assert not m.todos, m.code
    assert_same_everywhere(source("megatron_mpu_calls.py"), m.code, world)


@pytest.mark.parametrize("world", [4, 8])
def test_bwc_helpers_in_user_code_become_mesh_of_queries(world):
    m = migrate_code(source("bwc_helpers.py"))
    assert m.sites["mpu/bwc call"] == 5 and "bwc_tensor_model_parallel_rank(mpu)" not in m.code
    assert "tp_world_size(mpu)" not in m.code  # an import alias
    assert_same_everywhere(source("bwc_helpers.py"), m.code, world)


def test_getters_of_a_module_that_sets_groups_mpu_are_kept_and_the_advice_is_right():
    legacy = source("groups_mpu_helper.py")
    m = migrate_code(legacy)
    assert "import current_mesh" not in m.code and m.todos["groups getter"] == 3  # two getters + groups.mpu itself
    assert 'call mesh_of(grid).get_group("dp") (mesh_core.mesh_of)' in m.spelled_out()
    assert_same_everywhere(legacy, m.code, 8)  # kept: the same program
    advised = "from mesh_core import mesh_of\n" + m.code.replace(
        "groups._get_data_parallel_group()", 'mesh_of(grid).get_group("dp")'
    ).replace("groups._get_data_parallel_world_size()", 'mesh_of(grid).size("dp")')
    assert_same_everywhere(legacy, advised, 8)
    # callers elsewhere get current_mesh(): without a default mesh it answers from the mpu DeepSpeed
    # recorded in groups.mpu (mesh_core.roles.legacy_state), i.e. the stage's groups as legacy does
    elsewhere = "from mesh_core import current_mesh\n" + m.code.replace(
        "groups._get_data_parallel_group()", 'current_mesh().get_group("dp")'
    ).replace("groups._get_data_parallel_world_size()", 'current_mesh().size("dp")')
    assert run_fake_shim(elsewhere, 0, 8, shim=False) == run_fake(legacy, 0, 8, legacy=True)


SCRIPTS = Path(__file__).parent.parent / "fixtures" / "codemods" / "scripts"


@pytest.mark.parametrize("name", sorted(p.name for p in SCRIPTS.glob("*.py")))
def test_the_realistic_scripts_compute_the_same_without_and_with_the_shim(name):
    legacy = (SCRIPTS / name).read_text()
    m = migrate_code(legacy)
    assert m.sites
    world = 8
    for rank in (0, 3, 7):
        before = run_fake(legacy, rank, world, legacy=True)
        for shim in (False, True):
            after = run_fake_shim(m.code, rank, world, shim=shim)
            if before and before[-1].startswith("OUT raised"):
                assert after[: len(before) - 1] == before[:-1], (rank, shim)
            else:
                assert after == before, (rank, shim)


def test_methods_outside_deepspeeds_mpu_protocol_are_the_objects_own_api_and_left_alone():
    legacy = (
        "import deepspeed\nfrom megatron import mpu\n"
        "def train(model):\n"
        "    engine, *_ = deepspeed.initialize(model=model, mpu=mpu)\n"
        "    return mpu.get_topology(), mpu.get_data_parallel_rank()\n"
    )
    m = migrate_code(legacy)
    assert "mpu.get_topology()" in m.code and 'mesh_of(mpu).get_local_rank("dp")' in m.code
    assert "TODOV1: mpu.get_topology" not in m.code


@pytest.mark.parametrize("world", [4, 8])
def test_an_old_mpu_module_handed_to_initialize_in_one_environment_answers_the_same(world):
    # an mpu with only model- and data-parallel getters (no pipeline, no tensor getters), deepspeed
    # imported under try: the model-parallel group is the mpu's own get_model_parallel_group()
    legacy = source("old_mpu_trainer.py")
    m = migrate_code(legacy)
    assert m.sites == {"mpu call": 3, "initialize mpu": 1} and m.todos == {"mpu call": 1}
    assert 'mesh_of(mpu).get_group(("pp", "tp"))' in m.code and "mpu.get_model_parallel_src_rank()" in m.code
    assert 'use mesh_of(mpu).get_group_ranks("tp")[0]' in m.spelled_out()  # the source rank flagged
    # before the user's ``try: import deepspeed / except Exception: pass`` (never inside it, where a
    # missing ds-mesh would pass for a missing deepspeed)
    assert "import compat\ncompat.install()  # the mesh runtime" in m.code.split("try:")[0]
    assert_same_everywhere(legacy, m.code, world)


@pytest.mark.parametrize("world", [4, 8])
def test_a_grid_parameter_annotated_through_the_topology_module_it_shadows_answers_the_same(world):
    legacy = source("grid_param_module_annotation.py")
    m = migrate_code(legacy)
    assert m.sites == {"engine grid": 6} and set(m.todos) == {"grid construction"}
    assert "topology.get_" not in m.code.split("def make_unit")[1].split("grid =")[0]
    assert_same_everywhere(legacy, m.code, world)


@pytest.mark.parametrize("world", [4, 8])
def test_sequence_parallel_getters_of_a_megatron_mpu_become_mesh_of_queries(world):
    legacy = source("megatron_sp_mpu.py")
    m = migrate_code(legacy)
    assert m.sites == {"mpu call": 10, "initialize mpu": 1} and m.todos == {"mpu call": 2}
    assert 'mesh_of(mpu).get_group("sp")' in m.code and "mpu.get_sequence_parallel_src_rank()" in m.code
    advice = m.spelled_out()
    assert "TODOV1: mpu.get_tensor_model_parallel_src_rank()" in advice
    assert "TODOV1: mpu.get_sequence_parallel_src_rank()" in advice  # beside its group, which is rewritten
    assert_same_everywhere(legacy, m.code, world)
    # the advice, applied, computes the same (the first rank of this rank's TP / SP group)
    advised_call = re.search(r'(mesh_of\(mpu\)\.get_group_ranks\("tp"\)\[0\]) once every mpu', advice).group(1)
    advised = m.code.replace("mpu.get_tensor_model_parallel_src_rank()", advised_call).replace(
        "mpu.get_sequence_parallel_src_rank()", 'mesh_of(mpu).get_group_ranks("sp")[0]'
    )
    assert "get_tensor_model_parallel_src_rank()," not in advised and "get_sequence_parallel_src_rank()" not in advised
    assert_same_everywhere(legacy, advised, world)


@pytest.mark.parametrize("world", [4, 8])
def test_ulysses_getters_after_initialize_under_a_suppress_guard_agree(world):
    # the migration hands the Ulysses state to initialize as a mesh and installs the runtime (before
    # the contextlib.suppress that guards deepspeed, never inside it, where a missing ds-mesh would be
    # suppressed): compared as the referee does, with the shim and as written, against legacy under
    # the shim (the migrated program needs the runtime)
    from codemod_referee import disagreements, run

    legacy = source("ulysses_policy.py")
    m = migrate_code(legacy)
    assert m.sites == {"groups getter": 4, "initialize mpu": 2} and not m.todos
    assert (
        "import compat\ncompat.install()  # the mesh runtime" in m.code.split("with contextlib.suppress(Exception):")[0]
    )
    assert "groups." not in m.code
    plain = run({"__main__": legacy}, 1, world, shim=False)
    assert plain == ["OUT split (1, 2, [0, 1])", "OUT consecutive True"], plain
    assert run({"__main__": m.code}, 1, world, shim=False) == plain  # as written: it installs itself
    assert disagreements({"__main__": legacy}, {"__main__": m.code}, world, sorted({0, 1, world - 1})) == []


@pytest.mark.parametrize("world", [4, 8])
def test_ulysses_getters_of_an_engine_built_through_kwargs_stay_lazy_and_agree(world):
    # the engine is built by an initialize the migration does not touch (mpu in **kwargs): the
    # getters become current_mesh() queries, answered from the mpu DeepSpeed recorded, with the
    # mesh_core import inside the function that imported deepspeed
    from codemod_referee import disagreements, run

    legacy = source("ulysses_kwargs_engine.py")
    m = migrate_code(legacy)
    assert m.sites == {"groups getter": 3} and not m.todos and "compat.install()" not in m.code
    assert "        from mesh_core import current_mesh\n" in m.code and "groups." not in m.code
    assert run({"__main__": legacy}, 3, world, shim=False) == [f"OUT (1, 2, {[2, 3]})"]
    assert disagreements({"__main__": legacy}, {"__main__": m.code}, world, sorted({0, 1, world - 1})) == []
