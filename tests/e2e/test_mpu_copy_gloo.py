"""A copy of the installed deepspeed package whose mpu / bwc call sites ``codemods.rules.mpu_internal``
rewrote imports and trains exactly as the installed one: DeepSpeed's test MPU (tp=2, ZeRO-1),
a Megatron-style mpu (tp=2, clipping) and a PipelineModule (pp=2, grid as mpu), 4 gloo ranks,
bit-identical losses and parameters.

Slow (the codemod resolves metadata in engine.py / stage3.py, then two torchrun jobs: minutes), so
deselected by default: ``python -m pytest -m deepspeed_copy tests/e2e/test_mpu_copy_gloo.py``.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import shutil
import subprocess
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "e2e"))
from runner import assert_bit_identical, torchrun  # noqa: E402

pytestmark = [pytest.mark.deepspeed_copy, pytest.mark.multiprocess, pytest.mark.deepspeed, pytest.mark.timeout(1800)]

REPO = Path(__file__).resolve().parent.parent.parent
MODES = ("test_mpu", "megatron", "pipe")


def has_sites(path: Path) -> bool:
    text = path.read_text(encoding="utf-8")
    return "bwc_" in text or ("mpu." in text and ".get_" in text)


def migrate_one(args: tuple[str, str, str]) -> tuple[str, int, int]:
    from codemods import migrate_code
    from codemods.rules.mpu_internal import MpuInternalCommand

    path, module, package = args
    source = Path(path).read_text(encoding="utf-8")
    done = migrate_code(source, module=module, package=package, codemods=(MpuInternalCommand,))
    if done.code != source:
        Path(path).write_text(done.code, encoding="utf-8")
    return path, sum(done.sites.values()), sum(done.todos.values())


@pytest.fixture(scope="module")
def copy(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("ds_copy")
    installed = Path(list(importlib.util.find_spec("deepspeed").submodule_search_locations)[0])
    tree = root / "deepspeed"
    shutil.copytree(installed, tree, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    tasks = []
    for path in sorted(tree.rglob("*.py")):
        if has_sites(path):
            parts = path.relative_to(root).with_suffix("").parts
            module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            tasks.append((str(path), module, module.rpartition(".")[0]))
    with ProcessPoolExecutor(max_workers=2) as pool:
        done = list(pool.map(migrate_one, tasks))
    assert sum(sites for _, sites, _ in done) >= 80, done
    for path, _, _ in done:
        ast.parse(Path(path).read_text(encoding="utf-8"))
    return root


def test_migrated_copy_imports(copy):
    env = dict(os.environ, PYTHONPATH=f"{copy}{os.pathsep}{REPO}")
    code = (
        "import deepspeed, deepspeed.runtime.engine, deepspeed.runtime.zero.stage3, deepspeed.moe.layer, "
        "deepspeed.runtime.pipe.engine, deepspeed.runtime.activation_checkpointing.checkpointing; "
        "print(deepspeed.__file__)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=str(copy))
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().startswith(str(copy))


def test_migrated_copy_trains_like_the_installed_package(copy, tmp_path):
    legacy = torchrun("train_mpu_copy.py", str(tmp_path / "legacy"), timeout=600)
    migrated = torchrun(
        "train_mpu_copy.py", str(tmp_path / "migrated"), timeout=600, env={"PYTHONPATH": f"{copy}{os.pathsep}{REPO}"}
    )
    for rank, (want, got) in enumerate(zip(legacy, migrated)):
        assert not want["deepspeed"].startswith(str(copy)) and got["deepspeed"].startswith(str(copy))
        for mode in MODES:
            assert_bit_identical(want[mode], got[mode], f"rank {rank} {mode}")
            assert (got[mode]["dp"], got[mode]["mp"], got[mode]["optimizer"]) == (
                want[mode]["dp"],
                want[mode]["mp"],
                want[mode]["optimizer"],
            )
            assert want[mode]["mpu_queries"] == 0 and got[mode]["mpu_queries"] > 0, mode  # the migrated sites ran
