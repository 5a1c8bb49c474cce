"""mesh_core.transfer on 4 gloo processes: every bad input of an RL user ends with the right values
or the same MeshSpecError on every rank, before any message and within seconds; and a hypothesis
run over layouts and dtypes delivers bit for bit (or refuses alike).

One spawned world runs every case in turn (an error found before any message leaves the world
usable for the next case); each rank records what it saw, the tests below compare.
"""

from __future__ import annotations

import json
import os
import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from spawn import run_ranks

pytestmark = pytest.mark.multiprocess
WORLD = 4
ACTOR, ROLLOUT = [0, 1], [2, 3]
FULL_SHAPES = {"a.up": (8, 4), "b.down": (4, 8), "c.bias": (4,), "z.last": (6,)}


def _actor_layouts(dtype=None, **changes):
    from mesh_core.transfer import ParamLayout

    layouts = {
        "a.up": ParamLayout((8, 4), shard_dim=0, dtype=dtype),
        "b.down": ParamLayout((4, 8), shard_dim=1, dtype=dtype),
        "c.bias": ParamLayout((4,), dtype=dtype),
        "z.last": ParamLayout((6,), dtype=dtype),
    }
    layouts.update(changes)
    return layouts


def _full(dtype=torch.float32):
    gen = torch.Generator().manual_seed(0)
    return {n: (torch.randn(s, generator=gen) * 3).to(dtype) for n, s in FULL_SHAPES.items()}


def _actor_shards(rank, full):
    i = ACTOR.index(rank)
    return {
        "a.up": full["a.up"][4 * i : 4 * i + 4].clone(),
        "b.down": full["b.down"][:, 4 * i : 4 * i + 4].clone(),
        "c.bias": full["c.bias"].clone(),
        "z.last": full["z.last"].clone(),
    }


def _case(
    rank,
    *,
    src_dtype=torch.float32,
    dst_dtype=torch.float32,
    edit_src=None,
    edit_dst=None,
    src_layouts=None,
    dst_layouts=None,
    actor=None,
    rollout=None,
    timeout=timedelta(seconds=20),
):
    """One actor tp=2 (ranks 0-1) -> rollout dp=2 (ranks 2-3) transfer; what this rank saw."""
    from mesh_core import MeshSpec
    from mesh_core.transfer import ParamLayout, transfer

    actor = actor or MeshSpec.build(WORLD, tp=2, ranks=ACTOR)
    rollout = rollout or MeshSpec.build(WORLD, dp=2, ranks=ROLLOUT)
    full = _full(src_dtype)
    src = _actor_shards(rank, full) if rank in ACTOR else None
    dst = {n: torch.zeros(s, dtype=dst_dtype) for n, s in FULL_SHAPES.items()} if rank in ROLLOUT else None
    if edit_src and rank in ACTOR:
        src = edit_src(rank, src)
    if edit_dst and rank in ROLLOUT:
        dst = edit_dst(rank, dst)
    src_layouts = src_layouts(rank) if callable(src_layouts) else (src_layouts or _actor_layouts())  # None: not given
    dst_layouts = (
        dst_layouts(rank)
        if callable(dst_layouts)
        else (dst_layouts or {n: ParamLayout(s) for n, s in FULL_SHAPES.items()})
    )
    start = time.monotonic()
    try:
        stats = transfer(actor, rollout, src, dst, src_layouts, dst_layouts, timeout=timeout)
    except Exception as err:  # noqa: BLE001 - the test compares the error on every rank
        return {"error": f"{type(err).__name__}: {err}", "seconds": time.monotonic() - start}
    out = {"error": None, "seconds": time.monotonic() - start, "messages": stats.messages}
    if dst is not None:
        expected = {n: t.to(dst_dtype) for n, t in full.items()}
        out["exact"] = all(torch.equal(dst[n], expected[n]) for n in FULL_SHAPES)
    return out


def _drop(name):
    return lambda rank, tensors: {n: t for n, t in tensors.items() if n != name}


def _on(only, edit):
    return lambda rank, tensors: edit(rank, tensors) if rank == only else tensors


def _reshape(name, shape):
    def edit(rank, tensors):
        return {**tensors, name: torch.zeros(shape, dtype=tensors[name].dtype)}

    return edit


