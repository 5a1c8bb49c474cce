"""4 gloo ranks: an unchanged program whose pipeline grid is a subclass that skips
``PipelineParallelGrid.__init__`` (CoLLiE's shape, ``self_built_grid_train.py``) trains under
``DS_MESH=1`` and under ``compat.install()`` with the same groups, losses and parameters as legacy,
with its engine from ``deepspeed.initialize`` or (as CoLLiE's own ``initialize``) a
``PipelineEngine`` subclass built directly; and a plain ``PipelineModule`` on a topology subclass
with a ``'sequence'`` axis (a public tree's ``PipeModelDataSequenceParallelTopology`` shape)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
WORLD = 4
MODES = ("ds_mesh", "ds_mesh_direct", "ds_mesh_seq", "legacy", "legacy_direct", "legacy_seq", "install")

pytestmark = [pytest.mark.multiprocess, pytest.mark.deepspeed]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("self_built_grid")
    env = dict(
        os.environ,
        DS_MESH="1",
        DS_ACCELERATOR="cpu",
        OMP_NUM_THREADS="1",
        PYTHONPATH=os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p),
    )
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={WORLD}",
        os.path.join(HERE, "self_built_grid_train.py"),
        str(out),
        ",".join(MODES),
    ]
    proc = subprocess.run(cmd, cwd=HERE, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
    return [{m: torch.load(out / f"{m}.rank{r}.pt") for m in MODES} for r in range(WORLD)]


@pytest.mark.parametrize(
    "mode,reference",
    [("ds_mesh", "legacy"), ("install", "legacy"), ("ds_mesh_direct", "legacy_direct"), ("ds_mesh_seq", "legacy_seq")],
)
def test_self_built_grid_trains_as_legacy(runs, mode, reference):
    for rank, by_mode in enumerate(runs):
        legacy, shimmed = by_mode[reference], by_mode[mode]
        assert shimmed["shim"] and not legacy["shim"]
        assert (
            shimmed["grid_type"]
            == legacy["grid_type"]
            == ("PipelineParallelGrid" if mode.endswith("_seq") else "SelfBuiltGrid")
        )
        assert shimmed["grid_groups_unique"] == legacy["grid_groups_unique"]
        assert shimmed["losses"] == legacy["losses"], rank
        assert shimmed["params"].keys() == legacy["params"].keys()
        for name, value in legacy["params"].items():
            assert torch.equal(shimmed["params"][name], value), (rank, name)
        assert shimmed["grid"] == legacy["grid"], rank
        assert shimmed["engine"] == legacy["engine"], rank
    # built directly, the engine's data-parallel group is the very group the grid made, as in legacy
    if mode.endswith("_direct"):
        assert all(by_mode[mode]["engine_dp_is_grids"] and by_mode[reference]["engine_dp_is_grids"] for by_mode in runs)
    assert len(set(runs[0][reference]["losses"])) > 1  # it trained
    if mode.endswith("_seq"):  # a 'sequence' axis: DeepSpeed's grid and engine, no mesh
        assert runs[1][reference]["grid"]["model"] == [0, 1, 2, 3] and runs[1][reference]["grid"]["pp"] == [1, 3]
        assert runs[1][mode]["engine_mesh"] == "NoneType"
    else:
        assert runs[0][reference]["grid"]["dp"] == [0, 1] and runs[0][reference]["grid"]["pp"] == [0, 2]
