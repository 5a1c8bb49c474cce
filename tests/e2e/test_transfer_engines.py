"""mesh_core.transfer._engines: actor engine -> rollout engine in one call, bit for bit against the
actor's weights gathered another way (tests/e2e/transfer_engines.py on 4 gloo ranks)."""

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "e2e"))
from runner import torchrun  # noqa: E402

pytestmark = [pytest.mark.multiprocess, pytest.mark.deepspeed]
NAMES = {
    f"block.{n}"
    for n in ("up_proj.weight", "up_proj.bias", "down_proj.weight", "down_proj.bias", "norm.weight", "norm.bias")
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return torchrun(
        "transfer_engines.py",
        str(tmp_path_factory.mktemp("engines")),
        "zero3,autotp,zero2,zero3_dst,zero3_autotp",
        timeout=600,
    )


def _bit_for_bit(runs, case, rollout_ranks):
    for rank in rollout_ranks:
        same = runs[rank][case]["same"]
        assert set(same) == NAMES and all(same.values()), f"rank {rank}: {same}"
    for res in runs:
        if "actor_changed" in res[case]:
            assert res[case]["actor_changed"]  # the actor trained a step: no init value can pass by chance


def test_zero3_actor_to_dp_rollout_gathers_per_bucket(runs):
    _bit_for_bit(runs, "zero3", [2, 3])
    assert runs[0]["zero3"]["actor_up_shape"] == [0]  # partitioned: the actor never held it whole outside a gather
    for rank in (2, 3):  # 1184 bytes in buckets of 400: several gathered groups, each its own messages
        assert runs[rank]["zero3"]["messages"] >= 3 and runs[rank]["zero3"]["received"] == 296


def test_autotp_tp2_actor_to_dp_rollout(runs):
    _bit_for_bit(runs, "autotp", [2, 3])
    assert runs[0]["autotp"]["actor_up_shape"] == [8, 8]  # AutoTP split the 16 x 8 column-parallel weight
    for rank in (2, 3):  # the shards come from both tp ranks
        assert runs[rank]["autotp"]["messages"] == 2 and runs[rank]["autotp"]["received"] == 296


def test_zero2_actor_to_sub_world_rollout_copies_locally(runs):
    _bit_for_bit(runs, "zero2", [1, 2, 3])
    for rank in (1, 2, 3):  # ranks 1-3 hold both sides: nothing travels
        assert runs[rank]["zero2"]["copied"] == 296 and runs[rank]["zero2"]["messages"] == 0


def test_zero1_actor_to_zero3_rollout_written_while_gathered(runs):
    _bit_for_bit(runs, "zero3_dst", [2, 3])
    for rank in (2, 3):  # partitioned again after the transfer; whole inside a gather
        assert runs[rank]["zero3_dst"]["rollout_partitioned"] and runs[rank]["zero3_dst"]["rollout_up_numel"] == 128


def test_zero3_autotp_actor_to_dp_rollout_gathers_over_dp_and_takes_both_tp_shards(runs):
    _bit_for_bit(runs, "zero3_autotp", [2, 3])
    assert all(runs[r]["zero3_autotp"]["actor_up_shape"] == [0] for r in range(4))  # ZeRO-3 partitioned the tp shards
    for rank in (2, 3):  # each rollout rank is also an actor rank: its own tp shard is copied, the other one travels
        res = runs[rank]["zero3_autotp"]
        assert res["copied"] > 0 and res["received"] > 0 and res["copied"] + res["received"] == 296, res
