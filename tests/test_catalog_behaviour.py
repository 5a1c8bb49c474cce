"""The catalog as behaviour: each row's mesh expression (``ds_mesh_advice``), evaluated on
fake-backend meshes of several layouts, answers what the shim's legacy API answers there
(``compat.groups`` bound to the mesh, ``compat.topology``'s grid, ``compat.mpu.MeshMPU``), and for
the grid what deepspeed 0.19.8's ``PipelineParallelGrid`` answers. A changed mesh expression in the
catalog (the codemods write it) or a changed shim answer fails it."""

from __future__ import annotations

import contextlib
import io

import pytest
import torch.distributed as dist

import ds_mesh_advice
from fakepg import fake_world

pytestmark = [
    pytest.mark.deepspeed,
    pytest.mark.filterwarnings("ignore::compat.deprecation.LegacyAPIDeprecationWarning"),
]

GROUPS = "deepspeed.utils.groups."
GRID = "deepspeed.runtime.pipe.topology.PipelineParallelGrid."
EP = 2
# (world, rank, mesh sizes): data, tensor, pipeline and sequence parallel layouts, each with ep=2
MESH_LAYOUTS = [
    (8, 5, {"dp": 4, "tp": 2}),
    (8, 5, {"pp": 2, "dp": 2, "tp": 2}),
    (8, 6, {"dp": 2, "sp": 2, "tp": 2}),
    (16, 11, {"pp": 2, "dp": 4, "sp": 2}),
]
# (pp, mp, dp, rank) of PipeModelDataParallelTopology grids
GRID_LAYOUTS = [(2, 2, 2, 5), (1, 2, 4, 3), (4, 1, 2, 6), (3, 2, 2, 7)]


def _value(value):
    """A comparable form: a process group → its sorted ranks; ranges / tuples → lists."""
    if isinstance(value, dist.ProcessGroup):
        return ("group", sorted(dist.get_process_group_ranks(value)))
    if isinstance(value, (list, tuple, range)):
        return [_value(v) for v in value]
    return value


def _evaluate(row: ds_mesh_advice.Row, mesh) -> object:
    return _value(eval(row.template(mesh="mesh", n=str(EP)), {"mesh": mesh}))  # noqa: S307 (catalog data)


def _rows(section: str, prefix: str = "") -> list[ds_mesh_advice.Row]:
    return [r for r in ds_mesh_advice.rows() if r.section == section and r.mesh and r.name.startswith(prefix)]


def _legacy_call(target, name: str, row: ds_mesh_advice.Row):
    fn = getattr(target, name)
    return _value(fn(f"ep_size_{EP}") if "(N)" in row.mesh else fn())


@pytest.mark.parametrize("world, rank, sizes", MESH_LAYOUTS)
def test_groups_and_mpu_rows_answer_as_the_shim(world, rank, sizes, monkeypatch):
    import compat.groups as cgroups
    from compat.mpu import MeshMPU
    from mesh_core import DeepSpeedDeviceMesh

    groups_rows, mpu_rows = _rows("groups", GROUPS), _rows("mpu", "mpu.")
    assert len(groups_rows) >= 30 and len(mpu_rows) >= 20
    monkeypatch.setattr(cgroups, "mpu", None)  # no mpu recorded by an earlier test's engine: the mesh answers
    compared = 0
    with fake_world(rank, world):
        try:
            mesh = DeepSpeedDeviceMesh.build(ep=EP, **sizes)
            cgroups.bind_mesh(mesh)
            for row in groups_rows:
                shim = _legacy_call(cgroups, row.name[len(GROUPS) :], row)
                assert _evaluate(row, mesh) == shim, (row.name, sizes)
                compared += 1
            mpu = MeshMPU(mesh)
            for row in mpu_rows:
                name = row.name[len("mpu.") :]
                if not hasattr(mpu, name):  # the shim's mpu has no such getter (e.g. a grid-only one)
                    continue
                assert _evaluate(row, mesh) == _legacy_call(mpu, name, row), (row.name, sizes)
                compared += 1
        finally:
            cgroups.bind_mesh(None)
            cgroups._release_process_group_references()
    assert compared >= len(groups_rows) + 20


