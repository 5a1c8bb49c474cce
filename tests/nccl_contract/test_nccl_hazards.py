"""Each way a group creation could hang or crash on GPUs, played through the fake NCCL world
(tests/fakenccl.py); the harness's own ability to catch each hazard is checked first.

Only public API (and the harness) is used, so the file runs against any revision of the project."""

from __future__ import annotations

import threading
import time

import pytest
import torch
import torch.distributed as dist

from fakenccl import ContractViolation, nccl_world, run_ranks

pytestmark = pytest.mark.torch_releases

WORLD = 4


def _mesh(**kwargs):
    from mesh_core import DeepSpeedDeviceMesh

    return DeepSpeedDeviceMesh.build(verify=False, **kwargs)


def _cuda(rank):
    return torch.zeros(1, device=torch.device("cuda", rank))


# --- the harness catches each hazard -------------------------------------------------------------
def test_a_lazy_first_collective_while_another_is_in_flight_is_flagged():
    def scenario(rank):
        group = dist.new_group([0, 1], use_local_synchronization=True) if rank < 2 else None
        work = dist.all_reduce(_cuda(rank), async_op=True)
        if group is not None:
            dist.all_reduce(_cuda(rank), group=group)  # ncclCommInitRank while the world's all_reduce waits
        work.wait()

    with pytest.raises(ContractViolation, match="lazy init of group .* in flight"):
        run_ranks(scenario, WORLD, bound=False)


def test_two_ranks_of_one_communicator_on_one_device_fail():
    def scenario(rank):
        if rank < 2:
            dist.barrier(group=dist.new_group([0, 1], use_local_synchronization=True))  # current device: cuda:0

    with pytest.raises(ContractViolation, match="duplicate GPU"):
        run_ranks(scenario, WORLD, bound=False)


def test_a_bound_group_rejects_a_tensor_off_its_device():
    with nccl_world(1, WORLD):
        group = dist.new_group([0, 1])  # a split of the bound world: bound to cuda:1
        with pytest.raises(RuntimeError, match="bound to cuda:1 with a tensor on cuda:0"):
            dist.all_reduce(_cuda(0), group=group)


def test_destroy_is_a_collective_of_the_members():
    def scenario(rank):
        group = dist.new_group([0, 1])
        if rank == 0:
            dist.destroy_process_group(group)

    with pytest.raises(ContractViolation, match=r"members \[1\] never destroyed it"):
        run_ranks(scenario, WORLD)


def test_the_2_6_counter_diverges_after_a_partial_split():
    """torch 2.6–2.9's split_group counter-names its members only."""

    def scenario(rank):
        dist.split_group(split_ranks=[[2], [3]])

    with pytest.raises(ContractViolation, match="group counter differs"):
        run_ranks(scenario, WORLD, release="2.6")
    run_ranks(scenario, WORLD, release="2.14")  # every rank names a split there


# --- lazy and rank-dependent requests never need a non-member ------------------------------------
def test_a_size_one_dim_asked_for_on_one_rank_only():
    def scenario(rank):
        mesh = _mesh(tp=1, dp=4)
        out = sorted(dist.get_process_group_ranks(mesh.get_group("tp"))) if rank == 0 else None
        mesh.destroy()
        return out

    logs = run_ranks(scenario, WORLD)
    assert logs[0].result == [0]


def test_a_flattened_dim_asked_for_by_one_pipeline_stage_only():
    def scenario(rank):
        mesh = _mesh(pp=2, dp=2, tp=2)
        out = None
        if mesh.get_rank("pp") == 0:
            out = sorted(dist.get_process_group_ranks(mesh.get_group(("dp", "tp"))))
        mesh.destroy()
        return out

    logs = run_ranks(scenario, 8)
    stage0 = [log for log in logs if log.result is not None]
    assert len(stage0) == 4 and all(log.result == stage0[0].result for log in stage0)


