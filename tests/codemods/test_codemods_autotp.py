"""AutoTP's lettered getters and TP builder inside DeepSpeed, rewritten to mesh_core's AutoTP groups.

DeepSpeed's AutoTP code (``auto_tp``, ``tp_manager``, ``init_utils``, ``tp_collectives``) reads the
process's TP groups with no engine at hand; the codemod rewrites those reads to
``mesh_core.runtime_hooks.autotp_groups().<getter>()`` and ``groups._init_tp_mesh_device`` to
``mesh_core.runtime_hooks.init_autotp``. Legacy side: the real deepspeed 0.19.8 on fake worlds. Migrated side: the
codemod's output on the mesh runtime (compat installed), the groups built by the migrated builder or by
unmigrated (legacy) code, before any engine, with a grid as ``groups.mpu``, in an engine's scope,
after a second build with another size and after the TP group was released. Same results as legacy,
the very group objects compat's legacy getters hand out, no process group created by a rewritten read.
"""

from __future__ import annotations

import importlib

import pytest

from codemods import migrate_code
from fakepg import exec_source as _load
from fakepg import fake_world, plain, record_new_groups
from fakepg import probe_ranks as _ranks

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

PROBE = """
from deepspeed.utils import groups


def build(n):
    groups._init_tp_mesh_device(n)


def build_kw(n, dp):
    return groups._init_tp_mesh_device(tensor_model_parallel_size=n, data_parallel_size=dp)


def probe():
    readers = {
        "tp_group": lambda: groups.get_tensor_model_parallel_group(),
        "mp_group": lambda: groups.get_model_parallel_group(),
        "dp_group": lambda: groups.get_data_parallel_group(),
        "tp_size": lambda: groups.get_tensor_model_parallel_world_size(),
        "mp_size": lambda: groups.get_model_parallel_world_size(),
        "tp_rank": lambda: groups.get_tensor_model_parallel_rank(),
        "mp_rank": lambda: groups.get_model_parallel_rank(),
        "tp_src": lambda: groups.get_tensor_model_parallel_src_rank(),
        "dp_size": lambda: groups.get_data_parallel_world_size(),
        "dp_rank": lambda: groups.get_data_parallel_rank(),
    }
    out = {}
    for name, read in readers.items():
        try:
            out[name] = read()
        except AssertionError as exc:
            out[name] = ("AssertionError", str(exc))
    return out
"""
MODULE = "deepspeed.module_inject.auto_tp"

# (world, tp, second build's tp, pp of the grid set as groups.mpu)
CASES = [(4, 1, 2, 1), (4, 2, 4, 2), (4, 4, 1, 1), (8, 2, 4, 2), (8, 4, 2, 1), (8, 1, 8, 2)]
STATES = ["before", "built", "with grid mpu", "rebuilt", "tp group released"]


def _migrated() -> str:
    return migrate_code(PROBE, module=MODULE, package="deepspeed.module_inject").code


