"""The migrated DeepSpeed package trains like the real one (slow: deselected by default).

The modules the issue-10b rewrites touch (engine, pipeline engine / module / p2p, ZeRO 1/2/3, BF16
optimizer) are migrated in a copy of the installed deepspeed 0.19.8; each engine script of the
codemod fixtures (and the Megatron sample) then runs on 4 gloo ranks twice: as written on the real
deepspeed, and migrated on the migrated copy with the mesh runtime. Their RESULT lines (groups, ranks,
engine sizes, trained weights / losses) must be equal.

    python -m pytest -m migrated_deepspeed tests/test_codemods_internal_e2e.py
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

from codemods.files import module_and_package
from codemods.pipeline import migrate_code

pytestmark = [pytest.mark.migrated_deepspeed, pytest.mark.multiprocess, pytest.mark.deepspeed]

REPO = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).parent / "fixtures" / "codemods"
TOUCHED = (
    "runtime/engine.py", "runtime/pipe/engine.py", "runtime/pipe/module.py", "runtime/pipe/p2p.py",
    "runtime/zero/stage_1_and_2.py", "runtime/zero/stage3.py", "runtime/bf16_optimizer.py",
    "runtime/zero/partition_parameters.py",  # issue 10h: zero.Init's hpZ sites
)
SCRIPTS = sorted(p.relative_to(FIXTURES).as_posix() for p in (FIXTURES / "engines").glob("*.py")) + ["megatron/pretrain.py"]


@pytest.fixture(scope="module")
def migrated_copy(tmp_path_factory) -> Path:
    spec = importlib.util.find_spec("deepspeed")
    root = tmp_path_factory.mktemp("migrated") / "deepspeed"
    shutil.copytree(list(spec.submodule_search_locations)[0], root, ignore=shutil.ignore_patterns("__pycache__"))
    for relative in TOUCHED:
        path = root / relative
        module, package = module_and_package(path)
        migration = migrate_code(path.read_text(encoding="utf-8"), filename=str(path), module=module, package=package)
        assert migration.sites, relative
        path.write_text(migration.code, encoding="utf-8")
    return root.parent


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(directory: Path, script: str, *path: str) -> list[str]:
    env = dict(os.environ, DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([*path, str(REPO), os.environ.get("PYTHONPATH", "")]))
    env.setdefault("TORCH_EXTENSIONS_DIR", str(directory / "ext"))
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