# --- threads ------------------------------------------------------------------------------------
def test_a_foreign_new_group_from_another_thread_during_a_member_only_creation():
    """An RL framework's own dist.new_group from a thread while ds-mesh creates a member-only group:
    that thread keeps seeing the bound world, so it splits as the other ranks do."""

    def scenario(rank):
        def foreign():
            time.sleep(0.1)
            dist.new_group([0, 1])  # world-collective: every rank calls it

        thread = threading.Thread(target=foreign)
        thread.start()
        if rank < 2:
            _mesh(ranks=[0, 1], tp=2).destroy()  # takes 0.5 s per creation
        thread.join(30)
        assert not thread.is_alive()

    logs = run_ranks(scenario, WORLD, creation_s=0.5)
    assert [log.world for log in logs] == [[("comm_split", (0, 1))]] * WORLD


def test_member_only_creations_under_the_init_barrier_do_not_serialise():
    """TORCH_DIST_INIT_BARRIER=1: a member-only creation waits for its members; nothing process-wide
    may be held meanwhile (two threads' creations wait side by side)."""

    def scenario(rank):
        pair, column = [rank - rank % 2, rank - rank % 2 + 1], [rank % 2, rank % 2 + 2]
        errors = []

        def build(ranks):
            try:
                _mesh(ranks=ranks, tp=2).destroy()
            except Exception as err:  # noqa: BLE001 (reported below)
                errors.append(repr(err))

        threads = [threading.Thread(target=build, args=(r,)) for r in (pair, column)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        assert not errors, errors

    logs = run_ranks(scenario, WORLD, init_barrier=True, creation_s=0.3)
    assert all(log.max_concurrent_barriers == 2 for log in logs)


# --- no lazy communicator once connected: groups are bound at creation, connected at a connect point
def test_hpz_qgz_p2p_and_sub_world_groups_are_connected_at_their_connect_points():
    """A whole-world build connects its groups (p2p pairs included); a sub-world mesh's groups and
    the legacy-getter groups (hpZ, qgZ) connect at the registry's ``connect()``. Their
    first collectives, issued while a world all_reduce is in flight, then initialise nothing."""
    from mesh_core.registry import registry_for_world
    from mesh_core.roles.hpz import create_hpz_group, release_hpz_groups
    from mesh_core.roles.node_groups import local_all_to_all_groups

    def scenario(rank):
        groups = [create_hpz_group(None, 2)]
        nodes = local_all_to_all_groups(2)
        groups += [
            g for g in nodes.values() if isinstance(g, dist.ProcessGroup) and rank in dist.get_process_group_ranks(g)
        ]
        pipe = _mesh(pp=4, p2p_groups=True)
        groups.append(pipe.p2p_group(pipe.layout.stage_peer(rank, 1)))
        sub = _mesh(ranks=[0, 1], tp=2) if rank < 2 else None
        if sub is not None:
            groups.append(sub.get_group("tp"))
        registry_for_world().connect()
        work = dist.all_reduce(_cuda(rank), async_op=True)
        for group in groups:
            dist.all_reduce(_cuda(rank), group=group)
            dist.barrier(group=group)  # no tensor: the group's own device
        work.wait()
        for mesh in (pipe, sub):
            if mesh is not None:
                mesh.destroy()
        release_hpz_groups()
        nodes.clear()
        return len(groups)

    logs = run_ranks(scenario, WORLD)
    assert all(log.lazy_inits == [] for log in logs)
    assert [log.result for log in logs] == [5, 5, 4, 4]


def test_a_member_only_group_is_bound_to_the_ranks_device():
    def scenario(rank):
        if rank < 2:
            mesh = _mesh(ranks=[0, 1], tp=2)
            group = mesh.get_group("tp")
            out = group.bound_device_id
            dist.barrier(group=group)
            mesh.destroy()
            return out

    logs = run_ranks(scenario, WORLD)
    assert [log.result for log in logs[:2]] == [torch.device("cuda", 0), torch.device("cuda", 1)]


# --- torch's group counter ----------------------------------------------------------------------
@pytest.mark.parametrize("release", ["2.6", "2.10", "2.13", "2.14"])
def test_names_and_the_group_counter_agree_after_every_path(release):
    """A sub-world mesh on some ranks, a one-rank mesh on another, then whole-world splits (whose
    members have made different numbers of groups before: torch 2.10–2.13 salt their hashed names
    with that number) and p2p pairs; then a plain counter-named world-collective new_group. Every
    rank set's groups must have the same names on all its members, and the counter must agree."""

    def scenario(rank):
        meshes = [_mesh(ranks=[0, 1], tp=2)] if rank < 2 else [_mesh(ranks=[3], tp=1)] if rank == 3 else []
        meshes += [_mesh(tp=2, dp=2), _mesh(pp=2, tp=2, p2p_groups=True)]
        name = dist.new_group([0, 1, 2, 3]).group_name
        for mesh in reversed(meshes):
            mesh.destroy()
        return name

    logs = run_ranks(scenario, WORLD, release=release)
    assert len({log.result for log in logs}) == 1


def test_a_registry_split_of_known_and_new_sets_keeps_the_2_6_counter():
    from mesh_core.registry import registry_for_world

    def scenario(rank):
        registry = registry_for_world()
        _, first = registry.split([[0, 1], [2, 3]])
        _, second = registry.split([[0, 1], [2], [3]])  # (0, 1) known: only [2] and [3] are split
        registry.release(first + second)
        return dist.new_group([0, 1, 2, 3]).group_name  # counter-named on 2.6

    logs = run_ranks(scenario, WORLD, release="2.6")
    assert len({log.result for log in logs}) == 1


# --- TorchComms, nccl2, nccl-lazy ---------------------------------------------------------------
def test_torchcomms_before_2_14_is_refused_with_the_setting_named():

    with nccl_world(0, WORLD, release="2.13", torchcomms=True):
        with pytest.raises(RuntimeError, match="TORCH_DISTRIBUTED_USE_TORCHCOMMS"):
            _mesh(ranks=[0, 1], tp=2)


def test_compat_install_refuses_torchcomms_before_2_14():
    import compat
    from compat.install import is_installed

    with nccl_world(0, WORLD, release="2.13", torchcomms=True):
        with pytest.raises(RuntimeError, match="TORCH_DISTRIBUTED_USE_TORCHCOMMS"):
            compat.install()
        assert not is_installed()


def test_torchcomms_on_2_14_creates_member_only_groups_on_the_ranks_device():
    def scenario(rank):
        if rank < 2:
            mesh = _mesh(ranks=[0, 1], tp=2)
            dist.all_reduce(_cuda(rank), group=mesh.get_group("tp"))
            mesh.destroy()

    logs = run_ranks(scenario, WORLD, release="2.14", torchcomms=True)
    assert all(log.world == [] and log.lazy_inits == [] for log in logs)


@pytest.mark.parametrize("engine", ["nccl2", "nccl-lazy"])
def test_the_nccl2_and_nccl_lazy_backends_are_refused(engine):
    """Recognised by the world's backend object (tests/nccl_contract/test_nccl2.py: every path)."""
    with nccl_world(0, WORLD, engine=engine):
        with pytest.raises(RuntimeError, match=engine):
            _mesh(tp=2, dp=2)


def test_torch_dist_use_nccl2_is_refused_on_2_14(monkeypatch):

    monkeypatch.setenv("TORCH_DIST_USE_NCCL2", "1")  # read when torch registers its backends, before the world
    with nccl_world(0, WORLD, release="2.14", engine="auto"):
        with pytest.raises(RuntimeError, match="TORCH_DIST_USE_NCCL2"):
            _mesh(tp=2, dp=2)


def test_the_bound_device_is_hidden_from_the_creating_thread_only():
    """While a member-only creation runs, another thread reads the world's bound device as torch
    would; afterwards torch's own property is back on ProcessGroup."""
    from mesh_core import torch_compat

    original = vars(dist.ProcessGroup)["bound_device_id"]
    seen = {}
    with nccl_world(2, WORLD):
        world = dist.distributed_c10d._get_default_group()
        with torch_compat.unbound_default_group() as bound:
            seen["mine"] = world.bound_device_id
            reader = threading.Thread(target=lambda: seen.setdefault("other", world.bound_device_id))
            reader.start()
            reader.join(10)
        seen["after"] = world.bound_device_id
    assert (bound, seen) == (
        torch.device("cuda", 2),
        {"mine": None, "other": torch.device("cuda", 2), "after": torch.device("cuda", 2)},
    )
    assert vars(dist.ProcessGroup)["bound_device_id"] is original
