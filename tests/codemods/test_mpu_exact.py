"""mpu sites inside DeepSpeed whose exact mesh form depends on which mpus reach them (issue 10m,
``codemods.rules._mpu_exact``): the pipeline engine's ``get_pipe_parallel_*``, the ZeRO optimizers'
``hasattr``-guarded ``get_slice_parallel_*``, the engine's AutoTP hook ``self.mpu.get_tensor_model_parallel_src_rank()``
and ``groups._get_model_parallel_world_size()``. Legacy: the real deepspeed 0.19.8 on fake worlds, on
every mpu kind that reaches the site; migrated: the codemod's output on the same objects and on the
mesh runtime's. Same values, the very groups the mpu hands out, no group created, no collective run.
"""

from __future__ import annotations

import importlib
import types

import pytest
from test_mpu_mesh import build_mpus, outcome, same

from codemods import migrate_code
from compat import group_trace
from fakepg import exec_source as _load
from fakepg import fake_world, plain

pytestmark = [pytest.mark.deepspeed, pytest.mark.filterwarnings("ignore::Warning")]

PIPE = """
import deepspeed.comm as dist


class PipelineEngine:
    def __init__(self, mpu):
        self.mpu = mpu

    def site(self):
        return [self.mpu.get_pipe_parallel_group(), self.mpu.get_pipe_parallel_world_size(),
                self.mpu.get_pipe_parallel_rank()]
"""

SLICE = """
import deepspeed.comm as dist


class ZeROOptimizer:
    def __init__(self, mpu):
        self.mpu = mpu

    def site(self):
        if self.mpu is None:
            return 1
        return self.mpu.get_slice_parallel_world_size() if hasattr(self.mpu, "get_slice_parallel_world_size") \\
            else self.mpu.get_tensor_model_parallel_world_size()


def site(mpu):
    return ZeROOptimizer(mpu).site()
"""

ENGINE = """
from deepspeed.utils import groups


class DeepSpeedEngine:
    def __init__(self, mpu):
        self.mpu = mpu

    def _configure_tensor_parallel_states(self, tp):
        self.mpu = groups
        self.mpu._init_tp_mesh_device(tensor_model_parallel_size=tp)

        def hook():
            return self.mpu.get_tensor_model_parallel_src_rank()

        self.hook = hook

    def _configure_distributed_model(self):
        if self.mpu is not None:
            groups.mpu = self.mpu
        return groups._get_model_parallel_world_size()
"""


def _migrate(source: str, module: str) -> str:
    out = migrate_code(source, module=module, package=module.rsplit(".", 1)[0])
    # the one TODOV1 allowed: the engine's own `groups.mpu = self.mpu` (legacy state, kept as DeepSpeed has it)
    assert out.code.count("TODOV1") == out.spelled_out().count("groups.mpu is legacy module state"), out.code
    return out.code


def test_sites_are_rewritten_only_where_the_mpus_reaching_them_are_known():
    pipe = _migrate(PIPE, "deepspeed.runtime.pipe.engine")
    assert 'mesh_of(self.mpu).get_group("pp"), mesh_of(self.mpu).size("pp")' in pipe
    assert 'mesh_of(self.mpu).get_local_rank("pp")' in pipe
    assert 'mesh_of(self.mpu).size("tp") if hasattr(self.mpu, "get_slice_parallel_world_size")' in _migrate(
        SLICE, "deepspeed.runtime.base_optimizer"
    )
    engine = _migrate(ENGINE, "deepspeed.runtime.engine")
    assert "return autotp_groups().tensor_parallel_src_rank()" in engine
    assert "return model_parallel_world_size(self.mpu)" in engine
    # elsewhere the mpu is unknown: left with a TODOV1
    for source, module in [
        (PIPE, "deepspeed.runtime.fake_site"),
        (SLICE.replace("if hasattr", "if callable"), "deepspeed.runtime.base_optimizer"),
    ]:
        out = migrate_code(source, module=module, package="deepspeed.runtime")
        assert out.todos and "TODOV1" in out.code
    reassigned = ENGINE + "\n    def rebind(self, mpu):\n        self.mpu = mpu\n"
    out = migrate_code(reassigned, module="deepspeed.runtime.engine", package="deepspeed.runtime")
    assert "autotp_groups" not in out.code and "get_tensor_model_parallel_src_rank(): " in out.spelled_out()
    late = ENGINE.replace("        self.mpu = groups\n", "").replace(
        "self.hook = hook", "self.hook = hook\n        self.mpu = groups"
    )
    assert (
        "autotp_groups" not in migrate_code(late, module="deepspeed.runtime.engine", package="deepspeed.runtime").code
    )


LAYOUTS = [(4, 2, 1), (4, 1, 2), (8, 2, 2), (8, 4, 1), (8, 1, 4), (16, 2, 4)]


