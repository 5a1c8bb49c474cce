"""``mesh --help`` and ``mesh show`` load no torch (``import mesh_core`` loads each name on first use)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

PROBE = """
import sys
sys.argv = ["mesh", *{args!r}]
from mesh_core.__main__ import main   # what the `mesh` console script runs
try:
    code = main()
except SystemExit as exit:
    code = exit.code
print("TORCH", "torch" in sys.modules, "CODE", code)
"""


@pytest.mark.parametrize(
    "args", [["--help"], ["show", "--help"], ["show"], ["show", "-w", "64", "--pp", "2", "--tp", "4"]]
)
def test_mesh_command_line_imports_no_torch(args):
    env = {**os.environ, "PYTHONPATH": ROOT}
    done = subprocess.run(
        [sys.executable, "-c", PROBE.format(args=args)], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "TORCH False CODE 0" in done.stdout, done.stdout[-500:]


def test_public_names_still_resolve():
    import mesh_core

    for name in mesh_core.__all__:
        assert getattr(mesh_core, name) is not None, name
    assert mesh_core.DeepSpeedDeviceMesh.__module__ == "mesh_core.device_mesh"
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        mesh_core.nope  # noqa: B018
