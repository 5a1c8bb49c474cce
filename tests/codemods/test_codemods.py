"""Golden, idempotence and per-codemod tests of the migration codemods (no deepspeed needed)."""

from __future__ import annotations

import difflib
import textwrap
from pathlib import Path

import libcst as cst
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from libcst.codemod import CodemodContext

from codemods import migrate_code
from codemods._engine.todo_links import collecting, spell_out
from codemods.rules.groups_getters import GroupsGettersCommand
from codemods.rules.initialize import InitializeCommand
from codemods.rules.legacy_imports import LegacyImportsCommand
from codemods.rules.mpu_calls import MpuCallsCommand
from codemods.rules.topology import TopologyCommand
from todo_lines import inline

FIXTURES = Path(__file__).parent.parent / "fixtures" / "codemods"
GOLDEN = sorted(p.name[: -len(".input.py")] for p in FIXTURES.glob("*.input.py"))


def run_one(command, source: str, module=None, package=None) -> tuple[str, CodemodContext]:
    context = CodemodContext(full_module_name=module, full_package_name=package)
    with collecting() as advice:  # TODOV1 comments spelled out in full
        tree = command(context).transform_module(cst.parse_module(textwrap.dedent(source)))
    return spell_out(tree.code, advice), context


# --- golden pairs ---------------------------------------------------------------------------------
def test_there_is_a_golden_pair_per_transform():
    prefixes = {name.split("_")[0] for name in GOLDEN}
    assert {"groups", "topology", "initialize", "mpu", "compat"} <= prefixes
    for name in GOLDEN:
        assert (FIXTURES / f"{name}.expected.py").exists(), name


@pytest.mark.parametrize("name", GOLDEN)
def test_golden(name):
    source = (FIXTURES / f"{name}.input.py").read_text()
    expected = (FIXTURES / f"{name}.expected.py").read_text()
    # the golden files spell each TODOV1 out in full; the code carries the short comment
    # linking its MIGRATION.md section (tests/codemods/test_todo_links.py)
    assert migrate_code(source).spelled_out() == expected


@pytest.mark.parametrize("name", GOLDEN + ["semantic_grid", "semantic_groups", "semantic_experts"])
def test_idempotent_and_compiles(name):
    path = FIXTURES / (f"{name}.input.py" if name in GOLDEN else f"{name}.py")
    once = migrate_code(path.read_text())
    twice = migrate_code(once.code)
    assert twice.code == once.code
    assert not twice.sites  # nothing left to rewrite
    assert twice.todos == once.todos  # the same sites still need a human, flagged once
    compile(once.code, str(path), "exec")


def test_untouched_lines_are_byte_identical():
    source = (FIXTURES / "groups_aliases.input.py").read_text()
    out = migrate_code(source).code
    odd_call = source[source.index("    odd = ") : source.index("    return dp")].splitlines()
    removed = [line[2:] for line in difflib.ndiff(source.splitlines(), out.splitlines()) if line.startswith("- ")]
    legacy = ("groups", "get_", "epg")
    assert removed and all(any(t in line for t in legacy) or line in odd_call for line in removed), removed
    assert "# a comment inside the call" in out  # moved above the rewritten statement, not lost


# --- groups getters -------------------------------------------------------------------------------
def test_groups_getter_rewrites_lettered_and_underscore():
    code, context = run_one(
        GroupsGettersCommand,
        """
        from deepspeed.utils import groups
        a = groups.get_model_parallel_group()
        b = groups._get_sequence_data_parallel_world_size()
        c = groups._get_expert_parallel_rank("ep_size_8")
        """,
    )
    assert 'a = current_mesh().get_group("tp")' in code
    assert 'b = current_mesh().size(("dp", "sp"))' in code
    assert "c = current_mesh().expert_groups(8).ep_ranks.index(current_mesh().rank)" in code
    assert "from mesh_core import current_mesh" in code
    assert context.scratch["codemods.sites"]["groups getter"] == 3