def _grids(pp: int, tp: int, legacy: bool) -> dict:
    import torch.distributed as dist

    if legacy:
        import deepspeed.runtime.pipe.topology as topology
    else:
        import compat.topology as topology
    world = dist.get_world_size()
    dp = world // (pp * tp)
    return {
        "pipe_model_data": topology.PipelineParallelGrid(
            topology=topology.PipeModelDataParallelTopology(num_pp=pp, num_mp=tp, num_dp=dp)
        ),
        "pipe_data": topology.PipelineParallelGrid(
            topology=topology.PipeDataParallelTopology(num_pp=pp, num_dp=world // pp)
        ),
        "default": topology.PipelineParallelGrid(),
    }


@pytest.mark.parametrize("world,pp,tp", LAYOUTS)
def test_pipe_engine_broadcast_group_equals_legacy_on_every_grid(world, pp, tp):
    legacy = _load(PIPE)["PipelineEngine"]
    migrated = _load(_migrate(PIPE, "deepspeed.runtime.pipe.engine"))["PipelineEngine"]
    for rank in sorted({0, world // 2 + 1, world - 1}):
        with fake_world(rank, world, deepspeed_comm=True):
            legacy_grids, runtime_grids = _grids(pp, tp, legacy=True), _grids(pp, tp, legacy=False)
            for name, grid in legacy_grids.items():
                want = legacy(grid).site()
                with group_trace.trace() as created:
                    got = migrated(grid).site()
                    runtime = migrated(runtime_grids[name]).site()
                assert created == [], created
                assert same(got, want), (name, got, want)  # the very group legacy's grid hands out
                assert plain(runtime) == plain(want), (name, rank)  # the mesh runtime's grid: same ranks
                assert runtime[0] is runtime_grids[name].get_pipe_parallel_group()


@pytest.mark.parametrize("world,pp,tp", LAYOUTS)
def test_slice_size_equals_legacy_on_every_mpu_kind(world, pp, tp):
    legacy = _load(SLICE)["site"]
    migrated = _load(_migrate(SLICE, "deepspeed.runtime.base_optimizer"))["site"]
    ran = set()
    for rank in sorted({0, world - 1}):
        with fake_world(rank, world, deepspeed_comm=True):
            mpus = build_mpus(pp, tp)
            mpus.update({f"runtime_{k}": v for k, v in _grids(pp, tp, legacy=False).items()})
            mpus.update({f"legacy_{k}": v for k, v in _grids(pp, tp, legacy=True).items()})
            # DeepSpeed's own test mpu for checkpoint reshaping (unit/checkpoint/test_reshape_checkpoint.py)
            mpus["slice_only"] = types.SimpleNamespace(
                get_pipe_parallel_world_size=lambda: pp, get_slice_parallel_world_size=lambda: tp
            )
            for kind, mpu in mpus.items():
                want = outcome(legacy, mpu)
                with group_trace.trace() as created:
                    got = outcome(migrated, mpu)
                assert created == [], (kind, created)
                if want[0] == "raised":
                    continue
                ran.add(kind)
                assert got == want, (kind, got, want)
            if "parallel_state_sp" in mpus:
                mpus["parallel_state_sp"]._release_sequence_parallel_groups()
    assert {
        "none",
        "grid",
        "megatron",
        "mesh_mpu",
        "slice_only",
        "runtime_pipe_model_data",
    } <= ran  # test_mpu: legacy raises


@pytest.mark.parametrize("world,pp,tp", LAYOUTS)
def test_engine_model_parallel_world_size_equals_legacy_on_every_mpu_kind(world, pp, tp):
    from deepspeed.utils import groups

    legacy = _load(ENGINE)["DeepSpeedEngine"]
    migrated = _load(_migrate(ENGINE, "deepspeed.runtime.engine"))["DeepSpeedEngine"]
    for rank in sorted({0, world - 1}):
        with fake_world(rank, world, deepspeed_comm=True):
            mpus = build_mpus(pp, tp)
            mpus["autotp_groups_module"] = groups  # the engine's self.mpu after its AutoTP set-up
            groups._init_tp_mesh_device(tp)
            for kind, mpu in mpus.items():
                groups.mpu = None  # a fresh process: legacy leaks groups.mpu from the previous engine
                want = outcome(lambda m: legacy(m)._configure_distributed_model(), mpu)
                groups.mpu = None
                with group_trace.trace() as created:
                    got = outcome(lambda m: migrated(m)._configure_distributed_model(), mpu)
                assert created == [], (kind, created)
                assert want[0] == "ok" and got == want, (kind, got, want)
            groups.mpu = None
            if "parallel_state_sp" in mpus:
                mpus["parallel_state_sp"]._release_sequence_parallel_groups()


@pytest.mark.parametrize("world,tp", [(4, 1), (4, 2), (8, 2), (8, 4), (8, 8)])
def test_engine_autotp_hook_src_rank_equals_legacy(world, tp, monkeypatch):
    installer = importlib.import_module("compat.install")  # compat.install is also a function attribute
    from compat.engine_mesh import EngineMesh
    from compat.engine_scope import GroupsState, groups_state
    from mesh_core import MeshSpec

    monkeypatch.setenv("LOCAL_RANK", "0")
    ranks = sorted({0, world // 2 + 1, world - 1})
    want = {}
    legacy = _load(ENGINE)["DeepSpeedEngine"]
    from deepspeed.utils import groups as legacy_groups

    for rank in ranks:
        with fake_world(rank, world, deepspeed_comm=True):
            engine = legacy(None)
            engine._configure_tensor_parallel_states(tp)
            want[rank] = [engine.hook()]
            legacy_groups.set_tensor_model_parallel_world_size(world)  # a user override: the legacy formula
            want[rank].append(engine.hook())
    migrated = _load(_migrate(ENGINE, "deepspeed.runtime.engine"))["DeepSpeedEngine"]
    installer.install()
    try:
        from deepspeed.utils import groups

        for rank in ranks:
            for bound in (False, True):  # before initialize returns / in the engine's scope after
                with fake_world(rank, world, deepspeed_comm=True):
                    engine = migrated(None)
                    mesh = EngineMesh(MeshSpec.build(world, tp=tp), verify=False) if bound else None
                    with groups_state(GroupsState(mesh, groups, None) if bound else None):
                        engine._configure_tensor_parallel_states(tp)
                        with group_trace.trace() as created:
                            got = [engine.hook()]
                        assert created == []
                        assert got[0] == groups.get_tensor_model_parallel_src_rank()  # what compat serves
                        groups.set_tensor_model_parallel_world_size(world)
                        got.append(engine.hook())
                    assert got == want[rank], (rank, bound, got, want[rank])
    finally:
        installer.uninstall()
