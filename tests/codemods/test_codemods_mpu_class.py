"""A hand-written Megatron-style mpu class over a pipeline grid (our own code, in the shape a new
user writes): its getters become ``mesh_of(self.grid)`` queries, the grid a mesh, and ``mpu=<instance>``
``mesh=<the mesh>``; legacy (deepspeed 0.19.8) vs migrated, plain and under ``compat.install()``,
on fake ranks of 4 and 8. Where the class's grid is not proven, one TODOV1 per getter names that
getter's own replacement."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from codemods import migrate_code
from codemods._engine.runner import written_todos
from todo_lines import inline

pytestmark = [
    pytest.mark.deepspeed,
    pytest.mark.filterwarnings("ignore::compat.deprecation.LegacyAPIDeprecationWarning"),
]

FIXTURE = Path(__file__).parent.parent / "fixtures" / "codemods" / "outside" / "grid_mpu_class.py"
READS_MPU = (
    '    print("OUT mpu", mpu.get_model_parallel_world_size(), mpu.get_data_parallel_rank(),\n'
    "          ranks(mpu.get_model_parallel_group()), ranks(mpu.get_data_parallel_group()))\n"
)


@pytest.fixture(autouse=True)
def _local_rank(monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "0")


def _agree(legacy: str, migrated: str, world: int) -> None:
    from codemod_referee import disagreements, run

    assert not any("raised" in line for line in run({"__main__": legacy}, 1, world, shim=False))
    assert (
        disagreements({"__main__": legacy}, {"__main__": migrated}, world, sorted({0, 1, world // 2, world - 1})) == []
    )


@pytest.mark.parametrize("world", [4, 8])
def test_an_mpu_class_over_a_grid_migrates_whole_and_computes_the_same(world):
    legacy = FIXTURE.read_text()
    m = migrate_code(legacy)
    assert not m.todos, m.spelled_out()
    assert m.sites == {"engine grid": 6, "grid construction": 1, "initialize mpu": 1}
    assert '        return mesh_of(self.grid).get_group("tp")\n' in m.code
    assert "grid = DeepSpeedDeviceMesh.build(pp=1, dp=dist.get_world_size() // 2, tp=2)" in m.code
    assert "config=CONFIG, mesh=grid)" in m.code and "from_mpu" not in m.code
    assert "mpu = GridMPU(grid)" not in m.code  # nothing else read the instance: the class is no longer used
    assert "PipelineParallelGrid" not in m.code and "Topology" not in m.code
    assert migrate_code(m.code).code == m.code
    _agree(legacy, m.code, world)


@pytest.mark.parametrize("world", [4, 8])
def test_an_mpu_class_instance_read_elsewhere_is_kept_and_the_engine_gets_the_mesh(world):
    legacy = FIXTURE.read_text().replace("    torch.manual_seed(0)\n", READS_MPU + "    torch.manual_seed(0)\n")
    m = migrate_code(legacy)
    assert not m.todos and "    mpu = GridMPU(grid)\n" in m.code and "mesh=grid)" in m.code
    assert migrate_code(m.code).code == m.code
    _agree(legacy, m.code, world)


def test_a_class_whose_getters_differ_from_the_meshs_keeps_the_instance_through_from_mpu():
    # pp=2 and no pipeline getters: legacy DeepSpeed reads pp=1 from this mpu; the mesh has pp=2
    legacy = (
        FIXTURE.read_text().replace("num_pp=1", "num_pp=2").replace("get_world_size() // 2", "get_world_size() // 4")
    )
    m = migrate_code(legacy)
    assert not m.todos
    assert "mesh=DeepSpeedDeviceMesh.from_mpu(mpu))" in m.code  # an instance of a local class is never None
    assert "mpu is None" not in m.code


def test_an_unproven_grid_gets_one_todo_per_getter_with_its_own_replacement():
    legacy = (
        FIXTURE.read_text()
        .replace(
            "    grid = PipelineParallelGrid(topology=topo)\n    mpu = GridMPU(grid)\n",
            "    mpu = wrap(PipelineParallelGrid(topology=topo))\n",
        )
        .replace("def build_engine():", "def wrap(grid):\n    return GridMPU(grid)\n\n\ndef build_engine():")
    )
    m = migrate_code(legacy)
    assert m.todos["engine grid"] == 6
    comments = re.findall(r"# TODOV1: .*", m.code.split("def ranks")[0])
    assert len(comments) == 6 and len(set(comments)) == 6, comments
    assert all("<engine>" not in c for c in comments)
    assert '# TODOV1: write return mesh_of(self.grid).get_group("tp"); ds-migrate --explain engine-grid' in m.code
    listing = written_todos(legacy, m.code, m.advice)
    class_lines = [advice for _, comment, advice in listing if "self.grid" in comment]
    assert len(class_lines) == 6 and all(len(advice) == 1 for advice in class_lines)
    assert len({advice[0] for advice in class_lines}) == 6


def test_explain_of_a_kind_prints_the_table_its_text_points_at():
    import ds_mesh_advice

    text = ds_mesh_advice.explain("groups")
    assert "table below" in text and "the table (MIGRATION.md#legacy-groups):" in text
    after = text.split("the table (MIGRATION.md#legacy-groups):", 1)[1]
    assert "    _get_expert_parallel_group: " in after and "    _get_data_parallel_group: " in after
    assert "_get_expert_parallel_group" not in text.split("the table")[0]
    for code in ("grid-use", "comm", "mpu-internal"):
        assert "\n  the table (MIGRATION.md#legacy-" in ds_mesh_advice.explain(code), code


# a Megatron-style mpu with sequence, tensor and data groups and their source-rank getters
SRC_RANK_MPU = """import deepspeed
import torch.distributed as dist


