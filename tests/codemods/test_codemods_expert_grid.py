"""MoE expert groups migrated whole (codemods/rules/_expert_grid.py): expert tensor parallelism with
a pipeline grid as ``mpu=`` — ``groups._create_expert_data_and_model_parallel(N, mpu=grid)`` for
ep 2 and 4 in one model, the readers (by literal size and by group name) and the grid itself — become
one mesh with ``tp`` and ``<mesh>.expert_groups(N)``. Legacy (the real deepspeed 0.19.8: its groups'
members are what the fixtures print) vs migrated, plain and under ``compat.install()``, on fake
ranks of 4 and 8. Shapes that cannot move keep every expert site, with a TODOV1 naming what blocks.
"""

from __future__ import annotations

import pytest

from codemod_scripts import run_fake, run_fake_shim
from codemods import migrate_code
from todo_lines import inline

pytestmark = [
    pytest.mark.deepspeed,
    pytest.mark.filterwarnings("ignore::compat.deprecation.LegacyAPIDeprecationWarning"),
]

WORLDS = [4, 8]

# expert-TP over a grid: tp 2 on 8 ranks (1 on 4), ep 2 and 4 in one model
EXPERT_TP = '''"""Expert tensor parallelism: MoE groups over a pipeline grid passed as mpu=."""
import torch.distributed as dist
from deepspeed.runtime.pipe.topology import PipeModelDataParallelTopology, PipelineParallelGrid
from deepspeed.utils import groups

TP = 2 if dist.get_world_size() >= 8 else 1
topo = PipeModelDataParallelTopology(num_pp=1, num_mp=TP, num_dp=dist.get_world_size() // TP)
grid = PipelineParallelGrid(topology=topo)
for ep in (2, 4):
    groups._create_expert_data_and_model_parallel(ep, mpu=grid)
print("OUT etp", groups._get_expert_model_parallel_world_size())
for ep in (2, 4):
    name = f"ep_size_{ep}"
    print("OUT ep", ep, list(groups._get_expert_parallel_group_ranks(f"ep_size_{ep}")),
          dist.get_process_group_ranks(groups._get_expert_parallel_group(name)),
          groups._get_expert_parallel_rank(name), groups._get_expert_parallel_world_size(f"ep_size_{ep}"))
    print("OUT edp", ep, list(groups._get_expert_data_parallel_group_ranks(name)),
          dist.get_process_group_ranks(groups._get_expert_data_parallel_group(f"ep_size_{ep}")),
          groups._get_expert_data_parallel_world_size(name), groups._get_expert_data_parallel_rank(name),
          groups._get_expert_broadcast_src_rank(name))
print("OUT names", sorted(groups._get_expert_parallel_group_dict()), sorted(groups._get_expert_data_parallel_group_dict()))
print("OUT largest", groups._get_max_expert_size_name())
print("OUT grid", grid.get_slice_parallel_world_size(), grid.get_slice_parallel_rank(), grid.get_data_parallel_world_size())
'''

# the same inside a function, with a pipeline: pp 2, tp 2 on 8 ranks; the grid passed positionally
EXPERT_TP_PIPELINE = """import torch.distributed as dist
from deepspeed.runtime.pipe.topology import PipeModelDataParallelTopology, PipelineParallelGrid
from deepspeed.utils import groups


def setup_moe(world):
    pp, tp = (2, 2) if world >= 8 else (2, 1)
    grid = PipelineParallelGrid(topology=PipeModelDataParallelTopology(num_pp=pp, num_mp=tp, num_dp=world // (pp * tp)))
    groups._create_expert_data_and_model_parallel(2, grid)
    return (list(groups._get_expert_parallel_group_ranks("ep_size_2")),
            list(groups._get_expert_data_parallel_group_ranks("ep_size_2")),
            grid.get_pipe_parallel_rank(), grid.get_stage_id())


print("OUT", setup_moe(dist.get_world_size()))
"""

# a Megatron-style mpu object (not a grid) passed as mpu=: tp 2 (consecutive ranks)
MPU_OBJECT = """import torch.distributed as dist
from deepspeed.utils import groups


class TensorMPU:
    def __init__(self):
        world, rank = dist.get_world_size(), dist.get_rank()
        for ranks in [[b, b + 1] for b in range(0, world, 2)]:
            group = dist.new_group(ranks=ranks)
            if rank in ranks:
                self._tp = group

    def get_tensor_model_parallel_world_size(self):
        return dist.get_world_size(self._tp)

    def get_tensor_model_parallel_rank(self):
        return dist.get_rank(self._tp)


mpu = TensorMPU()
groups._create_expert_data_and_model_parallel(2, mpu=mpu)
print("OUT ep", list(groups._get_expert_parallel_group_ranks("ep_size_2")))
print("OUT edp", list(groups._get_expert_data_parallel_group_ranks("ep_size_2")))
"""


