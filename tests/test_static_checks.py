"""The faces as a type checker reads them: ``mesh_core``'s lazy names typed (its ``TYPE_CHECKING``
block, held equal to what ``__getattr__`` loads), and a type error through a face caught by mypy
(tools/static_checks.sh runs the checks themselves)."""

from __future__ import annotations

import ast
import importlib.util
import pathlib
import sys
import textwrap

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _type_checking_imports(path: pathlib.Path) -> dict[str, str]:
    """``name -> ".module"`` for each name the module's ``if TYPE_CHECKING:`` block imports."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            for imp in node.body:
                assert isinstance(imp, ast.ImportFrom) and imp.level == 1, ast.unparse(imp)
                for alias in imp.names:
                    found[alias.asname or alias.name] = "." + (imp.module or alias.name)
    return found


def test_the_lazy_face_shows_a_checker_what_it_loads():
    """Each name ``mesh_core.__getattr__`` loads (``_HOME``) is imported, from the same module, in the
    ``TYPE_CHECKING`` block a checker reads; so are the face modules it serves as attributes."""
    import mesh_core

    typed = _type_checking_imports(ROOT / "mesh_core" / "__init__.py")
    faces = {"axis_names", "runtime_hooks", "torch_compat"}
    assert {n: m for n, m in typed.items() if n not in faces} == mesh_core._HOME
    assert {n: m for n, m in typed.items() if n in faces} == {f: f".{f}" for f in faces}
    assert set(mesh_core._HOME) == set(mesh_core.__all__)


# a use of the faces with two deliberate type errors (an int taken as a str; a str passed as a mesh)
# and, below them, the same calls typed right
_SNIPPET = """
from mesh_core import MeshSpec, runtime_hooks
from mesh_core.axis_names import MeshDim

spec = MeshSpec.build(8, tp=2)
size_text: str = spec.dim_size(MeshDim.TP)
runtime_hooks.hpz_group("not a mesh")

size: int = spec.dim_size(MeshDim.TP)
group = runtime_hooks.hpz_group(None)
"""

# mypy reads mesh_core's modules for their types but does not report on them, nor read torch (whose
# types are not the question here and take a minute to read)
_MYPY_INI = """
[mypy]
follow_imports = silent
warn_unused_configs = false
[mypy-torch.*]
follow_imports = skip
follow_imports_for_stubs = true
[mypy-deepspeed.*,libcst.*,numpy.*,wrapt.*]
follow_imports = skip
follow_imports_for_stubs = true
"""


@pytest.mark.skipif(
    importlib.util.find_spec("mypy") is None,
    reason="mypy is not installed (the test extra pins it: pip install -e '.[test]')",
)
def test_a_type_error_through_a_face_is_caught(tmp_path, monkeypatch):
    from mypy import api

    (tmp_path / "use.py").write_text(textwrap.dedent(_SNIPPET), encoding="utf-8")
    (tmp_path / "mypy.ini").write_text(_MYPY_INI, encoding="utf-8")
    monkeypatch.setenv("MYPYPATH", str(ROOT))
    stdout, stderr, status = api.run(
        [
            "--config-file",
            str(tmp_path / "mypy.ini"),
            "--cache-dir",
            str(tmp_path / "cache"),
            "--python-executable",
            sys.executable,
            "--no-error-summary",
            "--show-error-codes",
            str(tmp_path / "use.py"),
        ]
    )
    errors = [line.split("use.py:", 1)[1] for line in stdout.splitlines() if "use.py:" in line]
    assert status == 1, (stdout, stderr)
    assert len(errors) == 2, stdout
    assert errors[0].startswith("6: error: Incompatible types in assignment") and '"int"' in errors[0], errors
    assert errors[1].startswith('7: error: Argument 1 to "hpz_group" has incompatible type "str"'), errors
