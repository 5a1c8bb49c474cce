"""Every mpu plain DeepSpeed accepts trains the same under the shim: an mpu with only the data- and
model-parallel getters, and one with pipe getters too, on a pp=2 x tp=2 x dp=2 world of 8 gloo
ranks whose pipeline the script runs itself (train_mpu_shapes.py)."""

from __future__ import annotations

import pytest
from runner import assert_bit_identical, torchrun

pytestmark = [pytest.mark.multiprocess, pytest.mark.deepspeed]
SHAPES = ("dp_mp", "pipe")
WAYS = ("plain", "mpu", "mesh", "config")  # plain DeepSpeed; the shim with mpu=, mesh=from_mpu(mpu), a "mesh" section


def test_mpu_shapes_train_like_plain_deepspeed(tmp_path):
    results = torchrun("train_mpu_shapes.py", str(tmp_path), world=8, timeout=600)
    for rank, result in enumerate(results):
        pp_group = [rank % 4, rank % 4 + 4]
        for shape in SHAPES:
            plain = result[(shape, "plain")]
            assert "error" not in plain, plain
            for way in WAYS[1:]:
                shim = result[(shape, way)]
                assert "error" not in shim, f"rank {rank} {shape} {way}: {shim['error']}"
                assert_bit_identical(plain, shim, f"rank {rank} {shape} {way}")
                # what DeepSpeed read from the mpu: the same sizes and the same checkpoint mp rank
                assert (shim["dp"], shim["mp"], shim["mp_rank"]) == (plain["dp"], plain["mp"], plain["mp_rank"])
                assert shim["mesh"] == {"pp": 2, "dp": 2, "tp": 2, "sp": 1}
                assert shim["mesh_pp"] == pp_group
