"""DeepSpeed's process-wide expert state read through whichever mesh is current (issue 10, item 3).

Legacy ``deepspeed.utils.groups`` keeps one name-keyed expert table and one expert tensor-parallel
size per process; DeepSpeed reads them outside any engine too (MoE gating and layers, the overflow
check and the MoE grad norm of ``runtime/utils.py``, the checkpoint writer's expert info). The
codemod rewrites those reads inside DeepSpeed to ``expert_tensor_parallel_size()`` and
``expert_groups_named(current_mesh(), name)...``; the mesh runtime serves the legacy state to every
mesh (``mesh_core.runtime_hooks.serve_process_experts``). Legacy side: the real deepspeed 0.19.8 on fake worlds.
Migrated side: the codemod's output (and the migrated real ``model_checkpointing/utils.py``) on the
mesh runtime, in every state DeepSpeed reaches those sites: no process group yet, groups built with
no engine (current mesh = the world mesh), inside an engine's scope, after it (default mesh), after
the engine's mesh was destroyed, after a release. Same values, the very group objects compat hands
out, no process group created.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest

from codemods import migrate_code
from fakepg import (
    build_expert_groups as _build,
)
from fakepg import (
    exec_source as _load,
)
from fakepg import (
    fake_world,
    plain,
    record_new_groups,
)
from fakepg import (
    probe_ranks as _ranks,
)
from mesh_core.runtime_hooks import (
    expert_group_names,
    expert_groups_named,
    largest_expert_groups_name,
    named_expert_parallel_groups,
    register_expert_groups,
)

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

TP_PROBE = """
from deepspeed.utils import groups


def expert_tp():
    if groups._get_expert_model_parallel_world_size() == 1:
        return 1
    return groups._get_expert_model_parallel_world_size()
"""

NAMED_PROBE = """
from deepspeed.utils import groups


def probe(names):
    out = {"max": groups._get_max_expert_parallel_group(), "largest": groups._get_max_expert_size_name(),
           "ep": dict(groups._get_expert_parallel_group_dict()), "edp": dict(groups._get_expert_data_parallel_group_dict())}
    for name in names:
        out[name] = [name in groups._get_expert_parallel_group_dict(), groups._get_expert_parallel_group(name),
                     groups._get_expert_data_parallel_group(name), groups._get_expert_parallel_rank(name),
                     groups._get_expert_data_parallel_world_size(name), groups._get_expert_broadcast_src_rank(name)]
    return out


def missing():
    return groups._get_expert_parallel_group("ep_size_999")
