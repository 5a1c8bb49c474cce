"""``mesh doctor``: a healthy environment (exit 0), a stale shm-op lock, a missing start-up hook and a
torch outside the supported range (each named, exit 1), ``--json``, and no torch / deepspeed import."""
from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import time

import pytest

import _ds_mesh_doctor as doctor
from compat import releases, startup

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# the doctor as ``mesh doctor`` runs in a process whose start-up processed ``site_dir`` (or none)
RUN = """
import site, sys
if {site!r}:
    site.addsitedir({site!r})
if {no_hook!r}:  # an environment without the hook: what this venv's own ds_mesh.pth ran is forgotten
    sys.modules.pop("_ds_mesh_startup", None)
    import _ds_mesh_doctor
    _ds_mesh_doctor.site_dirs = lambda: [{no_hook!r}]
from mesh_core.cli.commands import main
code = main(["doctor", *{args!r}])
print("IMPORTED", sorted(m for m in ("torch", "deepspeed", "compat") if m in sys.modules))
sys.exit(code)
"""


def mesh_doctor(tmp_path, *args, site_dir="", no_hook="", **env_extra) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("DS_MESH", "TORCH_EXTENSIONS_DIR")}
    env.update(PYTHONPATH=ROOT, DS_ACCELERATOR="cpu", TORCH_EXTENSIONS_DIR=str(tmp_path / "ext"), **env_extra)
    return subprocess.run([sys.executable, "-c", RUN.format(site=site_dir, no_hook=no_hook, args=list(args))], env=env,
                          cwd=str(tmp_path), capture_output=True, text=True, timeout=120)


@pytest.fixture
def site_dir(tmp_path):
    directory = tmp_path / "site"
    directory.mkdir()
    startup.write_pth(str(directory))
    return str(directory)


def built(tmp_path):
    directory = tmp_path / "ext" / doctor.SHM_OP
    directory.mkdir(parents=True)
    (directory / f"{doctor.SHM_OP}.so").touch()
    return directory


def test_a_healthy_environment_is_ready(tmp_path, site_dir):
    built(tmp_path)
    proc = mesh_doctor(tmp_path, site_dir=site_dir, DS_MESH="1")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.splitlines()[-2] == "verdict: ready"
    assert "[OK  ] start-up hook" in proc.stdout and "DS_MESH=1" in proc.stdout
    assert "[OK  ] shm op: deepspeed_shm_comm built" in proc.stdout and "backend gloo" in proc.stdout
    assert "IMPORTED []" in proc.stdout  # nothing heavy: it answers at once


def test_a_stale_lock_is_named_with_the_command_that_clears_it(tmp_path, site_dir):
    lock = built(tmp_path) / "lock"
    lock.touch()
    os.utime(lock, (time.time() - 3600,) * 2)
    proc = mesh_doctor(tmp_path, site_dir=site_dir, DS_MESH="1")
    assert proc.returncode == 1
    assert f"[FAIL] shm op: {lock} is a stale lock" in proc.stdout and f"rm {lock}" in proc.stdout
    assert "verdict: NOT READY: fix shm op" in proc.stdout


def test_a_lock_of_a_build_that_just_started_is_building(tmp_path, site_dir):
    (built(tmp_path) / "lock").touch()
    proc = mesh_doctor(tmp_path, site_dir=site_dir)
    assert proc.returncode == 0 and "being built now" in proc.stdout, proc.stdout


def test_a_missing_hook_is_named(tmp_path):
    built(tmp_path)
    bare = tmp_path / "bare-site-packages"
    bare.mkdir()
    on = mesh_doctor(tmp_path, no_hook=str(bare), DS_MESH="1")
    assert on.returncode == 1, on.stdout
    assert "[FAIL] start-up hook: the DS_MESH start-up hook is not installed" in on.stdout
    assert "this job runs plain DeepSpeed" in on.stdout and "python -m compat.install --write-pth" in on.stdout
    off = mesh_doctor(tmp_path, no_hook=str(bare))
    assert off.returncode == 0 and "[WARN] start-up hook" in off.stdout and "DS_MESH=1 would do nothing" in off.stdout


def test_torch_outside_the_supported_range_is_named(monkeypatch, tmp_path):
    built(tmp_path)
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "ext"))
    real = doctor.installed_version
    monkeypatch.setattr(doctor, "installed_version", lambda name: "2.5.1" if name == "torch" else real(name))
    out = io.StringIO()
    assert doctor.main([], out=out) == 1
    assert f"[FAIL] torch: torch 2.5.1 is outside {doctor.supported_range('mesh_core/torch_compat.py')}" in out.getvalue()
    assert "verdict: NOT READY: fix torch" in out.getvalue()


def test_json(tmp_path, site_dir):
    built(tmp_path)
    proc = mesh_doctor(tmp_path, "--json", site_dir=site_dir)
    result = json.loads(proc.stdout[: proc.stdout.rindex("IMPORTED")])
    assert result["ok"] is True and result["verdict"] == "ready"
    assert [c["check"] for c in result["checks"]] == ["torch", "deepspeed", "libcst", "start-up hook", "accelerator",
                                                      "shm op"]


def test_the_ranges_are_the_enforced_ones():
    from mesh_core import torch_compat

    assert doctor.supported_range("mesh_core/torch_compat.py") == torch_compat.SUPPORTED
    assert doctor.supported_range("compat/releases.py") == releases.SUPPORTED
    with open(os.path.join(ROOT, "pyproject.toml"), encoding="utf-8") as fh:
        assert f'"libcst{doctor.LIBCST}"' in fh.read()


@pytest.mark.parametrize("version,constraint,inside", [
    ("2.13.0+cpu", ">=2.6.0,<=2.14.1", True), ("2.5.1", ">=2.6.0,<=2.14.1", False),
    ("2.14.2", ">=2.6.0,<=2.14.1", False), ("1.10.0", ">=1.5,<1.10", False), ("1.9.0", ">=1.5,<1.10", True),
])
def test_in_range(version, constraint, inside):
    assert doctor.in_range(version, constraint) is inside


@pytest.mark.deepspeed
def test_deep_asks_torch_and_deepspeed(monkeypatch):
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    check = doctor.check_deep()
    assert check["status"] == doctor.OK and check["deepspeed_accelerator"] == "cpu"
    assert check["deepspeed_backend"] in ("gloo", "ccl") and check["torch_cuda_available"] in (True, False)


@pytest.mark.parametrize("gpus, text", [(0, "no NVIDIA GPUs visible"), (1, "1 NVIDIA GPU visible"),
                                        (8, "8 NVIDIA GPUs visible")])
def test_the_accelerator_line_counts_gpus_in_words(gpus, text):
    line = doctor.check_accelerator({"cuda": "12.8", "hip": None}, gpus, environ={})["detail"]
    assert text in line and "(s)" not in line, line