def test_groups_getter_ignores_unrelated_and_relative_imports_resolve():
    code, _ = run_one(
        GroupsGettersCommand,
        """
        from ..utils import groups
        from mylib import groups as other
        x = groups._get_data_parallel_rank()
        y = other._get_data_parallel_rank()
        """,
        module="deepspeed.runtime.bf16_optimizer",  # DeepSpeed code that runs in an engine's scope (issue 10b)
        package="deepspeed.runtime",
    )
    assert 'x = current_mesh().get_local_rank("dp")' in code
    assert "y = other._get_data_parallel_rank()" in code


def test_groups_module_itself_is_not_rewritten():
    source = "def f():\n    return _get_data_parallel_group()\n"
    assert migrate_code(source, module="deepspeed.utils.groups", package="deepspeed.utils").code == source


def test_todo_is_added_once_next_to_an_existing_comment():
    source = "from deepspeed.utils import groups\nx = groups._get_max_expert_size()  # note\n"
    once = migrate_code(source).code
    assert once.count("TODOV1") == 1
    assert "# note  # TODOV1: use <mesh>.expert_groups(N), N your largest ep size" in inline(once)
    assert migrate_code(once).code == once


def test_todo_on_compound_statement_header():
    source = "from deepspeed.utils import groups\nwhile groups._get_max_expert_size():\n    pass\n"
    out = migrate_code(source).code
    assert inline(out).splitlines()[1].startswith("while groups._get_max_expert_size():  # TODOV1:")


# --- topology -------------------------------------------------------------------------------------
def test_grid_with_unmappable_use_is_kept_with_reason():
    code, context = run_one(
        TopologyCommand,
        """
        from deepspeed.runtime.pipe.topology import PipeDataParallelTopology, PipelineParallelGrid
        grid = PipelineParallelGrid(topology=PipeDataParallelTopology(2, 2))
        grid.mp_group
        """,
    )
    assert (
        "grid = PipelineParallelGrid(topology=PipeDataParallelTopology(2, 2))  # TODOV1: PipelineParallelGrid kept"
        in code
    )
    assert context.scratch["codemods.todos"]["grid construction"] == 1


def test_grid_reassigned_is_not_converted():
    code, _ = run_one(
        TopologyCommand,
        """
        from deepspeed.runtime.pipe.topology import PipeDataParallelTopology, PipelineParallelGrid
        grid = PipelineParallelGrid(topology=PipeDataParallelTopology(2, 2))
        grid = None
        """,
    )
    assert "assigned more than once" in code


# --- initialize -----------------------------------------------------------------------------------
def test_initialize_mesh_param_into_empty_and_trailing_comma_dicts():
    code, _ = run_one(
        InitializeCommand,
        """
        import deepspeed
        deepspeed.initialize(model=m, config={}, mesh_param=(1, 4))
        deepspeed.initialize(model=m, config={"a": 1,}, mesh_param=[2, 2])
        """,
    )
    assert 'deepspeed.initialize(model=m, config={"mesh": {"dp": 1, "sp": 4}})' in code
    assert 'deepspeed.initialize(model=m, config={"a": 1, "mesh": {"dp": 2, "sp": 2},})' in code


def test_initialize_existing_mesh_section_is_flagged():
    code, context = run_one(
        InitializeCommand,
        """
        import deepspeed
        deepspeed.initialize(model=m, config={"mesh": {"tp": 2}}, mesh_param=(2, 2))
        """,
    )
    assert 'mesh_param=(2, 2))  # TODOV1: the config already has a "mesh" section' in code
    assert context.scratch["codemods.todos"]["initialize mesh_param"] == 1


# --- mpu calls ------------------------------------------------------------------------------------
def test_mpu_of_unknown_provenance_gets_todo_on_every_call():
    code, context = run_one(
        MpuCallsCommand,
        """
        import deepspeed
        def f(model, mpu):
            mpu.get_data_parallel_rank()
            deepspeed.initialize(model=model, mpu=mpu)
            x = mpu.unrelated()
            return mpu.get_tensor_model_parallel_group()
        """,
    )
    # the getters that come first in mesh_of's probe order are answered by the very getter (issue 22)
    assert 'mesh_of(mpu).get_local_rank("dp")\n' in code and 'return mesh_of(mpu).get_group("tp")\n' in code
    assert "x = mpu.unrelated()\n" in code
    assert context.scratch["codemods.sites"]["mpu call"] == 2 and not context.scratch["codemods.todos"]