# the groups rows deepspeed 0.19.8 answers from process state with no mpu: the lettered (AutoTP)
# getters after _init_tp_mesh_device(tp), the expert getters after _create_expert_and_data_parallel(2)
# (equal to the mesh's expert groups when tp = 1, as the catalog's notes say)
LETTERED = [r for r in _rows("groups", GROUPS) if not r.name[len(GROUPS) :].startswith("_")]
EXPERT = [r for r in _rows("groups", GROUPS) if "(N)" in r.mesh]


@pytest.mark.parametrize("world, rank, tp", [(8, 5, 1), (8, 5, 2), (16, 6, 4)])
def test_lettered_and_expert_rows_answer_as_deepspeed(world, rank, tp):
    from mesh_core import DeepSpeedDeviceMesh

    assert len(LETTERED) >= 10 and len(EXPERT) >= 10
    rows = LETTERED + (EXPERT if tp == 1 else [])
    with fake_world(rank, world, deepspeed_comm=True), contextlib.redirect_stdout(io.StringIO()):
        from deepspeed.utils import groups as legacy

        try:
            legacy._init_tp_mesh_device(tp)
            if tp == 1:
                legacy._create_expert_and_data_parallel(EP)
            deepspeed_answers = {row.name: _legacy_call(legacy, row.name[len(GROUPS) :], row) for row in rows}
            mesh = DeepSpeedDeviceMesh.build(tp=tp)
            mesh_answers = {row.name: _evaluate(row, mesh) for row in rows}
        finally:
            legacy._release_process_group_references()
    assert mesh_answers == deepspeed_answers


def _grid_answers(grid, rows) -> dict[str, object]:
    answers = {}
    for row in rows:
        name = row.name[len(GRID) :]
        try:
            value = getattr(grid, name)
            answers[name] = _value(value() if row.form == "call" else value)
        except AttributeError as err:  # legacy has some attributes only for some layouts
            answers[name] = ("raised", type(err).__name__)
    return answers


@pytest.mark.parametrize("pp, mp, dp, rank", GRID_LAYOUTS)
def test_grid_rows_answer_as_the_shim_and_deepspeed(pp, mp, dp, rank):
    import compat.groups as cgroups
    from compat import topology as ct

    rows = _rows("grid", GRID)
    assert len(rows) >= 40
    world = pp * mp * dp
    with fake_world(rank, world, deepspeed_comm=True), contextlib.redirect_stdout(io.StringIO()):
        from deepspeed.runtime.pipe import topology as legacy

        deepspeed_answers = _grid_answers(
            legacy.PipelineParallelGrid(topology=legacy.PipeModelDataParallelTopology(num_pp=pp, num_mp=mp, num_dp=dp)),
            rows,
        )
    with fake_world(rank, world):
        try:
            grid = ct.PipelineParallelGrid(topology=ct.PipeModelDataParallelTopology(num_pp=pp, num_mp=mp, num_dp=dp))
            shim_answers = _grid_answers(grid, rows)
            mesh_answers = {row.name[len(GRID) :]: _evaluate(row, grid.mesh) for row in rows}
        finally:
            cgroups._release_process_group_references()
    assert shim_answers == deepspeed_answers  # the shim claims equality with 0.19.8 here
    differ = {k for k in mesh_answers if shim_answers[k] != mesh_answers[k]}
    # documented in the catalog's notes: legacy has model_groups only when mp > 1, the mesh always answers
    assert differ == ({"model_groups"} if mp == 1 else set()), {k: (shim_answers[k], mesh_answers[k]) for k in differ}
    assert "mp > 1" in ds_mesh_advice.row(GRID + "model_groups").notes


def test_a_drifted_expression_fails(monkeypatch):
    """The check reads the catalog's expression: one changed expression gives another answer."""
    from mesh_core import DeepSpeedDeviceMesh

    row = ds_mesh_advice.row(GROUPS + "_get_sequence_data_parallel_world_size")
    drifted = ds_mesh_advice.Row(**{**row.__dict__, "mesh": '<mesh>.size("dp")'})
    with fake_world(6, 8):
        mesh = DeepSpeedDeviceMesh.build(dp=2, sp=2, tp=2)
        assert _evaluate(row, mesh) == 4 and _evaluate(drifted, mesh) == 2
