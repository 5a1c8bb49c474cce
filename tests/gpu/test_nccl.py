"""The NCCL creation paths, a sub-world engine and a ZeRO-3 step on real GPUs (skipped without
CUDA). One torchrun run of tests/gpu/nccl_checks.py on 1, 2, 4 or 8 ranks (the most GPUs of those;
NCCL needs one GPU per rank), then one test per part. ``tools/gpu_check.sh`` runs the same parts
without pytest.

``MESH_GPU_DRY_RUN=1`` runs the same parts on 2 gloo/CPU ranks instead (the script checked where
there is no GPU; the NCCL-only parts report a dry run)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
DRY = os.environ.get("MESH_GPU_DRY_RUN") == "1"
PARTS = ["probe", "member_only", "split", "sharing", "subworld_engine", "zero3", "zero_bf16", "hf_trainer", "pipelines",
         "transfer", "member_only_bound"]
RUN_TIMEOUT_S = 280

pytestmark = pytest.mark.skipif(
    not DRY and not torch.cuda.is_available(), reason="needs CUDA (NCCL, one GPU per rank); MESH_GPU_DRY_RUN=1 for the gloo dry run"
)


def _world() -> int:
    if DRY:
        return 2
    count = torch.cuda.device_count()
    return next(n for n in (8, 4, 2, 1) if count >= n)


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    out = tmp_path_factory.mktemp("nccl")
    world = _world()
    env = dict(os.environ, OMP_NUM_THREADS="1", DS_ACCELERATOR="cpu" if DRY else "cuda",
               TORCH_EXTENSIONS_DIR=str(out / "torch_extensions"))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={world}",
           os.path.join(HERE, "nccl_checks.py"), str(out)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    if proc.returncode != 0:
        raise AssertionError(f"nccl_checks.py failed (rc={proc.returncode}):\n{(proc.stdout + proc.stderr)[-6000:]}")
    per_rank = [json.loads((out / f"rank{r}.json").read_text()) for r in range(world)]
    print(json.dumps(per_rank, indent=1))  # the closing note quotes this (pytest -s)
    return per_rank


@pytest.mark.parametrize("part", PARTS)
def test_part_on_every_rank(results, part):
    failed = {r: res["results"][part] for r, res in enumerate(results) if not res["results"][part]["ok"]}
    assert not failed, failed
    skipped = {res["results"][part].get("skipped") for res in results} - {None}
    if skipped:
        pytest.skip("; ".join(sorted(skipped)))