def test_mpu_of_unknown_provenance_keeps_getters_mesh_of_would_not_call_first():
    code, context = run_one(
        MpuCallsCommand,
        """
        import deepspeed
        def f(model, mpu):
            deepspeed.initialize(model=model, mpu=mpu)
            return mpu.get_slice_parallel_group(), mpu.get_tensor_model_parallel_src_rank()
        """,
    )
    assert code.count("# TODOV1: mpu.") == 1 and "get_tensor_model_parallel_rank first" not in code
    assert context.scratch["codemods.todos"]["mpu call"] == 2


def test_mpu_that_is_the_groups_module_is_left_to_the_groups_codemod():
    code, context = run_one(
        MpuCallsCommand,
        """
        import deepspeed
        from deepspeed.utils import groups
        deepspeed.initialize(model=model, mpu=groups)
        groups.get_data_parallel_group()
        """,
    )
    assert "TODOV1" not in code
    assert not context.scratch.get("codemods.todos")


# --- imports --------------------------------------------------------------------------------------
def test_unused_legacy_imports_are_dropped_and_others_kept():
    code, _ = run_one(
        LegacyImportsCommand,
        """
        from deepspeed.utils import groups, logger
        from deepspeed.runtime.pipe.topology import PipelineParallelGrid
        import os
        logger.info(os)
        """,
    )
    assert code.strip().splitlines() == ["from deepspeed.utils import logger", "import os", "logger.info(os)"]


# --- property: arbitrary mixes of legacy statements ------------------------------------------------
STATEMENTS = [
    "a = groups.get_data_parallel_group()",
    "b = groups._get_expert_parallel_group('ep_size_2')  # c",
    "c = groups._get_expert_parallel_group(name)",
    "groups._init_tp_mesh_device(2)",
    "d = [groups._get_data_parallel_rank() for _ in range(2)]",
    "if groups._get_max_expert_size():\n    pass",
    "e = (\n    groups._get_sequence_parallel_group()\n)",
    "engine, *_ = deepspeed.initialize(model=m, config={}, mesh_param=(2, 2))",
    "f = groups._get_broadcast_src_rank()",
    "grid = PipelineParallelGrid(topology=PipeDataParallelTopology(2, 2))",
    "g = grid.get_data_parallel_group()",
    "h = getattr(groups, 'x')",
]
HEADER = (
    "import deepspeed\nfrom deepspeed.utils import groups\n"
    "from deepspeed.runtime.pipe.topology import PipeDataParallelTopology, PipelineParallelGrid\n"
)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.sampled_from(STATEMENTS), min_size=1, max_size=6), st.booleans())
def test_migration_is_idempotent_on_any_mix(statements, in_function):
    body = "\n".join(statements)
    if in_function:
        body = "def f(m, name):\n" + textwrap.indent(body, "    ")
    source = HEADER + body + "\n"
    once = migrate_code(source)
    compile(once.code, "<mix>", "exec")
    assert migrate_code(once.code).code == once.code


def test_grid_passed_as_mpu_with_a_config_file_is_kept():
    code = migrate_code(
        "import deepspeed\n"
        "from deepspeed.runtime.pipe.topology import PipeDataParallelTopology, PipelineParallelGrid\n"
        "grid = PipelineParallelGrid(topology=PipeDataParallelTopology(2, 2))\n"
        'engine, *_ = deepspeed.initialize(model=m, config="ds.json", mpu=grid)\n'
    ).code
    assert (
        "grid = PipelineParallelGrid(topology=PipeDataParallelTopology(2, 2))  # TODOV1: use DeepSpeedDeviceMesh.build("
        in inline(code)
    )
    assert "mpu=grid)  # TODOV1:" in inline(code)


