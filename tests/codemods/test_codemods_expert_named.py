"""Expert getters inside DeepSpeed's engine-scoped modules, rewritten to the model's mesh by group name.

DeepSpeed's engine reads the expert groups its MoE layers built through a name-keyed table
(``groups._get_expert_parallel_group(group_name)`` with a run-time ``group_name``). The codemod
rewrites those reads to ``expert_groups_named(model_mesh(self), group_name)``; the mesh runtime
mirrors every legacy expert builder into the mesh of the engine in scope. Legacy side: the real
deepspeed 0.19.8 on fake worlds. Migrated side: the codemod's output run on the mesh runtime (compat
installed) in the engine's groups state, the builders called before the engine's state was bound
(user code) and inside it (MoE layers while the engine is built). Same results, the same group
objects as compat's legacy getters serve, no process group created by a rewritten read.
"""

from __future__ import annotations

import pytest

from codemods import migrate_code
from fakepg import build_expert_groups as _build
from fakepg import exec_source as _load
from fakepg import fake_world, plain, record_new_groups
from mesh_core.runtime_hooks import (
    expert_group_names,
    expert_groups_named,
    largest_expert_groups_name,
    named_expert_data_parallel_groups,
    named_expert_parallel_groups,
    register_expert_groups,
)

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

PROBE = """
from deepspeed.utils import groups


class DeepSpeedEngine:
    def probe(self, names):
        out = {}
        for group_name in names:
            out[group_name] = [
                groups._get_expert_parallel_group(group_name),
                groups._get_expert_parallel_group_ranks(group_name),
                groups._get_expert_data_parallel_group(group_name),
                groups._get_expert_data_parallel_group_ranks(group_name),
                groups._get_expert_parallel_world_size(group_name),
                groups._get_expert_data_parallel_world_size(group_name),
                groups._get_expert_parallel_rank(group_name),
                groups._get_expert_data_parallel_rank(group_name),
                groups._get_expert_broadcast_src_rank(group_name),
            ]
        out["dicts"] = [dict(groups._get_expert_parallel_group_dict()),
                        dict(groups._get_expert_data_parallel_group_dict())]
        largest = groups._get_max_expert_size_name()
        out["largest"] = [largest, groups._get_max_expert_parallel_group(),
                          groups._get_expert_parallel_rank(groups._get_max_expert_size_name())]
        return out

    def missing(self):
        return groups._get_expert_data_parallel_group("ep_size_999")
"""

# (world, pp, tp, dp, ep sizes, builder): "plain" = _create_expert_and_data_parallel(ep) (MoE layer,
# no expert TP), "dbe" = the same with use_data_before_expert_parallel_, "tp" =
# _create_expert_data_and_model_parallel(ep, mpu=grid) (expert tensor parallelism)
CASES = [
    (4, 1, 1, 4, (2, 4), "plain"),
    (8, 2, 1, 4, (2, 4), "plain"),
    (8, 1, 1, 8, (2, 4), "dbe"),
    (8, 1, 2, 4, (2, 4), "plain"),
    (8, 1, 2, 4, (2,), "tp"),
    (16, 2, 2, 4, (2, 4), "tp"),
]
SAMPLE = 3


