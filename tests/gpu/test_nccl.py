"""The GPU acceptance parts on real GPUs (skipped without CUDA), one test per part: each part is one
torchrun of tests/gpu/nccl_checks.py under its own bound (tests/gpu/gpu_driver.py, what
``tools/gpu_check.sh`` runs), on 1, 2, 4 or 8 ranks (the most GPUs of those; NCCL needs one GPU per rank).

``MESH_GPU_DRY_RUN=1`` runs the same parts on 2 gloo/CPU ranks instead (the script checked where
there is no GPU; the NCCL-only parts report a dry run)."""

from __future__ import annotations

import json
import os
import sys

import pytest
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import gpu_driver  # noqa: E402

DRY = os.environ.get("MESH_GPU_DRY_RUN") == "1"

pytestmark = pytest.mark.skipif(
    not DRY and not torch.cuda.is_available(),
    reason="needs CUDA (NCCL, one GPU per rank); MESH_GPU_DRY_RUN=1 for the gloo dry run",
)


def _world() -> int:
    if DRY:
        return 2
    count = torch.cuda.device_count()
    return next(n for n in (8, 4, 2, 1) if count >= n)


@pytest.fixture(scope="module")
def out_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("nccl"))


@pytest.mark.parametrize("part", gpu_driver.default_parts())
def test_part_on_every_rank(out_dir, part, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("DS_ACCELERATOR", "cpu" if DRY else "cuda")
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", os.path.join(out_dir, "torch_extensions"))
    line = gpu_driver.run_part(part, out_dir, _world(), DRY)
    print(json.dumps(line))  # the closing note quotes these (pytest -s)
    assert line["ok"], json.dumps(line, indent=1)[-6000:]
    if line.get("skipped"):
        pytest.skip(line["skipped"])
