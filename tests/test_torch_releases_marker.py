"""The torch-release subset of .ci/run is chosen by the ``torch_releases`` marker: every test module of
mesh_core, compat and the NCCL contract carries it (at module level) unless it is named below with why,
so a new module joins the subset run on the oldest and newest supported torch without anyone
remembering to add it."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent
FOLDERS = ("mesh_core", "compat", "nccl_contract")
NOT_MARKED = {
    "mesh_core/test_cli_no_torch.py": "runs the CLI where torch cannot be imported",
    "compat/test_upstream_runner.py": "the upstream runner's own logic (reports, logs, env), no torch",
    "mesh_core/test_transfer_jobs_hostile.py": "aborts the process on torch 2.6 when run after the rest of the"
    " torch-release subset (alone it passes there): open under issue 54; runs in the main pytest",
    "mesh_core/test_transfer_jobs_threads.py": "the weight link's thread cases, left out with"
    " test_transfer_jobs_hostile.py (torch 2.6); run in the main pytest",
    "compat/test_startup_installs.py": "installs ds-mesh into a venv and runs it with python -S over that venv's own"
    " site-packages: the release venvs are layered on the main one (.ci/run) and hold only their release",
}


def _module_marks(path: Path) -> set[str]:
    """Names of the marks in ``pytestmark`` (``pytest.mark.NAME`` or ``pytest.mark.NAME(...)``)."""
    marks = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "pytestmark" for t in node.targets):
            for sub in ast.walk(node.value):
                if isinstance(sub, ast.Attribute) and isinstance(sub.value, ast.Attribute) and sub.value.attr == "mark":
                    marks.add(sub.attr)
    return marks


def _only_multiprocess(path: Path) -> bool:
    """Whether every test function of the module is marked ``multiprocess`` one by one."""
    tests = [
        n for n in ast.parse(path.read_text()).body if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")
    ]
    return bool(tests) and all(
        "multiprocess" in ast.dump(ast.Module(body=n.decorator_list, type_ignores=[])) for n in tests
    )


def test_every_torch_facing_module_is_in_the_torch_release_subset():
    missing = []
    for folder in FOLDERS:
        for path in sorted((ROOT / folder).glob("test_*.py")):
            rel = path.relative_to(ROOT).as_posix()
            marks = _module_marks(path)
            if rel in NOT_MARKED or "multiprocess" in marks or _only_multiprocess(path):  # gloo runs: main run only
                continue
            if "torch_releases" not in marks:
                missing.append(rel)
    assert not missing, f"test modules without pytestmark torch_releases (or a reason in NOT_MARKED): {missing}"
    assert "torch_releases" in _module_marks(ROOT / "e2e" / "test_e2e_shim.py")  # the 4-rank shim-vs-legacy run


def test_the_modules_left_out_exist_and_are_unmarked():
    for rel in NOT_MARKED:
        assert "torch_releases" not in _module_marks(ROOT / rel), rel
