"""An import a rewrite adds goes in the scope of the legacy import it replaces: a module that imports
DeepSpeed only inside a function or under a guard still imports without ds-mesh after migration, and
computes the same as the legacy module (run on the fake backend, with and without the shim)."""

from __future__ import annotations

import ast
import sys

import pytest

from codemod_scripts import run_fake
from codemods import migrate_code

SHOW = "def show(*v):\n    print('OUT', *v)\n"

LAZY = {
    "function": (
        'import os\n\n\ndef sizes():\n    """Sizes."""\n    from deepspeed.utils import groups\n'
        "    return groups._get_data_parallel_world_size(), groups._get_sequence_parallel_world_size()\n"
    ),
    "nested": (
        "def outer():\n    from deepspeed.utils import groups as g\n    def inner():\n"
        "        return g._get_data_parallel_rank()\n    return inner()\n\n\ndef sizes():\n    return outer(), 1\n"
    ),
    "guarded": (
        "try:\n    import deepspeed\n    from deepspeed.utils import groups\nexcept ImportError:  # optional\n"
        "    groups = None\n\n\ndef sizes():\n    return groups._get_data_parallel_world_size(), 0\n"
    ),
    "method": (
        "class Helper:\n    def sizes(self):\n        if True:\n            from deepspeed.utils import groups\n"
        "        return groups._get_data_parallel_world_size(), groups._get_data_parallel_rank()\n\n\n"
        "def sizes():\n    return Helper().sizes()\n"
    ),
}
EAGER = "from deepspeed.utils import groups\n\n\ndef sizes():\n    return groups._get_data_parallel_world_size(), 0\n"


def module_level_imports(code: str) -> set[str]:
    found = set()
    for node in ast.parse(code).body:
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module.split(".")[0])
        elif isinstance(node, ast.Import):
            found |= {a.name.split(".")[0] for a in node.names}
    return found


class _Blocked:
    """A meta-path finder that makes ``import mesh_core`` fail (ds-mesh not installed)."""

    def find_spec(self, name, path=None, target=None):
        if name == "mesh_core" or name.startswith("mesh_core."):
            raise ImportError(f"blocked: {name}")
        return None


@pytest.mark.parametrize("name", sorted(LAZY))
def test_lazy_legacy_import_stays_lazy(name, monkeypatch):
    migrated = migrate_code(LAZY[name]).code
    assert migrated != LAZY[name] and "mesh_core" in migrated
    assert "mesh_core" not in module_level_imports(migrated), migrated
    # importing the module needs neither ds-mesh nor (for the function forms) deepspeed
    for mod in [m for m in sys.modules if m == "mesh_core" or m.startswith("mesh_core.")]:
        monkeypatch.delitem(sys.modules, mod)
    monkeypatch.setattr(sys, "meta_path", [_Blocked(), *sys.meta_path])
    if name == "guarded":  # the guard's own import of deepspeed runs; mesh_core's is in that guard
        monkeypatch.setitem(sys.modules, "deepspeed", None)
    namespace: dict = {}
    exec(compile(migrated, "<lazy>", "exec"), namespace)
    assert callable(namespace["sizes"])


def test_relative_imports_of_another_package_do_not_make_the_import_module_level():
    # a package of its own (accelerate) imports its modules relatively at the top and deepspeed only
    # in a function: the added import stays in that function, as without a package
    source = "from .utils import helper\n\n\n" + LAZY["function"]
    migrated = migrate_code(source, module="accelerate.accelerator", package="accelerate").code
    assert "mesh_core" not in module_level_imports(migrated), migrated
    assert "    from mesh_core import current_mesh\n" in migrated


def test_unconditional_top_level_import_keeps_the_module_level_import():
    migrated = migrate_code(EAGER).code
    assert "mesh_core" in module_level_imports(migrated)


@pytest.mark.deepspeed
@pytest.mark.parametrize("name", sorted(LAZY))
@pytest.mark.parametrize("shim", [False, True], ids=["no-shim", "shim"])
def test_lazy_module_computes_the_same(name, shim):
    legacy = SHOW + LAZY[name] + "show(*sizes())\n"
    migrated = migrate_code(legacy).code
    for rank, world in ((0, 2), (3, 4)):
        before = run_fake(legacy, rank, world, legacy=True)
        after = run_fake(migrated, rank, world, legacy=False, shim=shim)
        assert before and not before[-1].startswith("OUT raised"), before
        assert after == before, (rank, world, migrated)
