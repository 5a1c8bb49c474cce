"""The codemods against the installed deepspeed 0.19.8: MIGRATION.md covers every legacy name,
and migrating part of the package's own source keeps it compiling and is idempotent."""

from __future__ import annotations

import importlib.util
import inspect
import re
import shutil
from pathlib import Path

import pytest

from codemods._engine.runner import run
from codemods.rules import _grid_api as grid_api
from codemods.rules.groups_getters import ALL_FUNCTIONS

REPO = Path(__file__).resolve().parent.parent.parent
SUBSET = ["moe/layer.py", "runtime/pipe/module.py"]

pytestmark = pytest.mark.deepspeed


def migration_keys() -> set[str]:
    text = (REPO / "MIGRATION.md").read_text()
    return set(re.findall(r"^\| `([^`]+)` \|", text, flags=re.M))


def groups_functions() -> list[str]:
    import deepspeed.utils.groups as groups

    return [n for n, o in vars(groups).items() if inspect.isfunction(o) and o.__module__ == groups.__name__]


def test_every_groups_function_has_a_row_and_a_rule():
    names = groups_functions()
    assert len(names) > 50
    keys = migration_keys()
    assert [n for n in names if f"deepspeed.utils.groups.{n}" not in keys] == []
    assert [n for n in names if n not in ALL_FUNCTIONS] == []  # rewritten or flagged, never ignored
    assert sorted(ALL_FUNCTIONS - set(names)) == []  # no rule for a function that does not exist


def test_every_grid_method_has_a_row_and_a_rule():
    from deepspeed.runtime.pipe.topology import PipelineParallelGrid, ProcessTopology

    keys = migration_keys()
    methods = [n for n, o in vars(PipelineParallelGrid).items() if callable(o) and not n.startswith("__")]
    prefix = "deepspeed.runtime.pipe.topology.PipelineParallelGrid."
    assert [m for m in methods if prefix + m not in keys] == []
    known = set(grid_api.METHODS) | set(grid_api.MANUAL) | {"stage_to_global"}
    assert [m for m in methods if m not in known] == []
    topo_methods = [n for n, o in vars(ProcessTopology).items() if callable(o) and not n.startswith("__")]
    assert [m for m in topo_methods if f"deepspeed.runtime.pipe.topology.ProcessTopology.{m}" not in keys] == []


def test_migration_has_initialize_config_and_mpu_rows():
    keys = migration_keys()
    assert {"deepspeed.initialize(mpu=...)", "deepspeed.initialize(mesh_param=(dp, sp))"} <= keys
    assert {
        "mpu.get_model_parallel_group",
        "mpu.get_data_parallel_group",
        "mpu.get_tensor_model_parallel_group",
    } <= keys
    text = (REPO / "MIGRATION.md").read_text()
    for key in ("sequence_parallel_size", "data_parallel_size", "tensor_parallel.autotp_size"):
        assert f"| config `{key}` |" in text, key


def test_migrated_deepspeed_subset_compiles_and_is_idempotent(tmp_path):
    source = Path(importlib.util.find_spec("deepspeed").submodule_search_locations[0])
    files = []
    for rel in SUBSET:
        target = tmp_path / "deepspeed" / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(source / rel, target)
        for parent in target.parents:  # keep the package structure: relative imports resolve
            if parent == tmp_path:
                break
            (parent / "__init__.py").touch()
        files.append(target)
    first = run(files, jobs=1)
    assert first.errors == []
    assert first.changed >= 2 and sum(first.todos.values()) > 0
    for path in files:
        compile(path.read_text(), str(path), "exec")
    assert "TODOV1" in (tmp_path / "deepspeed/moe/layer.py").read_text()
    second = run(files, jobs=1, write=False)
    assert second.changed == 0 and second.errors == []
    assert second.todos == first.todos