def _grid(topology, world, tp, pp):
    return topology.PipelineParallelGrid(
        topology=topology.PipeModelDataParallelTopology(num_pp=pp, num_mp=1, num_dp=world // pp)
    )


def _states(ns, groups, topology, world, tp, tp2, pp, keyword):
    """Run the legacy call sequence, yielding after each state (``ns``: the probe's namespace, the
    legacy or the migrated one)."""
    yield "before"
    if keyword:
        ns["build_kw"](tp, world // tp)
    else:
        ns["build"](tp)
    yield "built"
    groups.mpu = _grid(topology, world, tp, pp)  # legacy's TP getters ignore the mpu
    yield "with grid mpu"
    groups.mpu = None
    ns["build"](tp2)  # a no-op while TP groups exist
    yield "rebuilt"
    groups._release_process_group_references(groups.get_tensor_model_parallel_group())
    yield "tp group released"


def test_autotp_sites_are_rewritten_to_the_one_autotp_state():
    code = _migrated()
    assert "groups." not in code and "TODOV1" not in code, code
    assert "autotp_groups().tensor_parallel_src_rank()" in code
    assert "init_autotp(tensor_model_parallel_size=n, data_parallel_size=dp)" in code
    assert "from mesh_core.runtime_hooks import autotp_groups, init_autotp" in code
    # engine-scoped modules keep the model's mesh; user scripts keep their own rule
    engine = migrate_code(PROBE, module="deepspeed.runtime.engine", package="deepspeed.runtime").code
    assert "autotp_groups" not in engine
    assert "autotp_groups" not in migrate_code(PROBE).code
    assert migrate_code(code, module=MODULE, package="deepspeed.module_inject").code == code  # idempotent


def _legacy(world, tp, tp2, pp, keyword) -> dict:
    import deepspeed.runtime.pipe.topology as topology
    from deepspeed.utils import groups

    ns = _load(PROBE)
    out = {}
    for rank in _ranks(world):
        with fake_world(rank, world, deepspeed_comm=True):
            for state in _states(ns, groups, topology, world, tp, tp2, pp, keyword):
                out[rank, state] = plain(ns["probe"]())
    return out


@pytest.mark.deepspeed
@pytest.mark.parametrize("world,tp,tp2,pp", CASES)
@pytest.mark.parametrize("built_by", ["migrated code", "legacy code"])
def test_rewritten_autotp_reads_equal_legacy(world, tp, tp2, pp, built_by, monkeypatch):
    import deepspeed  # noqa: F401

    installer = importlib.import_module("compat.install")  # compat.install is also a function attribute

    monkeypatch.setenv("LOCAL_RANK", "0")
    keyword = tp % 2 == 0
    legacy = _legacy(world, tp, tp2, pp, keyword)
    migrated = _load(_migrated())
    unmigrated = _load(PROBE)
    installer.install()
    try:
        import deepspeed.runtime.pipe.topology as routed
        from deepspeed.utils import groups

        builders = migrated if built_by == "migrated code" else unmigrated
        for rank in _ranks(world):
            with fake_world(rank, world, deepspeed_comm=True):
                states = _states(
                    {**migrated, "build": builders["build"], "build_kw": builders["build_kw"]},
                    groups,
                    routed,
                    world,
                    tp,
                    tp2,
                    pp,
                    keyword,
                )
                for state in states:
                    served = unmigrated["probe"]()  # compat's legacy getters
                    with record_new_groups() as created:
                        got = migrated["probe"]()
                    assert created == [], (rank, state, created)
                    assert plain(got) == legacy[rank, state], (rank, state)
                    for name in ("tp_group", "mp_group", "dp_group"):  # the very communicators compat serves
                        assert got[name] is served[name] or got[name] == served[name], (rank, state, name)
    finally:
        installer.uninstall()


@pytest.mark.deepspeed
@pytest.mark.parametrize("world,tp", [(4, 2), (8, 4), (8, 2)])
def test_in_an_autotp_engines_scope_the_rewritten_reads_serve_the_engines_tp_groups(world, tp, monkeypatch):
    """Legacy: the engine's ``_init_tp_mesh_device(autotp_size)``; migrated: the engine's mesh bound by
    the runtime (compat.engine_scope), with the AutoTP code built inside and read inside / after."""
    import deepspeed  # noqa: F401
    import torch.distributed as dist

    installer = importlib.import_module("compat.install")  # compat.install is also a function attribute
    from compat.engine_mesh import EngineMesh
    from compat.engine_scope import GroupsState, groups_state
    from mesh_core import MeshSpec

    monkeypatch.setenv("LOCAL_RANK", "0")
    legacy = {}
    ns = _load(PROBE)
    from deepspeed.utils import groups as legacy_groups

    for rank in _ranks(world):
        with fake_world(rank, world, deepspeed_comm=True):
            legacy_groups.mpu = legacy_groups
            ns["build"](tp)
            legacy[rank] = plain(ns["probe"]())
    migrated, unmigrated = _load(_migrated()), _load(PROBE)
    installer.install()
    try:
        from deepspeed.utils import groups

        for rank in _ranks(world):
            with fake_world(rank, world, deepspeed_comm=True):
                mesh = EngineMesh(MeshSpec.build(dist.get_world_size(), tp=tp), verify=False)
                with groups_state(GroupsState(mesh, groups, None)):
                    migrated["build"](tp)  # the engine's own _init_tp_mesh_device: a no-op on the bound mesh
                    inside = migrated["probe"]()
                    assert plain(inside) == legacy[rank]
                    assert inside["tp_group"] is unmigrated["probe"]()["tp_group"] is mesh.get_group("tp")
                assert plain(migrated["probe"]()) == plain(unmigrated["probe"]())
    finally:
        installer.uninstall()


def test_init_autotp_is_legacy_shaped_and_validates_first(world):
    import torch.distributed as dist

    from mesh_core import MeshSpecError
    from mesh_core.runtime_hooks import autotp_groups, init_autotp

    state = autotp_groups()
    state.reset()
    try:
        with pytest.raises(AssertionError, match="intra_layer_model parallel group is not initialized"):
            state.tensor_parallel_group()
        with record_new_groups() as created:
            with pytest.raises(MeshSpecError):
                init_autotp(3)
            with pytest.raises(MeshSpecError, match="positive int"):
                init_autotp(0)
        assert created == [] and not state.initialized
        dp_group, tp_group = init_autotp(2)
        rank = dist.get_rank()
        assert sorted(dist.get_process_group_ranks(tp_group)) == [rank - rank % 2, rank - rank % 2 + 1]
        assert sorted(dist.get_process_group_ranks(dp_group)) == list(range(rank % 2, dist.get_world_size(), 2))
        assert init_autotp(4) is None and state.tensor_parallel_world_size() == 2  # legacy's early return
        state.tp_world_size_override = 4
        assert state.tensor_parallel_world_size() == 4 and state.tensor_parallel_src_rank() == rank - rank % 4
    finally:
        state.reset()


def test_comment_lines_above_an_import_the_rewrite_leaves_unused_are_kept():
    """DeepSpeed's init_utils.py: a local ``from deepspeed.utils import groups`` under a comment, removed once
    its one use is rewritten; the comment stays above the statement that follows (libcst's removal drops it)."""
    source = (
        "def merge(tp_size, mpu):\n"
        "    if mpu is None:\n"
        "        # Auto-create TP groups for compatibility with HF Trainer (mpu is not passed).\n"
        "        from deepspeed.utils import groups\n"
        "        groups._init_tp_mesh_device(tensor_model_parallel_size=tp_size)\n"
    )
    code = migrate_code(
        source, module="deepspeed.runtime.tensor_parallel.init_utils", package="deepspeed.runtime.tensor_parallel"
    ).code
    assert (
        "        # Auto-create TP groups for compatibility with HF Trainer (mpu is not passed).\n"
        "        init_autotp(tensor_model_parallel_size=tp_size)\n"
    ) in code, code
    assert "import groups" not in code