def test_engine_class_itself_and_relative_subclass_use_model_mesh_of_self():
    # issue 10b: not self.mesh_device, which is None while deepspeed.initialize builds the engine
    engine_module = (
        "class DeepSpeedEngine(Module):\n    def f(self):\n        return groups._get_data_parallel_group()\n"
    )
    code = migrate_code(
        "from deepspeed.utils import groups\n" + engine_module,
        module="deepspeed.runtime.engine",
        package="deepspeed.runtime",
    ).code
    assert 'return model_mesh(self).get_group("dp")' in code
    pipe = (
        "from deepspeed.utils import groups\nfrom ..engine import DeepSpeedEngine\n"
        "class PipelineEngine(DeepSpeedEngine):\n    def f(me):\n        return groups.get_data_parallel_rank()\n"
    )
    code = migrate_code(pipe, module="deepspeed.runtime.pipe.engine", package="deepspeed.runtime.pipe").code
    assert 'return model_mesh(me).get_local_rank("dp")' in code


# --- adversarial inputs ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    "source",
    [
        # a parameter named like the accessor the codemod adds
        "from deepspeed.utils import groups\ndef f(current_mesh):\n    return groups.get_data_parallel_group()\n",
        # a module-level binding of the same name (an import, an assignment)
        "from foo import current_mesh\nfrom deepspeed.utils import groups\nx = groups.get_data_parallel_group()\ny = current_mesh(3)\n",
        "from deepspeed.utils import groups\ncurrent_mesh = 5\nx = groups.get_data_parallel_group()\n",
    ],
)
def test_added_accessor_never_rebinds_or_hits_a_user_name(source):
    out = migrate_code(source).code
    assert 'mesh_core.current_mesh().get_group("dp")' in out
    assert "import mesh_core\n" in out and "from mesh_core import current_mesh" not in out
    assert source.count("current_mesh") == out.count("current_mesh") - 1  # the user's own uses are untouched
    compile(out, "<shadow>", "exec")
    assert migrate_code(out).code == out


def test_added_mesh_class_never_hits_a_user_name():
    source = (
        "from deepspeed.runtime.pipe.topology import PipeDataParallelTopology, PipelineParallelGrid\n"
        "from mylib import DeepSpeedDeviceMesh\n"
        "grid = PipelineParallelGrid(topology=PipeDataParallelTopology(2, 2))\n"
        "x = grid.get_data_parallel_group()\n"
        "y = DeepSpeedDeviceMesh()\n"
    )
    out = migrate_code(source).code
    assert "grid = mesh_core.DeepSpeedDeviceMesh.build(pp=2, dp=2)" in out
    assert "from mylib import DeepSpeedDeviceMesh\n" in out and "from mesh_core import" not in out
    assert migrate_code(out).code == out


def test_engine_shadowed_by_a_comprehension_variable_is_not_used():
    source = (
        "import deepspeed\nfrom deepspeed.utils import groups\n"
        "def f(m):\n"
        "    engine, *_ = deepspeed.initialize(model=m)\n"
        "    return [groups.get_data_parallel_group() for engine in range(3)]\n"
    )
    out = migrate_code(source).code
    assert '[current_mesh().get_group("dp") for engine in range(3)]' in out
    out = migrate_code(source.replace("for engine in", "for i in")).code
    assert '[engine.mesh_device.get_group("dp") for i in range(3)]' in out


def test_byte_order_mark_is_kept():
    source = "\ufefffrom deepspeed.utils import groups  # c\r\nx = groups.get_data_parallel_group()\r\n"
    out = migrate_code(source).code
    assert out.startswith("\ufeff") and out.count("\ufeff") == 1
    assert 'x = current_mesh().get_group("dp")\r\n' in out
    assert migrate_code(out).code == out


@pytest.mark.parametrize("module", ["deepspeed.utils.groups", "deepspeed.utils", "compat.groups"])
def test_star_import_of_used_getters_is_flagged_once(module):
    source = f"from {module} import *\nx = get_data_parallel_group()\n"
    once = migrate_code(source)
    assert inline(once.code).splitlines()[0].startswith(f"from {module} import *  # TODOV1: ")
    assert once.todos["groups getter"] == 1
    assert migrate_code(once.code).code == once.code
    # a star import whose getters are not used is left alone
    assert migrate_code(f"from {module} import *\nlog_dist('x')\n").code == f"from {module} import *\nlog_dist('x')\n"


