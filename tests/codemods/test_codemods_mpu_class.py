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

pytestmark = pytest.mark.deepspeed

FIXTURE = Path(__file__).parent.parent / "fixtures" / "codemods" / "outside" / "grid_mpu_class.py"
READS_MPU = (
    "    print(\"OUT mpu\", mpu.get_model_parallel_world_size(), mpu.get_data_parallel_rank(),\n"
    "          ranks(mpu.get_model_parallel_group()), ranks(mpu.get_data_parallel_group()))\n"
)


@pytest.fixture(autouse=True)
def _local_rank(monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "0")


def _agree(legacy: str, migrated: str, world: int) -> None:
    from codemod_referee import disagreements, run

    assert not any("raised" in line for line in run({"__main__": legacy}, 1, world, shim=False))
    assert disagreements({"__main__": legacy}, {"__main__": migrated}, world, sorted({0, 1, world // 2, world - 1})) == []


@pytest.mark.parametrize("world", [4, 8])
def test_an_mpu_class_over_a_grid_migrates_whole_and_computes_the_same(world):
    legacy = FIXTURE.read_text()
    m = migrate_code(legacy)
    assert not m.todos, m.spelled_out()
    assert m.sites == {"engine grid": 6, "grid construction": 1, "initialize mpu": 1}
    assert "        return mesh_of(self.grid).get_group(\"tp\")\n" in m.code
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
    legacy = FIXTURE.read_text().replace("num_pp=1", "num_pp=2").replace("get_world_size() // 2", "get_world_size() // 4")
    m = migrate_code(legacy)
    assert not m.todos
    assert "mesh=DeepSpeedDeviceMesh.from_mpu(mpu))" in m.code  # an instance of a local class is never None
    assert "mpu is None" not in m.code


def test_an_unproven_grid_gets_one_todo_per_getter_with_its_own_replacement():
    legacy = FIXTURE.read_text().replace(
        "    grid = PipelineParallelGrid(topology=topo)\n    mpu = GridMPU(grid)\n",
        "    mpu = wrap(PipelineParallelGrid(topology=topo))\n",
    ).replace("def build_engine():", "def wrap(grid):\n    return GridMPU(grid)\n\n\ndef build_engine():")
    m = migrate_code(legacy)
    assert m.todos["engine grid"] == 6
    comments = re.findall(r"# TODOV1: .*", m.code.split("def ranks")[0])
    assert len(comments) == 6 and len(set(comments)) == 6, comments
    assert all("<engine>" not in c for c in comments)
    assert "# TODOV1: write return mesh_of(self.grid).get_group(\"tp\"); ds-migrate --explain engine-grid" in m.code
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
