"""The mesh runtime (``compat.install()``) is taken in on every path: decided from the code (never a
comment), before the first import that binds a deepspeed name, after the module-level statements
that ran before it, under the same guard. Each shape is a fixture (tests/fixtures/codemods/runtime)
run legacy on the real deepspeed 0.19.8 under the shim and migrated as written (its own
``compat.install()``) on fake-backend ranks: the same output (an install after the import raises on
``mesh=`` or loses the mesh)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from codemod_scripts import run_fake
from codemods import migrate_code
from codemods._engine.runtime import installs, needs_runtime


def spelled(source: str) -> str:
    """The migrated code with each TODOV1 comment's full advice."""
    return migrate_code(source).spelled_out()


RUNTIME = Path(__file__).parent.parent / "fixtures" / "codemods" / "runtime"
FIXTURES = sorted(p.name for p in RUNTIME.glob("*.py"))


def source(name: str) -> str:
    return (RUNTIME / name).read_text()


def install_line(code: str) -> int:
    return next(i for i, line in enumerate(code.splitlines()) if line.strip().startswith("compat.install()"))


def first_deepspeed_import(code: str) -> int:
    return next(
        i
        for i, line in enumerate(code.splitlines())
        if line.strip().startswith(("import deepspeed", "from deepspeed", "from mylib import *"))
    )


@pytest.mark.parametrize("name", FIXTURES)
def test_the_install_runs_before_the_first_deepspeed_import(name):
    m = migrate_code(source(name))
    assert installs(ast.parse(m.code)), m.code
    assert install_line(m.code) < first_deepspeed_import(m.code), m.code
    assert migrate_code(m.code).code == m.code  # a fixed point


def test_a_start_time_stamp_stays_before_every_added_import():
    code = migrate_code(source("start_time.py")).code
    lines = code.splitlines()
    stamp = next(i for i, line in enumerate(lines) if line.startswith("_TRAIN_START_TIME"))
    assert all(i > stamp for i, line in enumerate(lines) if "mesh_core" in line or "compat" in line), code


def test_a_guarded_deepspeed_import_gets_the_install_in_its_guard():
    code = migrate_code(source("guarded_if.py")).code
    line = code.splitlines()[install_line(code)]
    assert line.startswith("    compat.install()"), code  # indented: inside the guard


def test_the_install_never_goes_inside_the_users_except_import_error():
    # the user's ``try: import deepspeed / except ImportError`` means "no deepspeed": a missing
    # ds-mesh inside it would silently turn the feature off; install() works without deepspeed
    code = migrate_code(source("guarded_try.py")).code
    lines = code.splitlines()
    at = install_line(code)
    assert lines[at].startswith("compat.install()") and lines[at - 1] == "import compat", code
    assert lines[at + 1] == "try:", code


def test_a_deepspeed_import_inside_a_function_gets_the_install_there():
    code = migrate_code(source("local_import.py")).code
    assert code.splitlines()[install_line(code)].startswith("    compat.install()"), code
    assert "\nimport compat" not in code


@pytest.mark.deepspeed
@pytest.mark.parametrize("name", FIXTURES)
def test_the_migrated_program_as_written_computes_what_legacy_did(name, monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "0")
    legacy = source(name)
    migrated = migrate_code(legacy).code
    for rank in (0, 3):
        before = run_fake(legacy, rank, 4, legacy=True, shim=True)  # the runtime's answers (Ulysses: a DP size)
        assert before and not any("raised" in line for line in before), before
        assert run_fake(migrated, rank, 4, legacy=True) == before, (rank, migrated)


# --- comments decide nothing ------------------------------------------------------------------
UNTOUCHED_ENGINE = """import torch
import deepspeed
from deepspeed.utils import groups

config = {"train_micro_batch_size_per_gpu": 1, "steps_per_print": 10**6,
          "optimizer": {"type": "Adam", "params": {"torch_adam": True}}}
engine, *_ = deepspeed.initialize(model=torch.nn.Linear(4, 4), config=config)
state = groups.mpu
print("OUT", engine.dp_world_size, state)
"""


def test_a_todov1_naming_engine_mesh_device_does_not_bring_the_shim():
    m = migrate_code(UNTOUCHED_ENGINE)
    assert m.todos and "mesh_device" in spelled(UNTOUCHED_ENGINE)  # the TODOV1 advice names it
    assert "compat" not in m.code
    assert not needs_runtime(UNTOUCHED_ENGINE, m.code, m.sites)


@pytest.mark.deepspeed
def test_an_untouched_engine_keeps_its_world_size(monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "0")
    m = migrate_code(UNTOUCHED_ENGINE)
    assert run_fake(m.code, 1, 4, legacy=True) == run_fake(UNTOUCHED_ENGINE, 1, 4, legacy=True)


def test_a_comment_naming_compat_install_does_not_suppress_it():
    legacy = (
        "import deepspeed\n\n\ndef f(model, config, mpu):\n    # compat.install() is called by the launcher\n"
        "    return deepspeed.initialize(model=model, config=config, mpu=mpu)\n"
    )
    m = migrate_code(legacy)
    assert m.sites["initialize mpu"] == 1 and installs(ast.parse(m.code)), m.code


def test_a_todov1_naming_compat_install_does_not_suppress_it():
    legacy = source("moved_mpu.py").replace(
        'print("OUT"', '# TODOV1: call compat.install() before deepspeed is imported\nprint("OUT"'
    )
    m = migrate_code(legacy)
    assert "compat.install()" in m.code.split("TODOV1")[1]  # a comment mentions it
    assert installs(ast.parse(m.code))


def test_a_real_install_is_not_added_twice():
    code = migrate_code(source("moved_mpu.py")).code
    assert code.count("compat.install()") == 1 and not needs_runtime(code, code, {"initialize mpu": 1})


def test_a_removed_function_local_import_leaves_its_blank_line():
    legacy = (
        'def f():\n    """Doc."""\n\n    from deepspeed.utils import groups\n'
        "    return groups._get_data_parallel_world_size()\n"
    )
    code = migrate_code(legacy).code
    assert code == (
        'def f():\n    """Doc."""\n\n    from mesh_core import current_mesh\n    return current_mesh().size("dp")\n'
    ), code
