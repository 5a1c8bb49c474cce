"""The migrated DeepSpeed package trains like the real one (slow: deselected by default).

A copy of the installed deepspeed 0.19.8 is migrated whole (``python -m codemods.migrate``; among
the files that change: engine, pipeline engine / module, ZeRO 1/2/3, zero.Init, BF16 optimizer, MoE
layers, AutoTP); each engine script of the
codemod fixtures (and the Megatron sample) then runs on 4 gloo ranks twice: as written on the real
deepspeed, and migrated on the migrated copy with the mesh runtime. Their RESULT lines (groups, ranks,
engine sizes, trained weights / losses) must be equal.

    python -m pytest -m migrated_deepspeed tests/codemods/test_codemods_internal_e2e.py
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from codemods import migrate_code

pytestmark = [pytest.mark.migrated_deepspeed, pytest.mark.multiprocess, pytest.mark.deepspeed]

REPO = Path(__file__).resolve().parent.parent.parent
FIXTURES = Path(__file__).parent.parent / "fixtures" / "codemods"
TOUCHED = (
    "runtime/engine.py",
    "runtime/pipe/engine.py",
    "runtime/pipe/module.py",
    "runtime/pipe/p2p.py",
    "runtime/zero/stage_1_and_2.py",
    "runtime/zero/stage3.py",
    "runtime/bf16_optimizer.py",
    "runtime/zero/partition_parameters.py",  # issue 10h: zero.Init's hpZ sites
    "moe/sharded_moe.py",
    "runtime/tensor_parallel/tp_manager.py",  # issues 10e, 10m
)
# engines/: scripts with legacy calls to migrate; deepspeed_internal/: scripts whose legacy sites are
# inside DeepSpeed itself (e.g. zero.Init's hpZ groups), so only the migrated package differs
SCRIPTS = sorted(
    p.relative_to(FIXTURES).as_posix()
    for folder in ("engines", "deepspeed_internal")
    for p in (FIXTURES / folder).glob("*.py")
) + ["megatron/pretrain.py"]


@pytest.fixture(scope="module")
def migrated_copy(tmp_path_factory) -> Path:
    spec = importlib.util.find_spec("deepspeed")
    installed = Path(list(spec.submodule_search_locations)[0])
    root = tmp_path_factory.mktemp("migrated") / "deepspeed"
    shutil.copytree(installed, root, ignore=shutil.ignore_patterns("__pycache__"))
    done = subprocess.run(
        [sys.executable, "-m", "codemods.migrate", "--jobs", "2", "--no-cache", str(root)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    for relative in TOUCHED:
        assert (root / relative).read_bytes() != (installed / relative).read_bytes(), relative
    return root.parent


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(directory: Path, script: str, *path: str) -> list[str]:
    env = dict(
        os.environ,
        DS_ACCELERATOR="cpu",
        OMP_NUM_THREADS="1",
        PYTHONPATH=os.pathsep.join([*path, str(REPO), os.environ.get("PYTHONPATH", "")]),
    )
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=4", f"--master_port={_port()}", script]
    done = subprocess.run(cmd, cwd=directory, capture_output=True, text=True, timeout=900, env=env)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-5000:]
    return sorted(re.findall(r"RESULT (\{[^}]*\})", out))


@pytest.mark.parametrize("script", SCRIPTS)
def test_migrated_script_on_migrated_deepspeed_trains_like_legacy(script, migrated_copy, tmp_path):
    source = FIXTURES / script
    for helper in source.parent.glob("*.py"):
        if helper != source:
            shutil.copy(helper, tmp_path / helper.name)  # e.g. the Megatron sample's parallel_state
    shutil.copy(source, tmp_path / "legacy.py")
    (tmp_path / "migrated.py").write_text(migrate_code(source.read_text()).code)
    legacy = _run(tmp_path, "legacy.py")
    new = _run(tmp_path, "migrated.py", str(migrated_copy))
    assert len(legacy) == 4
    assert new == legacy