"""

CHECKPOINT_UTILS = "runtime/model_checkpointing/utils.py"

# (world, pp, tp, dp, ep sizes, builder): as tests/codemods/test_codemods_expert_named.py
CASES = [
    (4, 1, 1, 4, (2, 4), "plain"),
    (8, 2, 1, 4, (2,), "plain"),
    (8, 1, 1, 8, (2, 4), "dbe"),
    (8, 1, 2, 4, (2,), "tp"),
    (16, 2, 2, 4, (2, 4), "tp"),
]
STATES = ("no engine", "inside the engine", "after the engine", "destroyed default mesh")


def _migrate(source: str, module: str) -> str:
    return migrate_code(source, module=module, package=module.rsplit(".", 1)[0]).code


def _checkpoint_utils(migrated: bool) -> dict:
    import deepspeed

    path = Path(deepspeed.__file__).parent / CHECKPOINT_UTILS
    source = path.read_text().replace(
        "from .data_parallel_writer_factory", "from deepspeed.runtime.model_checkpointing.data_parallel_writer_factory"
    )
    if migrated:
        source = _migrate(source, "deepspeed.runtime.model_checkpointing.utils")
    return _load(source)


def _grid(topology, pp, tp, dp):
    return topology.PipelineParallelGrid(
        topology=topology.PipeModelDataParallelTopology(num_pp=pp, num_mp=tp, num_dp=dp)
    )


def _names(eps) -> list[str]:
    return [f"ep_size_{ep}" for ep in eps]


def _info(utils, groups) -> list:
    info = utils["_create_expert_parallel_info"](groups)
    return [info.ep_world_size, info.ep_rank, info.dp_world_size, list(info.dp_peer_ranks), info.dp_rank]


def test_the_sites_are_rewritten():
    tp = _migrate(TP_PROBE, "deepspeed.moe.sharded_moe")
    assert "groups._" not in tp and "TODOV1" not in tp and "expert_tensor_parallel_size() == 1" in tp, tp
    named = _migrate(NAMED_PROBE, "deepspeed.runtime.utils")
    assert "groups._" not in named and "TODOV1" not in named, named
    assert "expert_groups_named(current_mesh(), largest_expert_groups_name(current_mesh())).ep_group" in named
    assert "name in named_expert_parallel_groups(current_mesh())" in named
    import deepspeed

    source = (Path(deepspeed.__file__).parent / CHECKPOINT_UTILS).read_text()
    out = migrate_code(
        source, module="deepspeed.runtime.model_checkpointing.utils", package="deepspeed.runtime.model_checkpointing"
    )
    assert "groups._get" not in out.code and "largest_expert_groups_name(current_mesh())" in out.code, out.code
    # a `groups` parameter elsewhere is still unknown: flagged, not rewritten
    other = "def f(groups):\n    return groups._get_max_expert_size_name()\n"
    elsewhere = migrate_code(other, module="deepspeed.runtime.other", package="deepspeed.runtime")
    assert "groups._get_max_expert_size_name()" in elsewhere.code and elsewhere.todos
    # user code keeps the expert-TP read (it may run without the runtime's source)
    user = migrate_code(TP_PROBE, module="train", package="")
    assert "groups._get_expert_model_parallel_world_size()" in user.code and user.todos


def _legacy_tp(world, pp, tp, dp, eps, builder) -> dict:
    import deepspeed.runtime.pipe.topology as topology
    from deepspeed.utils import groups

    out = {}
    for rank in _ranks(world):
        seen = [groups._get_expert_model_parallel_world_size()]  # no process group
        with fake_world(rank, world, deepspeed_comm=True):
            grid = _grid(topology, pp, tp, dp)
            groups.mpu = grid
            seen.append(groups._get_expert_model_parallel_world_size())
            _build(groups, grid, eps, builder)
            seen.append(groups._get_expert_model_parallel_world_size())
            groups._create_expert_and_data_parallel(eps[0])  # a plain builder leaves it
            seen.append(groups._get_expert_model_parallel_world_size())
            groups.expert_tensor_parallel_world_size = 3  # the module attribute, written
            seen.append(groups._get_expert_model_parallel_world_size())
            groups.expert_tensor_parallel_world_size = tp
        seen.append(groups._get_expert_model_parallel_world_size())  # released by deepspeed.comm's teardown
        out[rank] = seen
    return out


@pytest.mark.deepspeed
@pytest.mark.parametrize("world,pp,tp,dp,eps,builder", CASES)
def test_expert_tensor_parallel_size_equals_legacy(world, pp, tp, dp, eps, builder, monkeypatch):
    import compat.install as installer
    from compat.engine_mesh import as_engine_mesh
    from compat.engine_scope import GroupsState, groups_state

    monkeypatch.setenv("LOCAL_RANK", "0")
    legacy = _legacy_tp(world, pp, tp, dp, eps, builder)
    assert any(v == tp for seen in legacy.values() for v in seen[2:4])
    expert_tp = _load(_migrate(TP_PROBE, "deepspeed.moe.sharded_moe"))["expert_tp"]
    installer.install()
    try:
        import deepspeed.runtime.pipe.topology as routed
        from deepspeed.utils import groups

        for rank in _ranks(world):
            seen = [expert_tp()]
            with fake_world(rank, world, deepspeed_comm=True):
                grid = _grid(routed, pp, tp, dp)
                groups.mpu = grid
                seen.append(expert_tp())
                with groups_state(GroupsState(as_engine_mesh(grid.mesh), grid, None)):  # inside an engine
                    _build(groups, grid, eps, builder)
                    seen.append(expert_tp())
                groups._create_expert_and_data_parallel(eps[0])
                seen.append(expert_tp())
                groups.expert_tensor_parallel_world_size = 3
                seen.append(expert_tp())
                groups.expert_tensor_parallel_world_size = tp
            seen.append(expert_tp())
            assert seen == legacy[rank], rank
    finally:
        installer.uninstall()
    assert expert_tp() == 1  # without the runtime's source: experts are not tensor-parallel


def _legacy_named(world, pp, tp, dp, eps, builder) -> dict:
    import deepspeed.runtime.pipe.topology as topology
    from deepspeed.utils import groups

    probe = _load(NAMED_PROBE)
    utils = _checkpoint_utils(migrated=False)
    out = {}
    for rank in _ranks(world):
        with fake_world(rank, world, deepspeed_comm=True):
            grid = _grid(topology, pp, tp, dp)
            groups.mpu = grid
            _build(groups, grid, eps, builder)
            out[rank] = [plain(probe["probe"](_names(eps))), _info(utils, groups)]
            with pytest.raises(AssertionError):
                probe["missing"]()
            groups._release_process_group_references()
            with pytest.raises(AssertionError):
                probe["probe"](_names(eps))
            with pytest.raises(AssertionError):
                _info(utils, groups)
    return out


@pytest.mark.deepspeed
@pytest.mark.parametrize("world,pp,tp,dp,eps,builder", CASES)
def test_named_expert_reads_outside_the_engine_equal_legacy(world, pp, tp, dp, eps, builder, monkeypatch):
    import compat.install as installer
    from compat.engine_mesh import as_engine_mesh
    from compat.engine_scope import GroupsState, groups_state
    from mesh_core import set_default_mesh

    monkeypatch.setenv("LOCAL_RANK", "0")
    legacy = _legacy_named(world, pp, tp, dp, eps, builder)
    migrated = _load(_migrate(NAMED_PROBE, "deepspeed.runtime.utils"))
    unmigrated = _load(NAMED_PROBE)
    installer.install()
    try:
        import deepspeed.runtime.pipe.topology as routed
        from deepspeed.utils import groups

        utils = _checkpoint_utils(migrated=True)
        for state in STATES:
            for rank in _ranks(world):
                with fake_world(rank, world, deepspeed_comm=True):
                    grid = _grid(routed, pp, tp, dp)
                    groups.mpu = grid
                    engine = GroupsState(as_engine_mesh(grid.mesh), grid, None)
                    if state == "no engine":
                        _build(groups, grid, eps, builder)
                    else:
                        with groups_state(engine):  # the MoE layers build their groups while the engine is built
                            _build(groups, grid, eps, builder)
                    if state != "no engine":
                        set_default_mesh(engine.mesh)  # compat's deepspeed.initialize does, for the engine built last
                    if state == "destroyed default mesh":
                        engine.mesh.destroy()
                    served = unmigrated["probe"](_names(eps))  # compat's legacy getters
                    with groups_state(engine) if state == "inside the engine" else contextlib.nullcontext():
                        with record_new_groups() as created:
                            got = migrated["probe"](_names(eps))
                            info = _info(utils, groups)
                        assert created == [], (state, rank, created)
                        assert [plain(got), info] == legacy[rank], (state, rank)
                        for name in _names(eps):  # the very communicators compat hands out
                            assert got[name][1] is served[name][1] and got[name][2] is served[name][2]
                        with pytest.raises(AssertionError, match="ep_size_999"):
                            migrated["missing"]()
                    groups._release_process_group_references()
                    with pytest.raises(AssertionError):
                        migrated["probe"](_names(eps))
                    with pytest.raises(AssertionError):
                        _info(utils, groups)
                    set_default_mesh(None)
    finally:
        installer.uninstall()
        set_default_mesh(None)


def test_a_mesh_serves_the_process_table_first(world):
    from mesh_core import DeepSpeedDeviceMesh, ExpertGroups
    from mesh_core.runtime_hooks import ExpertGroupsNotBuilt, process_experts, serve_process_experts

    class Source:
        def __init__(self):
            self.named, self.tp = {}, 1

        def named_expert_groups(self):
            return self.named

        def expert_tensor_parallel_size(self):
            return self.tp

    mesh = DeepSpeedDeviceMesh.build(dp=4, verify=False)
    own = mesh.expert_groups(2)
    registered = ExpertGroups(ep_size=4, ep_group=None, edp_group=None, ep_ranks=[1], edp_ranks=[1])
    register_expert_groups(mesh, "ep_size_4", registered)
    source = Source()
    with pytest.raises(TypeError, match="named_expert_groups"):
        serve_process_experts(object())
    serve_process_experts(source)
    try:
        assert process_experts() is source
        served = ExpertGroups(ep_size=2, ep_group=None, edp_group=None, ep_ranks=[0, 1], edp_ranks=[1])
        # registered copies (what compat mirrored) give way to the source; groups the mesh built stay
        assert expert_group_names(mesh) == ["ep_size_2"] and expert_groups_named(mesh, "ep_size_2") is own
        with pytest.raises(ExpertGroupsNotBuilt, match="ep_size_4"):
            expert_groups_named(mesh, "ep_size_4")
        source.named["ep_size_2"] = served
        source.named["ep_size_8"] = served
        assert expert_groups_named(mesh, "ep_size_2") is served  # the process table first
        assert largest_expert_groups_name(mesh) == "ep_size_8"
        assert list(named_expert_parallel_groups(mesh)) == ["ep_size_2", "ep_size_8"]
    finally:
        serve_process_experts(None)
    assert expert_groups_named(mesh, "ep_size_4") is registered
    assert largest_expert_groups_name(mesh) == "ep_size_4"
    mesh.destroy()


def _gating(module: dict) -> list:
    import torch

    torch.manual_seed(0)
    logits = torch.randn(7, 4)
    out = [
        module["top1gating"](logits, 1.0, 1, drop_tokens=False, use_rts=False),
        module["top2gating"](logits, 1.0, 1, drop_tokens=False, top2_2nd_expert_sampling=False),
        module["topkgating"](logits, 2, 1.0, 1, drop_tokens=False),
    ]
    return [[t.tolist() for t in result] for result in out]


def _gating_states(module: dict, groups, topology, rank: int) -> list:
    seen = [_gating(module)]  # no process group: legacy reads its global, the rewrite needs none
    with fake_world(rank, 8, deepspeed_comm=True):
        grid = _grid(topology, 1, 2, 4)
        groups.mpu = grid
        groups._create_expert_and_data_parallel(2)  # experts not tensor-parallel: capacity padded to tp
        seen.append(_gating(module))
        groups._create_expert_data_and_model_parallel(4, mpu=grid)  # expert TP = 2: no padding
        seen.append(_gating(module))
    return seen


@pytest.mark.deepspeed
def test_migrated_moe_gating_equals_legacy(monkeypatch):
    """The real ``moe/sharded_moe.py`` gating functions, migrated, against deepspeed's own."""
    import deepspeed
    import deepspeed.moe.sharded_moe as legacy_module
    import deepspeed.runtime.pipe.topology as topology
    from deepspeed.utils import groups

    import compat.install as installer

    monkeypatch.setenv("LOCAL_RANK", "0")
    legacy = {rank: _gating_states(vars(legacy_module), groups, topology, rank) for rank in (0, 5)}
    assert legacy[0][1] != legacy[0][2]  # the expert-TP size decides the capacity here
    source = (Path(deepspeed.__file__).parent / "moe/sharded_moe.py").read_text()
    code = _migrate(source, "deepspeed.moe.sharded_moe")
    assert "_get_expert_model_parallel_world_size" not in code
    installer.install()
    try:
        migrated: dict = {"__name__": "deepspeed.moe._migrated_sharded_moe", "__package__": "deepspeed.moe"}
        exec(compile(code, "<migrated sharded_moe>", "exec"), migrated)
        for rank in (0, 5):
            assert _gating_states(migrated, groups, topology, rank) == legacy[rank], rank
    finally:
        installer.uninstall()


def test_a_rebound_groups_parameter_stays_flagged():
    source = (
        "def _create_expert_parallel_info(groups):\n"
        "    groups = groups.other\n"
        "    return groups._get_max_expert_size_name()\n"
    )
    out = migrate_code(
        source, module="deepspeed.runtime.model_checkpointing.utils", package="deepspeed.runtime.model_checkpointing"
    )
    assert "return groups._get_max_expert_size_name()" in out.code and out.todos
