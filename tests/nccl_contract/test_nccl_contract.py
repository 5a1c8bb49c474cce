"""The project on NCCL's contracts, on CPU (tests/fakenccl.py): torch's real return types on an NCCL
world, a bound default group, creations that need every world rank when the world is bound.

Only public API is used here, so the same file runs against any revision of the project."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from fakenccl import ContractViolation, nccl_world, run_ranks

pytestmark = pytest.mark.torch_releases

WORLD = 4


def _mesh(**kwargs):
    from mesh_core import DeepSpeedDeviceMesh

    return DeepSpeedDeviceMesh.build(verify=False, **kwargs)


# --- the harness itself can fail ----------------------------------------------------------------
def test_a_member_only_new_group_on_a_bound_world_fails_the_contract():
    """torch's own member-only creation on a bound world: non-members skip the world split."""

    def scenario(rank):
        return dist.new_group([0, 1], use_local_synchronization=True)

    with pytest.raises(ContractViolation, match="every world rank must join each ncclCommSplit"):
        run_ranks(scenario, WORLD)


def test_a_world_collective_new_group_on_a_bound_world_meets_it():
    logs = run_ranks(lambda rank: dist.new_group([0, 1]), WORLD)
    assert [log.world for log in logs] == [[("comm_split", (0, 1))]] * WORLD


def test_members_creating_in_different_orders_fail_on_an_unbound_world():
    def scenario(rank):
        sets = [[0, 1], [0, 1, 2, 3][: 2 + (rank > 1) * 2]]
        for ranks in sets if rank else reversed(sets):
            if rank in ranks:
                dist.new_group(ranks, use_local_synchronization=True)

    with pytest.raises(ContractViolation):
        run_ranks(scenario, WORLD, bound=False)


# --- the project ---------------------------------------------------------------------------------
def test_a_sub_world_mesh_on_a_bound_world_needs_no_non_member():
    """A sub-world mesh (sub-world engines, the RL actor/rollout split) is built by its members only."""

    def scenario(rank):
        if rank not in (0, 1):
            return None
        mesh = _mesh(ranks=[0, 1], tp=2)
        group = mesh.get_group("tp")
        out = (mesh.device_type, sorted(dist.get_process_group_ranks(group)))
        mesh.destroy()
        return out

    logs = run_ranks(scenario, WORLD)
    assert [log.result for log in logs[:2]] == [("cuda", [0, 1])] * 2
    assert all(log.world == [] for log in logs)  # no world collective at all
    assert [log.members for log in logs[:2]] == [logs[0].members] * 2 and logs[0].members


def test_one_rank_groups_and_p2p_pairs_of_a_whole_world_pipeline_on_a_bound_world():
    def scenario(rank):
        mesh = _mesh(pp=4, p2p_groups=True)
        out = (
            mesh.device_type,
            mesh.get_group_ranks("pp"),
            sorted(dist.get_process_group_ranks(mesh.p2p_group((rank + 1) % 4))),
        )
        mesh.destroy()
        return out

    logs = run_ranks(scenario, WORLD)
    assert [log.result[0] for log in logs] == ["cuda"] * WORLD
    assert logs[1].result[2] == [1, 2]


def test_a_whole_world_mesh_on_a_bound_world_splits_on_every_rank():
    def scenario(rank):
        mesh = _mesh(tp=2, dp=2)
        out = {d: sorted(dist.get_process_group_ranks(mesh.get_group(d))) for d in ("tp", "dp")}
        mesh.destroy()
        return out

    logs = run_ranks(scenario, WORLD)
    assert logs[0].result == {"tp": [0, 1], "dp": [0, 2]} and logs[3].result == {"tp": [2, 3], "dp": [1, 3]}
    assert [entry[0] for entry in logs[0].world] == ["split_group", "split_group"]


def test_the_bound_device_is_back_after_a_member_only_creation():
    seen = []

    def scenario(rank):
        if rank in (0, 1):
            _mesh(ranks=[0, 1], tp=2).destroy()
        seen.append(dist.distributed_c10d._get_default_group().bound_device_id)

    run_ranks(scenario, WORLD)
    assert seen == [torch.device("cuda", r) for r in range(WORLD)]


def test_from_groups_infers_cuda_and_agrees_on_the_bound_device():
    """from_groups / from_mpu without device_type on NCCL (the crash), and the agreement all_reduce
    on the bound device (cuda:LOCAL_RANK), not the current one (cuda:0)."""
    from mesh_core import DeepSpeedDeviceMesh

    with nccl_world(3, WORLD) as log:
        rows = [dist.new_group(r) for r in ([0, 1], [2, 3])]
        columns = [dist.new_group(r) for r in ([0, 2], [1, 3])]
        mesh = DeepSpeedDeviceMesh.from_groups(tp=rows[1], dp=columns[1])
        assert (mesh.device_type, mesh.device_mesh.device_type) == ("cuda", "cuda")
        assert mesh.get_group_ranks("tp") == [2, 3]
    assert log.allocations and set(log.allocations) == {torch.device("cuda", 3)}