def test_topology_kept_for_other_uses_is_flagged_in_the_first_run_too():
    source = (
        "from deepspeed.runtime.pipe.topology import PipeModelDataParallelTopology, PipelineParallelGrid\n"
        "topo = PipeModelDataParallelTopology(2, 2, 2)\n"
        "grid = PipelineParallelGrid(topology=topo)\n"
        "print(topo.dims)\n"
        "x = grid.get_data_parallel_group()\n"
    )
    once = migrate_code(source)
    assert "grid = DeepSpeedDeviceMesh.build(pp=2, dp=2, tp=2)\n" in once.code
    assert "topo = PipeModelDataParallelTopology(2, 2, 2)  # TODOV1: " in inline(once.code)
    assert "topology kept" in once.spelled_out()
    twice = migrate_code(once.code)
    assert twice.code == once.code and twice.todos == once.todos


def test_topology_also_used_for_rank_math_beside_a_converted_grid_becomes_pipeline_topology_in_one_run():
    source = (
        "from deepspeed.runtime.pipe.topology import PipeModelDataParallelTopology, PipelineParallelGrid\n"
        "topo = PipeModelDataParallelTopology(2, 2, 2)\n"
        "grid = PipelineParallelGrid(topology=topo)\n"
        'print(topo.get_dim("pipe"))\n'
        "x = grid.get_data_parallel_group()\n"
    )
    once = migrate_code(source)
    assert "grid = DeepSpeedDeviceMesh.build(pp=2, dp=2, tp=2)\n" in once.code
    assert "topo = pipeline_topology(pp=2, tp=2, dp=2)\n" in once.code and not once.todos
    twice = migrate_code(once.code)
    assert twice.code == once.code and twice.todos == once.todos


def test_grid_calls_go_to_the_engine_the_grid_was_passed_to_not_another_one():
    source = (
        "import deepspeed\n"
        "from deepspeed.runtime.pipe.topology import PipeModelDataParallelTopology, PipelineParallelGrid\n"
        "def f(model, other, pp, tp, dp):\n"
        "    grid = PipelineParallelGrid(topology=PipeModelDataParallelTopology(pp, tp, dp))\n"
        '    e1, *_ = deepspeed.initialize(model=model, config="a.json", mpu=grid)\n'
        '    e2, *_ = deepspeed.initialize(model=other, config="b.json")\n'
        "    return grid.get_data_parallel_rank()\n"
    )
    out = migrate_code(source).code
    assert 'return e1.mesh_device.get_local_rank("dp")\n' in out
    out = migrate_code(source.replace("e1, *_ =", "e1 =")).code  # not provably the engine: left for a human
    assert "e2.mesh_device" not in out
    assert 'return grid.get_data_parallel_rank()  # TODOV1: use <mesh>.get_local_rank("dp")' in inline(out)


def test_initialize_with_literal_none_mpu_and_mesh_param_is_left_alone():
    source = "import deepspeed\nengine, *_ = deepspeed.initialize(model=m, config={}, mpu=None, mesh_param=None)\n"
    once = migrate_code(source)
    assert once.code == source and not once.todos


@pytest.mark.parametrize(
    "source,line",
    [
        ("try:\n    x = 1\nexcept groups._get_max_expert_size():\n    pass\n", 3),
        ("try:\n    x = 1\nexcept* groups._get_max_expert_size():\n    pass\n", 3),
        ("match groups._get_max_expert_size():\n    case 1:\n        pass\n", 1),
        ("match x:\n    case 1 if groups._get_max_expert_size():\n        pass\n", 2),
    ],
)
def test_todo_in_an_except_or_match_header_is_written_where_it_is_counted(source, line):
    once = migrate_code("from deepspeed.utils import groups\n" + source)
    assert once.todos["groups getter"] == 1
    lines = once.code.splitlines()
    assert "# TODOV1: use <mesh>.expert_groups(N), N your largest ep size" in lines[line]
    assert once.code.count("TODOV1") == 1
    assert migrate_code(once.code).code == once.code
