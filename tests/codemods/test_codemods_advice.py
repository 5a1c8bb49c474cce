"""Every TODOV1 is advice that works: where a TODOV1 names a replacement, applying it mechanically
(the legacy expression replaced by the one named) computes what legacy computed, on fake-backend
ranks; where there is no mesh form the TODOV1 says so and names none. (The grid, mpu and Megatron
topology advice is applied the same way in test_codemods_outside.py.)"""

from __future__ import annotations

import re

import pytest

from codemod_scripts import run_fake
from codemods import migrate_code as _migrate_code
from todo_lines import inline


def migrate_code(source: str):
    """The migration with each TODOV1 comment spelled out in full (the comment links its advice)."""
    m = _migrate_code(source)
    m.code = m.spelled_out()
    return m


# a named replacement: "<legacy kept>: use <call>: the same topology ..." (codemods.rules.topology)
SAME = re.compile(r"# TODOV1: topology kept: use (mesh_core\.pipeline_topology\(.*?\)): the same topology")

ESCAPING_TOPOLOGY = """
import torch.distributed as tdist
from deepspeed.runtime.pipe.topology import {cls}


class Holder:
    def __init__(self):
        self.topo = {cls}({args})


def show(topo):
    rank = tdist.get_rank()
    print("OUT", topo.get_axis_names(), topo.world_size(), tuple(topo.get_coord(rank)))
    print("OUT", topo.get_axis_comm_lists("data"), topo.get_axis_comm_lists("pipe"))
    print("OUT", topo.filter_match(pipe=0), topo.get_rank(**topo.get_coord(rank)._asdict()))


show(Holder().topo)
"""
TOPOLOGIES = [
    ("PipeModelDataParallelTopology", "num_pp=2, num_mp=2, num_dp=tdist.get_world_size() // 4"),
    ("PipeModelDataParallelTopology", "2, 1, tdist.get_world_size() // 2"),
    ("PipeDataParallelTopology", "num_pp=2, num_dp=tdist.get_world_size() // 2"),
    ("ProcessTopology", "axes=['pipe', 'data', 'model'], dims=[2, 2, tdist.get_world_size() // 4]"),
]


def apply_same(migrated: str) -> str:
    """``migrated`` with each kept topology replaced by the call its TODOV1 names."""
    lines = []
    for line in inline(migrated).splitlines(keepends=True):
        found = SAME.search(line)
        if found:
            code = line[: line.index("  # TODOV1")]
            head, _, _ = code.partition("= ")
            line = f"{head}= {found.group(1)}\n"
        lines.append(line)
    return "import mesh_core\n" + "".join(lines)


@pytest.mark.deepspeed
@pytest.mark.parametrize("cls,args", TOPOLOGIES, ids=[f"{c}-{i}" for i, (c, _) in enumerate(TOPOLOGIES)])
def test_an_escaping_topologys_advice_applied_is_the_same_topology(cls, args, monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "0")
    legacy = ESCAPING_TOPOLOGY.format(cls=cls, args=args)
    m = migrate_code(legacy)
    assert SAME.search(m.code), m.code  # a topology object, never a mesh / MeshSpec (it may reach a PipelineModule)
    assert "MeshSpec" not in m.code and "MeshLayout" not in m.code
    advised = apply_same(m.code)
    assert f"{cls}(" not in advised.split(f"import {cls}")[1]
    for rank in (0, 5):
        before = run_fake(legacy, rank, 8, legacy=True)
        assert before and not any("raised" in line for line in before), before
        assert run_fake(advised, rank, 8, legacy=True) == before, rank


@pytest.mark.parametrize("axes", ['["pipe", "expert"]', '["row", "col"]'])
@pytest.mark.parametrize("use", ["show(Holder().topo)\n", "t = Holder().topo\nprint(t.get_rank(row=0, col=1))\n"])
def test_a_topology_with_axes_no_mesh_has_says_so_and_names_no_replacement(axes, use):
    legacy = ESCAPING_TOPOLOGY.format(cls="ProcessTopology", args=f"axes={axes}, dims=[2, 4]")
    legacy = legacy.replace("show(Holder().topo)\n", use)
    todo = re.search(r"# TODOV1: (.*)", migrate_code(legacy).code).group(1)
    assert "no mesh form" in todo and "MeshLayout" not in todo and "MeshSpec" not in todo and "build(" not in todo


@pytest.mark.parametrize(
    "legacy",
    [
        # DeepSpeed's own CheckOverflow reads the expert table the builder fills
        "import deepspeed.runtime.utils as ds_utils\nfrom deepspeed.utils import groups\n"
        "groups._create_expert_and_data_parallel(2)\nds_utils.CheckOverflow([[]]).check()\n",
        # an engine reads the AutoTP groups
        "import deepspeed\nfrom deepspeed.utils import groups\ngroups._init_tp_mesh_device(2)\n"
        "engine, *_ = deepspeed.initialize(model=None, config={})\n",
    ],
)
def test_a_builder_deepspeed_reads_is_kept_and_its_advice_says_what_to_write(legacy):
    m = migrate_code(legacy)
    todos = re.findall(r"# TODOV1: (.*)", m.code)
    assert len(todos) == 1 and re.search(r'use "mesh": \{"(ep|tp)": N\}', todos[0]), m.code
    (full,) = re.findall(r"# TODOV1: (.*)", m.spelled_out())
    assert "no mesh form while it does" in full and "init_distributed" not in full, full
    code = "\n".join(line.split("#")[0] for line in m.code.splitlines())  # the code, not the advice
    assert "set_default_mesh" not in code and "expert_groups(" not in code


@pytest.mark.deepspeed
@pytest.mark.parametrize("world,tp,ep", [(16, 2, 4), (8, 1, 2), (16, 4, 2)])
def test_the_expert_rank_math_advice_applied_gives_the_legacy_lists(world, tp, ep):
    from deepspeed.utils import groups

    legacy = f"from deepspeed.utils import groups\nranks = groups._get_expert_parallel_ranks({world}, {tp}, {ep})\n"
    todo = re.search(r"# TODOV1: (.*)", migrate_code(legacy).code).group(1)
    advised = re.search(
        r'use (MeshLayout\(MeshSpec\.build\(W, pp=\.\.\., tp=\.\.\., ep=N\)\))\.groups\("ep"\) / \.groups\("edp"\)',
        todo,
    ).group(1)
    layout_code = advised.replace("W, pp=..., tp=..., ep=N", f"{world}, tp={tp}, ep={ep}")
    from mesh_core import MeshLayout, MeshSpec  # noqa: F401 (the advice's names)

    layout = eval(layout_code)
    expected = groups._get_expert_parallel_ranks(world, tp, ep)
    assert [list(g) for g in layout.groups("ep")] == [list(g) for g in expected[0]]
    assert [list(g) for g in layout.groups("edp")] == [list(g) for g in expected[1]]


def test_init_distributed_is_not_taken_for_a_reader_of_the_expert_groups():
    """deepspeed.init_distributed reads no legacy group state: the builder and its readers move."""
    legacy = (
        "import deepspeed\nfrom deepspeed.utils import groups\ndeepspeed.init_distributed()\n"
        "groups._create_expert_and_data_parallel(2)\ng = groups._get_expert_parallel_group('ep_size_2')\n"
    )
    m = migrate_code(legacy)
    assert "TODOV1" not in m.code, m.code
    assert "expert_groups(2)" in m.code and "deepspeed.init_distributed()" in m.code