def _ranks(world: int) -> list[int]:
    return sorted({0, world // 2 + 1, world - 1})[:SAMPLE]


def _migrated() -> str:
    return migrate_code(PROBE, module="deepspeed.runtime.engine", package="deepspeed.runtime").code


def _names(eps) -> list[str]:
    return [f"ep_size_{ep}" for ep in eps]


def test_every_expert_getter_of_the_engine_is_rewritten_to_the_mesh_by_name():
    code = _migrated()
    assert "groups._" not in code and "TODOV1" not in code, code
    assert "expert_groups_named(model_mesh(self), group_name).ep_group" in code
    assert "largest_expert_groups_name(model_mesh(self))" in code
    assert "dict(named_expert_data_parallel_groups(model_mesh(self)))" in code
    assert "expert_groups_named(model_mesh(self), largest_expert_groups_name(model_mesh(self)))" in code


def test_outside_deepspeed_a_runtime_name_stays_with_a_todo():
    # (inside DeepSpeed every module reads by name: tests/codemods/test_codemods_expert_process.py)
    out = migrate_code(PROBE, module="my_moe.layers", package="my_moe")
    assert "expert_groups_named" not in out.code and out.todos


def _legacy(world, pp, tp, dp, eps, builder) -> dict:
    import deepspeed.runtime.pipe.topology as topology
    from deepspeed.utils import groups

    probe = _load(PROBE)["DeepSpeedEngine"]()
    out = {}
    for rank in _ranks(world):
        with fake_world(rank, world, deepspeed_comm=True):
            grid = topology.PipelineParallelGrid(
                topology=topology.PipeModelDataParallelTopology(num_pp=pp, num_mp=tp, num_dp=dp)
            )
            groups.mpu = grid
            _build(groups, grid, eps, builder)
            out[rank] = plain(probe.probe(_names(eps)))
            with pytest.raises(AssertionError):
                probe.missing()
            groups.mpu = None
    return out


@pytest.mark.deepspeed
@pytest.mark.parametrize("world,pp,tp,dp,eps,builder", CASES)
@pytest.mark.parametrize("built", ["before the engine", "inside the engine"])
def test_rewritten_expert_reads_equal_legacy(world, pp, tp, dp, eps, builder, built, monkeypatch):
    import deepspeed  # noqa: F401

    import compat.install as installer
    from compat.engine_mesh import as_engine_mesh
    from compat.engine_scope import GroupsState, groups_state

    monkeypatch.setenv("LOCAL_RANK", "0")
    legacy = _legacy(world, pp, tp, dp, eps, builder)
    migrated_class = _load(_migrated())["DeepSpeedEngine"]
    unmigrated = _load(PROBE)["DeepSpeedEngine"]()
    installer.install()
    try:
        import deepspeed.runtime.pipe.topology as routed
        from deepspeed.utils import groups

        for rank in _ranks(world):
            with fake_world(rank, world, deepspeed_comm=True):
                grid = routed.PipelineParallelGrid(
                    topology=routed.PipeModelDataParallelTopology(num_pp=pp, num_mp=tp, num_dp=dp)
                )
                groups.mpu = grid
                state = GroupsState(as_engine_mesh(grid.mesh), grid, None)
                if built == "before the engine":
                    _build(groups, grid, eps, builder)
                with groups_state(state):
                    if built == "inside the engine":
                        _build(groups, grid, eps, builder)
                    served = unmigrated.probe(_names(eps))  # compat's legacy getters
                    for mesh_device in (None, state.mesh):  # while initialize builds it / after
                        engine = migrated_class()
                        engine.mesh_device = mesh_device
                        with record_new_groups() as created:
                            got = engine.probe(_names(eps))
                        assert created == [], (rank, created)
                        assert plain(got) == legacy[rank], rank
                        for name in _names(eps):  # the very communicators compat hands out
                            assert got[name][0] is served[name][0] and got[name][2] is served[name][2]
                        with pytest.raises(AssertionError, match="ep_size_999"):
                            engine.missing()
                groups.mpu = None
    finally:
        installer.uninstall()


def test_mesh_serves_expert_groups_by_name(world):
    from mesh_core import DeepSpeedDeviceMesh, ExpertGroups, MeshSpecError
    from mesh_core.runtime_hooks import ExpertGroupsNotBuilt

    mesh = DeepSpeedDeviceMesh.build(dp=4, verify=False)
    assert expert_group_names(mesh) == [] and largest_expert_groups_name(mesh) == "ep_size_None"
    with pytest.raises(ExpertGroupsNotBuilt, match=r"'ep_size_2'.*registered: none"):
        expert_groups_named(mesh, "ep_size_2")
    with pytest.raises(AssertionError):  # DeepSpeed's "expert parallel group is not initialized" type
        expert_groups_named(mesh, "ep_size_2")
    ep_view, edp_view = named_expert_parallel_groups(mesh), named_expert_data_parallel_groups(mesh)
    two = mesh.expert_groups(2)
    assert expert_groups_named(mesh, "ep_size_2") is two
    assert dict(ep_view) == {"ep_size_2": two.ep_group} and dict(edp_view) == {"ep_size_2": two.edp_group}  # live
    with pytest.raises(TypeError):
        ep_view["ep_size_8"] = None  # read-only
    other = ExpertGroups(ep_size=2, ep_group=None, edp_group=None, ep_ranks=[1], edp_ranks=[1])
    assert register_expert_groups(mesh, "ep_size_2", other) is two  # the first registration wins
    assert register_expert_groups(mesh, "ep_size_4", other) is other
    assert expert_group_names(mesh) == ["ep_size_2", "ep_size_4"]
    assert largest_expert_groups_name(mesh) == "ep_size_4"
    with pytest.raises(MeshSpecError, match="without a layout"):
        other.all_ep_ranks
    with pytest.raises(MeshSpecError, match="non-empty string"):
        register_expert_groups(mesh, "", other)
    mesh.destroy()
    assert expert_group_names(mesh) == [] and not ep_view
