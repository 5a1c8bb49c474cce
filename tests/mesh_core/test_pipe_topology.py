"""``mesh_core.pipeline_topology`` (what the codemods write for a topology handed to a
``PipelineModule``) answers exactly like DeepSpeed 0.19.8's ``PipeModelDataParallelTopology`` /
``PipeDataParallelTopology``, and a ``PipelineModule`` built on it is the same module, with and
without the mesh runtime."""

from __future__ import annotations

import importlib

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from codemods import migrate_code
from fakepg import fake_world, record_new_groups
from mesh_core import pipeline_topology

pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning"), pytest.mark.torch_releases]


def _answers(topo) -> dict:
    """Every query DeepSpeed's pipeline code (and a user) can make, with exceptions as values."""

    def attempt(fn, *args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except Exception as err:  # noqa: BLE001 (the exception type is part of the behaviour)
            return ("raises", type(err).__name__)

    axes = list(topo.get_axis_names())
    ranks = range(topo.world_size())
    coords = list(topo.mapping)
    out = {
        "axes": axes,
        "dims": list(topo.dims),
        "world": topo.world_size(),
        "mapping": [(tuple(c), tuple(c._fields), r) for c, r in topo.mapping.items()],
        "str": str(topo),
        "coord": [tuple(topo.get_coord(r)) for r in ranks],
        "coord_fields": [topo.get_coord(r)._fields for r in ranks],
        "coord_bad": [attempt(topo.get_coord, r) for r in (-1, topo.world_size(), 1.0, True)],
        "rank": [topo.get_rank(**c._asdict()) for c in coords],
        "rank_slice": attempt(topo.get_rank, pipe=0),
        "rank_unknown": attempt(topo.get_rank, **{a: 0 for a in axes[:-1]}, bogus=0),
        "rank_invalid": attempt(topo.get_rank, **{a: d for a, d in zip(axes, topo.dims)}),
        "repr": [topo.get_rank_repr(r) for r in ranks],
        "repr_all": [topo.get_rank_repr(r, omit_axes=[]) for r in ranks],
        "repr_sep": [topo.get_rank_repr(r, omit_axes=["pipe"], inner_sep=":", outer_sep="/") for r in ranks],
        "dim": {a: topo.get_dim(a) for a in ("pipe", "data", "model", "bogus")},
        "comm": {a: topo.get_axis_comm_lists(a) for a in ("pipe", "data", "model", "bogus")},
        "axis_list": {
            (a, i): attempt(topo.get_axis_list, a, i) for a in ("pipe", "data", "model", "bogus") for i in range(3)
        },
        "filter": [topo.filter_match(**{a: i}) for a in axes for i in range(3)]
        + [topo.filter_match(pipe=p, data=d) for p in range(2) for d in range(2)]
        + [topo.filter_match()],
        "filter_unknown": attempt(topo.filter_match, bogus=0),
    }
    return out


@pytest.mark.deepspeed
@settings(max_examples=40, deadline=None)
@given(st.integers(1, 4), st.integers(1, 4), st.one_of(st.none(), st.integers(1, 3)))
def test_pipeline_topology_answers_like_the_legacy_topology(pp, dp, tp):
    from deepspeed.runtime.pipe.topology import PipeDataParallelTopology, PipeModelDataParallelTopology

    legacy = (
        PipeDataParallelTopology(num_pp=pp, num_dp=dp)
        if tp is None
        else PipeModelDataParallelTopology(num_pp=pp, num_mp=tp, num_dp=dp)
    )
    assert _answers(pipeline_topology(pp=pp, dp=dp, tp=tp)) == _answers(legacy)


def _module(topology):
    from deepspeed.pipe import LayerSpec, PipelineModule

    torch.manual_seed(0)
    layers = [LayerSpec(torch.nn.Linear, 4, 4) for _ in range(4)]
    return PipelineModule(layers=layers, topology=topology, loss_fn=torch.nn.MSELoss(), partition_method="uniform")


def _module_facts(module) -> dict:
    import torch.distributed as dist

    grid = module._grid
    return {
        "stages": module.num_stages,
        "stage": module.stage_id,
        "parts": list(module.parts),
        "ckpt": module.ckpt_layer_path("dir", 1),
        "repr": module._topo.get_rank_repr(dist.get_rank()),
        "dp": sorted(dist.get_process_group_ranks(grid.get_data_parallel_group())),
        "pp": sorted(dist.get_process_group_ranks(grid.get_pipe_parallel_group())),
        "tp": sorted(dist.get_process_group_ranks(grid.get_slice_parallel_group())),
        "stage_id": grid.get_stage_id(),
        "weights": [p.sum().item() for p in module.parameters()],
    }


LAYOUTS = [(8, 2, 2, 2), (4, 2, 1, 2), (4, 4, 1, 1)]  # (world, pp, tp, dp); tp=1 keeps the 'model' axis


@pytest.mark.deepspeed
@pytest.mark.parametrize("world,pp,tp,dp", LAYOUTS)
def test_a_pipeline_module_on_pipeline_topology_is_the_legacy_module(world, pp, tp, dp, monkeypatch):
    """Legacy (real deepspeed, no runtime) vs pipeline_topology with and without the mesh runtime."""
    from deepspeed.runtime.pipe.topology import PipeModelDataParallelTopology

    installer = importlib.import_module("compat.install")  # compat.install is also the function

    monkeypatch.setenv("LOCAL_RANK", "0")
    for rank in (0, world - 1):
        with fake_world(rank, world, deepspeed_comm=True):
            legacy = _module_facts(_module(PipeModelDataParallelTopology(num_pp=pp, num_mp=tp, num_dp=dp)))
        with fake_world(rank, world, deepspeed_comm=True):
            with record_new_groups():
                topology = pipeline_topology(pp=pp, tp=tp, dp=dp)
            assert _module_facts(_module(topology)) == legacy
        installer.install()
        try:
            with fake_world(rank, world, deepspeed_comm=True):
                assert _module_facts(_module(pipeline_topology(pp=pp, tp=tp, dp=dp))) == legacy
        finally:
            installer.uninstall()


def test_building_it_creates_no_group_and_checks_no_world(world):
    with record_new_groups() as created:
        topo = pipeline_topology(pp=3, tp=5, dp=7)  # 105 ranks in a world of 4: the grid checks, later
    assert created == [] and topo.world_size() == 105


# --- the codemod ----------------------------------------------------------------------------------
HEAD = "from deepspeed.pipe import PipelineModule\nfrom deepspeed.runtime.pipe.topology import {cls}\n"


@pytest.mark.parametrize(
    "line,expected",
    [
        (
            "m = PipelineModule(layers, topology=PipeModelDataParallelTopology(num_pp=2, num_mp=a(), num_dp=b()))",
            "m = PipelineModule(layers, topology=pipeline_topology(pp=2, tp=a(), dp=b()))",
        ),
        (
            "m = PipelineModule(layers, 2, PipeModelDataParallelTopology(2, 1, 2))",
            "m = PipelineModule(layers, 2, pipeline_topology(pp=2, tp=1, dp=2))",
        ),
        (
            "m = PipelineModule(layers, topology=PipeModelDataParallelTopology(num_dp=d, num_pp=p, num_mp=t))",
            "m = PipelineModule(layers, topology=pipeline_topology(dp=d, pp=p, tp=t))",
        ),  # evaluation order kept
        (
            "m = PipelineModule(layers, topology=PipeDataParallelTopology(num_pp=2, num_dp=n))",
            "m = PipelineModule(layers, topology=pipeline_topology(pp=2, dp=n))",
        ),
    ],
)
def test_a_topology_handed_to_a_pipeline_module_becomes_pipeline_topology(line, expected):
    cls = "PipeDataParallelTopology" if "PipeDataParallelTopology" in line else "PipeModelDataParallelTopology"
    out = migrate_code(HEAD.format(cls=cls) + line + "\n")
    assert expected in out.code and out.sites == {"pipeline topology": 1} and not out.todos
    assert "from mesh_core import pipeline_topology" in out.code and cls not in out.code
    assert migrate_code(out.code).code == out.code


def test_a_named_topology_used_only_as_a_pipeline_module_topology_is_rewritten_in_place():
    source = HEAD.format(cls="PipeModelDataParallelTopology") + (
        "def build(cond):\n"
        "    topo = PipeModelDataParallelTopology(num_pp=pp(), num_mp=tp(), num_dp=dp())  # sized by the mpu\n"
        "    if cond:\n"
        "        return PipelineModule(layers, topology=topo)\n"
    )
    out = migrate_code(source)
    assert "    topo = pipeline_topology(pp=pp(), tp=tp(), dp=dp())  # sized by the mpu\n" in out.code
    assert not out.todos


@pytest.mark.parametrize(
    "body",
    [
        "topo = PipeModelDataParallelTopology(2, 2, 2)\nm = PipelineModule(layers, topology=topo)\nprint(topo.dims)\n",
        "topo = PipeModelDataParallelTopology(2, 2, 2)\nm = PipelineModule(layers, topology=topo)\ntopo = None\n",
        "m = PipelineModule(layers, topology=PipeModelDataParallelTopology(*sizes))\n",
    ],
)
def test_a_topology_used_otherwise_is_flagged_or_kept_never_rewritten(body):
    out = migrate_code(HEAD.format(cls="PipeModelDataParallelTopology") + body)
    assert "pipeline_topology(pp=2" not in out.code and "import pipeline_topology" not in out.code
    assert "PipeModelDataParallelTopology(" in out.code
    assert (
        out.todos
        and "TODOV1: topology kept: hand PipelineModule(topology=mesh_core.pipeline_topology(" in out.spelled_out()
    )