CASES = {
    "fp32_to_fp32": dict(),
    "bf16_to_fp16": dict(src_dtype=torch.bfloat16, dst_dtype=torch.float16),
    "fp32_to_fp64": dict(dst_dtype=torch.float64),
    "fp32_to_fp16": dict(dst_dtype=torch.float16),
    "fp32_to_int32": dict(dst_dtype=torch.int32),
    "wrong_shape_sender": dict(edit_src=_on(1, _reshape("b.down", (4, 3)))),
    "wrong_shape_receiver": dict(edit_dst=_on(3, _reshape("a.up", (4, 4)))),
    "none_for_tensors": dict(edit_dst=lambda rank, t: None if rank == 2 else t),
    "none_for_one_tensor": dict(edit_src=_on(0, lambda rank, t: {**t, "c.bias": None})),
    "missing_later_parameter": dict(edit_src=_on(0, _drop("z.last"))),
    "no_layouts_on_a_member": dict(src_layouts=lambda rank: None if rank == 1 else _actor_layouts()),
    "layouts_only_on_members": dict(src_layouts=lambda rank: None if rank in ROLLOUT else _actor_layouts()),
    "different_layouts": dict(
        src_layouts=lambda rank: _actor_layouts(
            **(
                {"b.down": __import__("mesh_core.transfer", fromlist=["x"]).ParamLayout((4, 8), shard_dim=0)}
                if rank == 3
                else {}
            )
        )
    ),
    "different_meshes": dict(rollout=None),  # filled in the worker: rank 3 names another order
    "meta_tensor_on_one_rank": dict(edit_src=_on(1, lambda rank, t: {**t, "c.bias": t["c.bias"].to("meta")})),
    # the cases below make the world or the tensors look like a GPU world's (see _DEVICE_CASES)
    "nccl_only_world_cpu_tensors": dict(),
    "cpu_side_facing_gpu_side": dict(),
    "every_rank_on_cuda_0": dict(),
    "tensor_not_on_the_bound_device": dict(),
    "lazy_world_subset_first_transfer": dict(),
    "after_errors_still_right": dict(),
}


def _world(rank, *, types=("cuda",), backend="nccl", own=None, bound=True, lazy=False, size=WORLD):
    from mesh_core.transfer._devices import WorldDevices

    return WorldDevices(backend, types, f"cuda:{rank}" if own is None else own, bound, lazy, "host-a", size)


# case -> rank -> (the world this rank reports, the device its tensors report; None: the real one)
_DEVICE_CASES = {
    "nccl_only_world_cpu_tensors": lambda rank: (_world(rank), None),
    "cpu_side_facing_gpu_side": lambda rank: (
        _world(rank, types=("cpu", "cuda"), backend="cpu:gloo,cuda:nccl"),
        f"cuda:{rank}" if rank in ROLLOUT else None,
    ),
    "every_rank_on_cuda_0": lambda rank: (_world(rank, own="cuda:0", bound=False), "cuda:0"),
    "tensor_not_on_the_bound_device": lambda rank: (_world(rank), "cuda:0"),
    "lazy_world_subset_first_transfer": lambda rank: (_world(rank, bound=False, lazy=True, size=8), f"cuda:{rank}"),
}


def _device_case(rank, name):
    """Run case ``name`` with this rank's world and tensor devices replaced as _DEVICE_CASES says."""
    from unittest import mock

    world, device = _DEVICE_CASES[name](rank)
    with (
        mock.patch("mesh_core.transfer._in_job.world_devices", return_value=world),
        mock.patch(
            "mesh_core.transfer._in_job.tensor_device",
            side_effect=(lambda t: t.device) if device is None else (lambda t: torch.device(device)),
        ),
    ):
        return _case(rank)


def _worker(rank: int, init_file: str, out_dir: str) -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    from mesh_core import MeshSpec

    batches = []  # every batch of messages this rank posts
    real_batch = dist.batch_isend_irecv
    dist.batch_isend_irecv = lambda ops: (batches.append(len(ops)), real_batch(ops))[1]
    results = {}
    for name, kwargs in CASES.items():
        if name == "different_meshes":
            kwargs = dict(rollout=MeshSpec.build(WORLD, dp=2, ranks=[3, 2] if rank == 3 else ROLLOUT))
        before = len(batches)
        results[name] = _device_case(rank, name) if name in _DEVICE_CASES else _case(rank, **kwargs)
        results[name]["batches"] = len(batches) - before
    results["hypothesis"] = _hypothesis(rank)
    # last (it leaves this rank set's agreement out of step): rank 3 believes the rollout is rank 2
    # alone, so it takes no part; the others end their wait for it with an error
    results["a_rank_not_calling"] = _case(
        rank, rollout=MeshSpec.build(WORLD, dp=1, ranks=[2]) if rank == 3 else None, timeout=timedelta(seconds=3)
    )
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as fh:
        json.dump(results, fh)
    dist.barrier()
    dist.destroy_process_group()


DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int32]


