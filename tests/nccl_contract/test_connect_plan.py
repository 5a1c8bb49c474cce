"""The connect plan (docs/nccl.md): creating a member-only group never waits for its members, a
group is connected at a connect point (a whole-world build, ``mesh.registry.connect()``, a
resume) or by its first collective, so no order of requests makes a cycle of waits
and no init runs while this rank has NCCL work in flight. Played through the fake NCCL world,
whose wait-for replay (``fakenccl.check_waits``) finds cycles across ranks."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from fakenccl import ContractViolation, RankLog, check_waits, run_ranks

pytestmark = pytest.mark.torch_releases


def _mesh(**kwargs):
    from mesh_core import DeepSpeedDeviceMesh

    return DeepSpeedDeviceMesh.build(verify=False, **kwargs)


def _cuda(rank):
    return torch.zeros(1, device=torch.device("cuda", rank))


# --- the harness: a cycle of waits across ranks ----------------------------------------------------
def test_the_wait_replay_finds_a_ring_cycle_that_pairwise_orders_miss():
    logs = [RankLog(r) for r in range(3)]
    for r, log in enumerate(logs):
        nxt, prv = tuple(sorted((r, (r + 1) % 3))), tuple(sorted(((r - 1) % 3, r)))
        log.waits = [("connect", f"g{nxt}", nxt), ("connect", f"g{prv}", prv)]
    with pytest.raises(ContractViolation, match="a cycle of waits across ranks.*rank 0 waits in the connect"):
        check_waits(logs)
    for log in logs:  # the same steps in one global order: no cycle
        log.waits.sort(key=lambda w: w[2])
    check_waits(logs)


def test_the_wait_replay_names_members_that_never_reach_a_step():
    logs = [RankLog(r) for r in range(3)]
    logs[0].waits = logs[1].waits = [("connect", "g", (0, 1, 2))]
    with pytest.raises(ContractViolation, match=r"members \[2\] never reach"):
        check_waits(logs)


def test_an_init_at_creation_while_work_is_in_flight_is_flagged():
    def scenario(rank):
        work = dist.all_reduce(_cuda(rank), async_op=True)
        if rank < 2:
            from mesh_core.torch_compat import unbound_default_group

            with unbound_default_group() as device:  # a member-only group connected at its creation
                dist.new_group([0, 1], use_local_synchronization=True, device_id=device)
        work.wait()

    with pytest.raises(ContractViolation, match="init of group .* at its connect while collectives on .* in flight"):
        run_ranks(scenario, 4)


# --- ring-ordered pair meshes ------------------------------------------------------------------------
@pytest.mark.parametrize("world", [3, 4])
def test_ring_ordered_pair_meshes_build_and_destroy_without_a_cycle(world):
    """Rank r builds a mesh with its next ring neighbour, then with its previous one, and destroys
    them in that order: each rank set is asked for in the same order by its members, yet with
    creations (or destroys) that wait for the members the ranks wait on each other in a ring."""

    def scenario(rank):
        meshes = [
            _mesh(ranks=sorted({rank, (rank + 1) % world}), tp=2),
            _mesh(ranks=sorted({(rank - 1) % world, rank}), tp=2),
        ]
        groups = [m.get_group("tp") for m in meshes]
        bound = [g.bound_device_id for g in groups]
        for mesh in meshes:
            mesh.destroy()
        return bound

    logs = run_ranks(scenario, world)
    assert all(log.result == [torch.device("cuda", log.rank)] * 2 for log in logs)
    assert all(log.waits == [] for log in logs)  # neither the creations nor the destroys waited


@pytest.mark.parametrize("world", [3, 4])
def test_ring_ordered_pair_meshes_connected_together_then_used(world):
    """Connected at one connect point (ascending rank sets on every rank), the ring's groups then
    run their collectives and are destroyed in one global order: the replay finds no cycle."""
    from mesh_core.registry import registry_for_world

    def scenario(rank):
        meshes = [
            _mesh(ranks=sorted({rank, (rank + 1) % world}), tp=2),
            _mesh(ranks=sorted({(rank - 1) % world, rank}), tp=2),
        ]
        connected = registry_for_world().connect()
        work = dist.all_reduce(_cuda(rank), async_op=True)
        work.wait()
        for mesh in sorted(meshes, key=lambda m: list(m.spec.ranks)):
            dist.all_reduce(_cuda(rank), group=mesh.get_group("tp"))
        for mesh in sorted(meshes, key=lambda m: list(m.spec.ranks)):
            mesh.destroy()
        return connected

    logs = run_ranks(scenario, world)
    assert [log.result for log in logs] == [2] * world
    assert all(log.lazy_inits == [] for log in logs)


# --- a handle fetched while NCCL work is in flight --------------------------------------------------
def test_a_handle_fetched_while_an_async_collective_is_in_flight_connects_nothing():
    """``work = all_reduce(async)``; ``mesh.get_group(("dp", "tp"))`` (a new combination, created
    now); ``work.wait()``; then the group's first collective. Fetching the handle makes no
    communicator (no ncclCommInitRank while the world's kernel waits on peers)."""

    def scenario(rank):
        mesh = _mesh(pp=2, dp=2, tp=2)
        work = dist.all_reduce(_cuda(rank), async_op=True)
        group = mesh.get_group(("dp", "tp"))
        work.wait()
        dist.all_reduce(_cuda(rank), group=group)
        mesh.destroy()
        return group.bound_device_id

    logs = run_ranks(scenario, 8)
    assert [log.result for log in logs] == [torch.device("cuda", r) for r in range(8)]


def test_a_group_connected_at_the_registrys_connect_inits_nothing_at_its_first_collective():
    """A group asked for lazily and connected by ``mesh.registry.connect()`` before any work is issued: its
    later collectives, while another is in flight, make no communicator."""

    def scenario(rank):
        mesh = _mesh(ranks=[0, 1, 2, 3], pp=2, tp=2) if rank < 4 else None
        if mesh is None:
            return 0
        group = mesh.get_group(("pp", "tp"))
        count = mesh.registry.connect()
        work = dist.all_reduce(_cuda(rank), async_op=True)
        dist.barrier(group=group)
        work.wait()
        return count

    logs = run_ranks(scenario, 8)
    assert [log.result for log in logs[:4]] == [3] * 4  # pp, tp and pp x tp
    assert all(log.lazy_inits == [] for log in logs)


# --- a group asked for by some of its members only -------------------------------------------------
def test_a_group_asked_for_by_some_members_only_waits_for_nothing_until_connected():
    """Creation waits for nobody; the connect of a group some members never asked for is what the
    replay reports (the product's own error, with the missing ranks named, is checked on a real
    gloo world: tests/nccl_contract/test_connect_gloo.py)."""
    from mesh_core.registry import registry_for_world

    def scenario(rank):
        if rank < 2:
            registry_for_world().get([0, 1, 2])
            registry_for_world().connect()

    with pytest.raises(ContractViolation, match=r"\[0, 1, 2\].* members \[2\] never"):
        run_ranks(scenario, 4)


# --- a whole-world split racing another thread's member-only creation of one of its rank sets -------
@pytest.mark.parametrize("first_on_rank_0", ["sub-world thread", "whole-world build"])
def test_a_split_and_a_member_only_creation_of_one_rank_set_agree_whichever_thread_comes_first(first_on_rank_0):
    """Main thread ``build(dp=2, tp=2)`` (a split of the bound world), another thread
    ``build(ranks=[0, 1], tp=2)`` on every rank; which reaches [0, 1] first differs between ranks
    0 and 1 (played in both orders). Every rank set's groups must have the same names on all its
    members (else their rendezvous hang on GPUs)."""
    import threading

    def scenario(rank):
        out = {}

        def sub():
            if rank < 2:
                out["sub"] = _mesh(ranks=[0, 1], tp=2)

        def whole():
            out["whole"] = _mesh(dp=2, tp=2)

        sub_first = (rank == 0) == (first_on_rank_0 == "sub-world thread")
        thread = threading.Thread(target=sub)
        if sub_first:
            thread.start()
            thread.join()
            whole()
        else:
            whole()
            thread.start()
            thread.join()
        groups = [out["whole"].get_group("tp")] + ([out["sub"].get_group("tp")] if "sub" in out else [])
        for group in groups:
            dist.all_reduce(_cuda(rank), group=group)
        for name in ("whole", "sub"):  # one order on every rank (destroying made communicators waits)
            if name in out:
                out[name].destroy()
        return [g.group_name for g in groups]

    logs = run_ranks(scenario, 4)
    assert logs[0].result == logs[1].result  # [0, 1]'s split child and member-only group, named alike
    assert logs[0].result[0] != logs[0].result[1]