class SequenceTensorMPU:
    def __init__(self):
        world, rank = dist.get_world_size(), dist.get_rank()
        self._groups = {}
        for name, lists in (("sp", [[b, b + 1] for b in range(0, world, 2)]),
                            ("tp", [[b, b + 1] for b in range(0, world, 2)]),
                            ("dp", [list(range(t, world, 2)) for t in range(2)])):
            for ranks in lists:
                group = dist.new_group(ranks=ranks)
                if rank in ranks:
                    self._groups[name] = (group, ranks)

    def get_sequence_parallel_group(self):
        return self._groups["sp"][0]

    def get_sequence_parallel_src_rank(self):
        return self._groups["sp"][1][0]

    def get_model_parallel_group(self):
        return self._groups["tp"][0]

    def get_model_parallel_src_rank(self):
        return self._groups["tp"][1][0]

    def get_data_parallel_group(self):
        return self._groups["dp"][0]


mpu = SequenceTensorMPU()


def build_engine(model, config):
    return deepspeed.initialize(model=model, config=config, mpu=mpu)


def ranks(group):
    return sorted(dist.get_process_group_ranks(group))


print("OUT sp", mpu.get_sequence_parallel_src_rank(), ranks(mpu.get_sequence_parallel_group()))
print("OUT mp", mpu.get_model_parallel_src_rank(), ranks(mpu.get_model_parallel_group()))
"""


@pytest.mark.parametrize("world", [4, 8])
def test_source_rank_getters_beside_a_rewritten_group_are_flagged_and_the_advice_computes_the_same(world):
    from codemod_scripts import run_fake, run_fake_shim

    m = migrate_code(SRC_RANK_MPU)
    assert m.todos["mpu call"] == 2 and m.sites["mpu call"] == 2, m.spelled_out()
    assert 'mpu.get_sequence_parallel_src_rank(), ranks(mesh_of(mpu).get_group("sp")))  # TODOV1:' in inline(m.code)
    advice = m.spelled_out()
    assert 'mesh_of(mpu).get_group_ranks("sp")[0]' in advice and 'mesh_of(mpu).get_group_ranks("tp")[0]' in advice
    assert '# TODOV1: use mesh_of(mpu).get_group_ranks("sp")[0]; ds-migrate --explain mpu-call' in m.code
    advised = m.code.replace("mpu.get_sequence_parallel_src_rank()", 'mesh_of(mpu).get_group_ranks("sp")[0]').replace(
        "mpu.get_model_parallel_src_rank()", 'mesh_of(mpu).get_group_ranks("tp")[0]'
    )
    for rank in sorted({0, 1, world // 2, world - 1}):
        before = run_fake(SRC_RANK_MPU, rank, world, legacy=True)
        assert before and not any("raised" in line for line in before), before
        for shim in (False, True):
            assert run_fake_shim(m.code, rank, world, shim=shim) == before, (rank, shim)
            assert run_fake_shim(advised, rank, world, shim=shim) == before, (rank, shim)


def test_a_todo_names_its_explain_code_once():
    source = (
        "import deepspeed\n\n\ndef f(model, mpu):\n    engine, *_ = deepspeed.initialize(model=model, mpu=mpu)\n"
        "    return mpu.get_sequence_data_parallel_group()\n"
    )
    m = migrate_code(source)
    assert m.todos["mpu call"] == 1
    (line,) = [line for line in m.code.splitlines() if "TODOV1" in line]
    assert m.code.count("ds-migrate --explain") == 1, m.code
    assert all(full.count("ds-migrate --explain") == 0 for full in m.advice.values() for full in full)


def test_a_blank_line_before_a_removed_local_import_stays():
    # the Megatron-DeepSpeed gpt_model.py shape: a blank line, the local import, the topology
    source = (
        "from megatron.core import mpu\nfrom deepspeed.pipe import PipelineModule\n\n\n"
        "class GPTModelPipe(PipelineModule):\n    def __init__(self, config):\n        interval = 0\n\n"
        "        from deepspeed.runtime.pipe.topology import PipeModelDataParallelTopology\n"
        "        topo = PipeModelDataParallelTopology(num_pp=mpu.get_pipeline_model_parallel_world_size(),\n"
        "                                             num_mp=mpu.get_tensor_model_parallel_world_size(),\n"
        "                                             num_dp=mpu.get_data_parallel_world_size())\n\n"
        "        super().__init__(layers=[], topology=topo)\n"
    )
    m = migrate_code(source)
    assert m.sites == {"pipeline topology": 1} and not m.todos
    assert "        interval = 0\n\n        topo = pipeline_topology(" in m.code
    assert migrate_code(m.code).code == m.code
    # without a blank line before the import none is added; one after it stays
    joined = source.replace("interval = 0\n\n", "interval = 0\n").replace(
        "PipeModelDataParallelTopology\n        topo", "PipeModelDataParallelTopology\n\n        topo"
    )
    assert "        interval = 0\n\n        topo = pipeline_topology(" in migrate_code(joined).code


def test_a_topology_handed_on_gets_its_own_arguments_in_the_comment():
    source = (
        "from deepspeed.runtime.pipe.topology import PipeModelDataParallelTopology\nfrom megatron import mpu\n\n\n"
        "def build(args):\n    mpu.initialize_model_parallel(args.tp, args.pp, topology=PipeModelDataParallelTopology(\n"
        "        num_pp=args.pp, num_mp=args.tp, num_dp=args.dp))\n"
    )
    m = migrate_code(source)
    assert m.todos["pipeline topology"] == 1
    assert "    # TODOV1: use pipeline_topology(pp=args.pp, tp=args.tp, dp=args.dp);\n" in m.code
    assert "pp=P" not in m.code and migrate_code(m.code).code == m.code


def test_a_local_import_replaced_in_place_keeps_one_blank_line_each_side_as_it_had():
    for between in ("", "\n"):
        legacy = (
            'def f():\n    """Doc."""\n\n    from deepspeed.utils import groups\n'
            + between
            + "    return groups._get_data_parallel_world_size()\n"
        )
        assert migrate_code(legacy).code == (
            'def f():\n    """Doc."""\n\n    from mesh_core import current_mesh\n'
            + between
            + '    return current_mesh().size("dp")\n'
        )