def _hypothesis(rank: int) -> dict:
    """Every rank draws the same examples (derandomized, no shrinking) and runs each in lockstep."""
    from hypothesis import Phase, given, settings
    from hypothesis import strategies as st

    from mesh_core import MeshSpec, MeshSpecError
    from mesh_core.transfer import ParamLayout, transfer
    from mesh_core.transfer._agree import conversion_refused
    from mesh_core.transfer._in_job import _holders

    seen = {"examples": 0, "exact": 0, "refused": 0, "failures": []}

    @st.composite
    def mesh(draw):
        n = draw(st.sampled_from([1, 2, 4]))
        ranks = draw(st.permutations(range(WORLD)))[:n]
        tp = draw(st.sampled_from([d for d in (1, 2, 4) if n % d == 0]))
        pp = draw(st.sampled_from([d for d in (1, 2) if (n // tp) % d == 0]))
        order = draw(st.sampled_from([("pp", "dp", "tp"), ("tp", "dp", "pp")]))
        return MeshSpec.build(WORLD, ranks=ranks, tp=tp, pp=pp, order=order)

    def layout(spec, shape, shard, stage, dtype=None):
        stage = None if spec.dim_size("pp") == 1 or stage is None else stage % spec.dim_size("pp")
        return ParamLayout(shape, shard_dim=shard, stage=stage, dtype=dtype)

    @settings(max_examples=12, derandomize=True, database=None, deadline=None, phases=[Phase.generate])
    @given(
        src=mesh(),
        dst=mesh(),
        shards=st.tuples(st.sampled_from([None, 0, 1]), st.sampled_from([None, 0, 1])),
        stages=st.tuples(st.none() | st.integers(0, 1), st.none() | st.integers(0, 1)),
        dtypes=st.tuples(st.sampled_from(DTYPES), st.sampled_from(DTYPES)),
        bucket=st.sampled_from([16, 40, 1 << 20]),
    )
    def example(src, dst, shards, stages, dtypes, bucket):
        seen["examples"] += 1
        shapes = {"w": (8, 4), "v": (4,)}
        src_l = {"w": layout(src, shapes["w"], shards[0], stages[0]), "v": layout(src, shapes["v"], None, stages[0])}
        dst_l = {"w": layout(dst, shapes["w"], shards[1], stages[1]), "v": layout(dst, shapes["v"], None, stages[1])}
        gen = torch.Generator().manual_seed(seen["examples"])
        full = {n: (torch.randn(s, generator=gen) * 8).to(dtypes[0]) for n, s in shapes.items()}
        mine = {}
        src_t = (
            {
                n: full[n][tuple(slice(*b) for b in box)].clone()
                for n in full
                for r, box in _holders(src, src_l[n], n, "s")
                if r == rank
            }
            if rank in src.ranks
            else None
        )
        dst_t = (
            {
                n: torch.zeros([hi - lo for lo, hi in box], dtype=dtypes[1])
                for n in full
                for r, box in _holders(dst, dst_l[n], n, "d")
                if r == rank
            }
            if rank in dst.ranks
            else None
        )
        for n in full:
            mine.update({n: box for r, box in _holders(dst, dst_l[n], n, "d") if r == rank})
        refused = conversion_refused(dtypes[0], dtypes[1]) is not None
        try:
            transfer(src, dst, src_t, dst_t, src_l, dst_l, bucket_bytes=bucket, timeout=timedelta(seconds=20))
        except MeshSpecError as err:
            if refused and "refused" in str(err):
                seen["refused"] += 1
            elif rank in set(src.ranks) | set(dst.ranks):
                seen["failures"].append(f"{src.describe()} -> {dst.describe()} {dtypes}: {err}")
            return
        if refused and rank in set(src.ranks) | set(dst.ranks):
            seen["failures"].append(f"{dtypes} was not refused")
        for n, box in mine.items():
            if not torch.equal(dst_t[n], full[n][tuple(slice(*b) for b in box)].to(dtypes[1])):
                seen["failures"].append(
                    f"{src.describe()} -> {dst.describe()} {n} {dtypes} bucket {bucket}: wrong values"
                )
        seen["exact"] += 1

    example()
    return seen


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    out = tmp_path_factory.mktemp("transfer_gloo")
    run_ranks(
        _worker,
        (str(out / "store"), str(out)),
        world=WORLD,
        timeout_s=300,
        hang="a transfer case waits for a peer instead of raising",
    )
    return [json.load(open(out / f"rank{r}.json")) for r in range(WORLD)]


@pytest.mark.parametrize(
    "case",
    [
        "fp32_to_fp32",
        "bf16_to_fp16",
        "fp32_to_fp64",
        "fp32_to_fp16",
        "layouts_only_on_members",
        "after_errors_still_right",
    ],
)
def test_values_arrive_converted_like_copy(results, case):
    for rank, res in enumerate(results):
        assert res[case]["error"] is None, f"rank {rank}: {res[case]['error']}"
        if rank in ROLLOUT:
            assert res[case]["exact"], f"rank {rank}: {case} delivered wrong values"


REFUSED = {
    "fp32_to_int32": [
        r"refused before any message was sent",
        r"'a.up': sent as float32 by rank 0, received into int32 on rank 2",
    ],
    "wrong_shape_sender": [r"rank 1: source tensor 'b.down' has shape \(4, 3\); its layout \(4, 8\) needs \(4, 4\)"],
    "wrong_shape_receiver": [
        r"rank 3: destination tensor 'a.up' has shape \(4, 4\); its layout \(8, 4\) needs \(8, 4\)"
    ],
    "none_for_tensors": [r"rank 2: rank 2 is in the destination mesh .* was given None for its destination tensors"],
    "none_for_one_tensor": [r"rank 0: source tensor 'c.bias' is None, not a tensor"],
    "missing_later_parameter": [r"rank 0: source tensor 'z.last' is missing"],
    "no_layouts_on_a_member": [r"rank 1: rank 1 is in the source mesh .* was given None for its source layouts"],
    "different_layouts": [
        r"ranks disagree on the transfer",
        r"source parameter 'b.down': shape \(4, 8\) split on dim 1 over tp "
        r"on ranks 0..2; shape \(4, 8\) split on dim 0 over tp on rank 3",
    ],
    "different_meshes": [r"ranks disagree on the transfer", r"MeshSpec\(dp=2; ranks \[3, 2\] of world 4\) on rank 3"],
    "meta_tensor_on_one_rank": [r"rank 1: source tensor 'c.bias' is on meta \(no data to send or receive\)"],
    "nccl_only_world_cpu_tensors": [
        r"rank 0: source tensors 'a.up', 'b.down', 'c.bias', 'z.last' are on cpu, but the "
        r"world's backend 'nccl' moves cuda tensors only",
        r"rank 3: destination tensors 'a.up', 'b.down', 'c.bias', 'z.last' are on cpu",
    ],
    "cpu_side_facing_gpu_side": [
        r"tensors on different device types cannot travel between ranks: cpu on ranks 0..1; "
        r"cuda on ranks 2..3"
    ],
    "every_rank_on_cuda_0": [r"ranks 0..3 on host host-a all use cuda:0: each rank needs its own accelerator"],
    "tensor_not_on_the_bound_device": [
        r"rank 1: source tensors 'a.up', 'b.down', 'c.bias', 'z.last' are on cuda:0, but "
        r"this rank's device is cuda:1 \(the world's bound device\)",
        r"rank 3: destination tensors .* are on cuda:0, but this rank's device is cuda:3",
    ],
    "lazy_world_subset_first_transfer": [
        r"the world's communicator is not created yet on ranks 0..3 and only 4 of its 8 ranks take part"
    ],
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_bad_input_is_the_same_error_on_every_rank(results, case):
    import re

    errors = [res[case]["error"] for res in results]
    assert errors[0] is not None and errors[0].startswith("MeshSpecError: ")
    assert len(set(errors)) == 1, f"{case}: ranks saw different outcomes {errors}"
    for pattern in REFUSED[case]:
        assert re.search(pattern, errors[0]), f"{case}: {pattern!r} not in {errors[0]!r}"
    assert [res[case]["batches"] for res in results] == [0] * WORLD, f"{case}: messages were posted before the error"


def test_a_transfer_posts_its_messages_as_batches(results):
    assert all(res["fp32_to_fp32"]["batches"] > 0 for res in results)  # every rank sends or receives


def test_a_rank_that_never_calls_is_an_error_after_the_timeout_not_a_hang(results):
    errors = [res["a_rank_not_calling"]["error"] for res in results[:3]]
    assert len(set(errors)) == 1 and errors[0].startswith(
        "MeshSpecError: transfer: only 3 of the 4 ranks taking part (ranks 0..3) started it"
    ), errors
    assert "(arrived: ranks 0..2; missing: rank 3)" in errors[0], errors[0]
    assert results[3]["a_rank_not_calling"]["error"] is None  # rank 3 is in neither of its meshes


def test_hypothesis_layouts_and_dtypes_bit_for_bit_or_refused_alike(results):
    for rank, res in enumerate(results):
        seen = res["hypothesis"]
        assert seen["failures"] == [], f"rank {rank}: {seen['failures'][:3]}"
        assert seen["examples"] == results[0]["hypothesis"]["examples"] >= 8
    assert results[0]["hypothesis"]["exact"] > 0 and sum(r["hypothesis"]["refused"] for r in results) > 0
