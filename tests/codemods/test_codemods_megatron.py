"""A Megatron-style tree (a parallel_state mpu module, ``mpu=mpu if cond else None``, a pipeline
topology sized from the mpu) migrates with no TODOV1 and trains identically on 4 gloo ranks:
legacy on the real deepspeed 0.19.8, migrated on the mesh runtime (``compat.install()`` added)."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from codemods import migrate_code

SAMPLE = Path(__file__).parent.parent / "fixtures" / "codemods" / "megatron"


def migrated():
    return migrate_code((SAMPLE / "pretrain.py").read_text())


def test_megatron_sample_migrates_without_todo():
    m = migrated()
    assert not m.todos and "TODOV1" not in m.code
    assert "mesh=DeepSpeedDeviceMesh.from_mpu(mpu) if args.no_pipeline_parallel else None" in m.code
    assert "mpu=" not in m.code and "compat.install()" in m.code
    assert migrate_code(m.code).code == m.code


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(directory: Path, script: str) -> list[str]:
    env = dict(os.environ, DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=4", f"--master_port={_free_port()}", script]
    done = subprocess.run(cmd, cwd=directory, capture_output=True, text=True, timeout=300, env=env)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-5000:]
    return sorted(re.findall(r"RESULT (\{[^}]*\})", out))  # ranks' lines may interleave


@pytest.mark.multiprocess
@pytest.mark.deepspeed
def test_megatron_sample_trains_the_same_after_migration(tmp_path):
    shutil.copy(SAMPLE / "parallel_state.py", tmp_path / "parallel_state.py")
    shutil.copy(SAMPLE / "pretrain.py", tmp_path / "legacy.py")
    (tmp_path / "migrated.py").write_text(migrated().code)
    legacy, new = _run(tmp_path, "legacy.py"), _run(tmp_path, "migrated.py")
    assert len(legacy) == 4
    assert new == legacy


ENGINES = Path(__file__).parent.parent / "fixtures" / "codemods" / "engines"


@pytest.mark.multiprocess
@pytest.mark.deepspeed
@pytest.mark.parametrize("name", sorted(p.name for p in ENGINES.glob("*.py")))
def test_engine_script_trains_the_same_after_migration(name, tmp_path):
    m = migrate_code((ENGINES / name).read_text())
    assert m.sites and not m.todos and "compat.install()" in m.code
    shutil.copy(ENGINES / name, tmp_path / "legacy.py")
    (tmp_path / "migrated.py").write_text(m.code)
    legacy, new = _run(tmp_path, "legacy.py"), _run(tmp_path, "migrated.py")
    assert len(legacy) == 4
    assert new == legacy