def test_init_autotp_on_an_nccl_world_builds_a_cuda_mesh():
    from mesh_core.runtime_hooks import autotp_groups, init_autotp

    with nccl_world(1, WORLD):
        try:
            dp, tp = init_autotp(2)
            mesh = autotp_groups().tp_source[0]
            assert mesh.device_type == "cuda"
            assert sorted(dist.get_process_group_ranks(tp)) == [0, 1]
        finally:
            autotp_groups().reset()


def test_unbound_nccl_world_still_builds_cuda_meshes():
    def scenario(rank):
        mesh = _mesh(tp=2, dp=2)
        out = mesh.device_type
        mesh.destroy()
        return out

    logs = run_ranks(scenario, WORLD, bound=False)
    assert [log.result for log in logs] == ["cuda"] * WORLD
    assert all(log.world == [] for log in logs)


def test_deepspeed_initialize_under_the_shim_resolves_its_device_on_an_nccl_world(monkeypatch):
    """Every NCCL run of deepspeed.initialize under the shim used to crash reading the device; every
    rank of the bound world makes the same world splits."""
    import deepspeed

    import compat

    config = {
        "train_micro_batch_size_per_gpu": 1,
        "steps_per_print": 10**6,
        "mesh": {"tp": 2},
        "tensor_parallel": {"autotp_size": 1},
        "optimizer": {"type": "Adam", "params": {"torch_adam": True}},
    }

    def scenario(rank):
        monkeypatch.setenv("LOCAL_RANK", str(rank))
        monkeypatch.setenv("RANK", str(rank))
        compat.install()
        try:
            engine = deepspeed.initialize(model=torch.nn.Linear(4, 4), config=config)[0]
            out = (
                engine.mesh_device.device_type,
                engine.mesh_device.device_mesh.device_type,
                engine.mesh_device.get_group_ranks("tp"),
            )
            engine.destroy()
            return out
        finally:
            compat.uninstall()

    monkeypatch.setenv("WORLD_SIZE", str(WORLD))
    logs = run_ranks(scenario, WORLD, deepspeed_comm=True)
    assert [log.result for log in logs] == [
        ("cuda", "cuda", [0, 1]),
        ("cuda", "cuda", [0, 1]),
        ("cuda", "cuda", [2, 3]),
        ("cuda", "cuda", [2, 3]),
    ]
    assert logs[0].world == [("split_group", ((0, 2), (1, 3))), ("split_group", ((0, 1), (2, 3)))]
    assert all(log.collectives and not log.lazy_inits for log in logs)  # every group connected at creation


def test_threads_building_sub_world_meshes_on_a_bound_world_need_no_non_member():
    """Meshes built from threads on a bound world: the bound device is hidden from the creating thread
    only, so the two threads' member-only creations run side by side and neither splits the world."""
    import threading

    def scenario(rank):
        pair = [rank - rank % 2, rank - rank % 2 + 1]
        column = [rank % 2, rank % 2 + 2]
        got, errors = {}, []

        def build(name, ranks):
            try:
                for _ in range(3):
                    mesh = _mesh(ranks=ranks, tp=2)
                    got.setdefault(name, []).append(mesh.get_group_ranks("tp"))
                    mesh.destroy()
            except Exception as err:  # noqa: BLE001 (reported below)
                errors.append(repr(err))

        threads = [threading.Thread(target=build, args=a) for a in (("pair", pair), ("column", column))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert not errors and not any(t.is_alive() for t in threads), errors
        return got, dist.distributed_c10d._get_default_group().bound_device_id

    logs = run_ranks(scenario, WORLD, creation_s=0.02)
    for log in logs:
        got, bound = log.result
        assert got == {
            "pair": [[log.rank - log.rank % 2, log.rank - log.rank % 2 + 1]] * 3,
            "column": [[log.rank % 2, log.rank % 2 + 2]] * 3,
        }
        assert bound == torch.device("cuda", log.rank)
        assert log.world == [] and not log.lazy_inits


def test_migrated_topology_code_builds_a_mesh_on_the_worlds_device():
    """The topology codemod's output names no device: run on an NCCL world, its mesh is a cuda mesh."""
    from codemods import migrate_code

    source = (
        "from deepspeed.runtime.pipe.topology import PipeModelDataParallelTopology, PipelineParallelGrid\n"
        "grid = PipelineParallelGrid(topology=PipeModelDataParallelTopology(1, 2, 2))\n"
        "x = grid.get_data_parallel_group()\n"
    )
    code = migrate_code(source).code
    assert "device_type" not in code and "grid = DeepSpeedDeviceMesh.build(" in code

    def scenario(rank):
        namespace: dict = {}
        exec(compile(code, "<migrated>", "exec"), namespace)
        mesh = namespace["grid"]
        out = (mesh.device_type, sorted(dist.get_process_group_ranks(namespace["x"])))
        mesh.destroy()
        return out

    logs = run_ranks(scenario, WORLD)
    assert [log.result[0] for log in logs] == ["cuda"] * WORLD