def assert_same(legacy: str, migrated: str, world: int) -> list[str]:
    first = None
    for rank in sorted({0, 1, world // 2, world - 1}):
        before = run_fake(legacy, rank, world, legacy=True)
        assert before and not any(" raised " in line for line in before), before
        first = first or before
        for shim in (False, True):
            after = run_fake_shim(migrated, rank, world, shim=shim)
            assert after == before, f"rank {rank} of {world}, shim={shim}"
    return first


@pytest.fixture(autouse=True)
def _local_rank(monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "0")


def test_expert_tp_over_a_grid_moves_whole_onto_the_grids_mesh():
    m = migrate_code(EXPERT_TP)
    assert not m.todos, m.spelled_out()
    code = m.code
    assert "groups." not in code and "deepspeed" not in code and "PipelineParallelGrid" not in code, code
    assert "grid = DeepSpeedDeviceMesh.build(pp=1, dp=dist.get_world_size() // TP, tp=TP)" in code
    assert "    grid.expert_groups(ep)\n" in code
    assert "list(grid.expert_groups(ep).ep_ranks)" in code  # a literal f"ep_size_{ep}"
    assert "expert_groups_named(grid, name).ep_group" in code  # a name held in a variable
    assert 'print("OUT etp", grid.size("tp"))' in code
    assert "named_expert_parallel_groups(grid)" in code and "largest_expert_groups_name(grid)" in code
    assert m.sites["groups getter"] == 14 and m.sites["grid construction"] == 1
    assert migrate_code(code).code == code  # a second run changes nothing


@pytest.mark.parametrize("world", WORLDS)
def test_expert_tp_over_a_grid_runs_as_legacy(world):
    out = assert_same(EXPERT_TP, migrate_code(EXPERT_TP).code, world)
    if world == 8:  # rank 0 of tp 2 x dp 4: the expert-TP groups deepspeed 0.19.8 builds
        assert out[0] == "OUT etp 2"
        assert out[1] == "OUT ep 2 [0, 2] [0, 2] 0 2" and out[3] == "OUT ep 4 [0, 2, 4, 6] [0, 2, 4, 6] 0 4"
        assert out[2].startswith("OUT edp 2 [0, 4] [0, 4] 2 0 0")


@pytest.mark.parametrize("world", WORLDS)
def test_expert_tp_with_a_pipeline_inside_a_function(world):
    m = migrate_code(EXPERT_TP_PIPELINE)
    assert not m.todos and "grid.expert_groups(2)" in m.code and "groups." not in m.code, m.spelled_out()
    assert_same(EXPERT_TP_PIPELINE, m.code, world)


@pytest.mark.parametrize("world", WORLDS)
def test_an_mpu_that_is_not_a_grid_keeps_every_expert_site_and_says_why(world):
    m = migrate_code(MPU_OBJECT)
    assert not m.sites and m.todos["groups getter"] == 3
    assert "groups._create_expert_data_and_model_parallel(2, mpu=mpu)  # TODOV1:" in inline(m.code)
    assert "mpu=mpu is not a PipelineParallelGrid bound once in this file" in m.spelled_out()
    assert_same(MPU_OBJECT, m.code, world)


@pytest.mark.parametrize(
    "change,why",
    [
        ("groups._create_expert_data_and_model_parallel(ep, mpu=grid)", None),
        (
            "groups._create_expert_data_and_model_parallel(ep, mpu=grid, use_data_before_expert_parallel_=True)",
            "use_data_before_expert_parallel_ is a mesh option",
        ),
        ("x = groups._create_expert_data_and_model_parallel(ep, mpu=grid)", "its result is used"),
    ],
)
def test_a_builder_shape_that_cannot_move_keeps_all_and_names_the_blocker(change, why):
    source = EXPERT_TP.replace("groups._create_expert_data_and_model_parallel(ep, mpu=grid)", change)
    m = migrate_code(source)
    if why is None:
        assert not m.todos
        return
    assert not m.sites.get("groups getter") and not m.sites.get("grid construction"), m.spelled_out()
    assert why in m.spelled_out() and "PipelineParallelGrid(topology=topo)" in m.code


def test_a_plain_builder_beside_an_expert_tp_one_keeps_all():
    source = EXPERT_TP.replace(
        "for ep in (2, 4):\n    groups._create",
        "groups._create_expert_and_data_parallel(8)\nfor ep in (2, 4):\n    groups._create",
        1,
    )
    m = migrate_code(source)
    assert not m.sites.get("groups getter")
    assert "builds expert groups over the world without the grid's TP" in m.spelled_out()


def test_a_grid_kept_for_another_use_keeps_the_expert_sites_and_names_it():
    source = EXPERT_TP + "print('OUT', grid.unknown_attribute)\n"
    m = migrate_code(source)
    assert not m.sites.get("groups getter")
    assert (
        "the grid grid passed as mpu= is kept as a grid (grid.unknown_attribute has no mesh equivalent)"
        in m.spelled_out()
    )


def test_a_reader_that_does_not_see_the_grid_keeps_all():
    source = EXPERT_TP_PIPELINE + "\n\ndef later():\n    return groups._get_expert_parallel_group_ranks('ep_size_2')\n"
    m = migrate_code(source)
    assert not m.sites.get("groups getter")
    assert "does not see the grid grid" in m.spelled_out()


def test_inside_deepspeed_the_expert_tp_builder_stays_as_before():
    m = migrate_code(EXPERT_TP, module="deepspeed.moe.mine", package="deepspeed.moe")
    assert (
        "groups._create_expert_data_and_model_parallel(ep, mpu=grid)" in m.code and "grid.expert_groups" not in m.code
    )


def test_a_grid_kept_while_read_as_a_mesh_fails_the_file_whole():
    source = (
        "from deepspeed.runtime.pipe.topology import PipeModelDataParallelTopology, PipelineParallelGrid\n\n"
        "grid = PipelineParallelGrid(topology=PipeModelDataParallelTopology(num_pp=1, num_mp=2, num_dp=2))\n"
        "grid.expert_groups(2)\nprint(grid.unknown_attribute)\n"
    )
    with pytest.raises(ValueError, match="the grid grid is read as a mesh .expert groups. but kept"):
        migrate_code(source)
