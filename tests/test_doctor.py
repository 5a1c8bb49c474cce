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
    return subprocess.run(
        [sys.executable, "-c", RUN.format(site=site_dir, no_hook=no_hook, args=list(args))],
        env=env,
        cwd=str(tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
    )


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


INSTALLED_RULE = doctor.lock_rule(doctor.installed_version("torch"))


def left_lock(directory, minutes: float):
    """The ``lock`` a build left ``minutes`` ago: empty and unheld (FileBaton's killed build; FileLock's every build)."""
    lock = directory / "lock"
    lock.touch()
    os.utime(lock, (time.time() - 60 * minutes,) * 2)
    return lock


@pytest.mark.skipif(
    INSTALLED_RULE != doctor.BATON, reason="torch <= 2.13: FileBaton (from 2.14 a lock never goes stale)"
)
def test_a_stale_lock_is_named_with_the_command_that_clears_it(tmp_path, site_dir):
    lock = left_lock(built(tmp_path), 60)
    proc = mesh_doctor(tmp_path, site_dir=site_dir, DS_MESH="1")
    assert proc.returncode == 1
    assert f"[FAIL] shm op: {lock} is a stale lock" in proc.stdout and f"rm {lock}" in proc.stdout
    assert "verdict: NOT READY: fix shm op" in proc.stdout


@pytest.mark.skipif(INSTALLED_RULE != doctor.BATON, reason="torch <= 2.13: FileBaton")
def test_a_lock_of_a_build_that_just_started_is_building(tmp_path, site_dir):
    (built(tmp_path) / "lock").touch()
    proc = mesh_doctor(tmp_path, site_dir=site_dir)
    assert proc.returncode == 0 and "being built now" in proc.stdout, proc.stdout


@pytest.mark.skipif(INSTALLED_RULE != doctor.FILELOCK, reason="torch >= 2.14: filelock")
def test_the_lock_every_build_leaves_is_ready_on_this_torch(tmp_path, site_dir):
    left_lock(built(tmp_path), 10)
    proc = mesh_doctor(tmp_path, site_dir=site_dir, DS_MESH="1")
    assert proc.returncode == 0 and "[OK  ] shm op: deepspeed_shm_comm built" in proc.stdout, proc.stdout


def doctor_on(monkeypatch, tmp_path, torch_version: str) -> tuple[int, str]:
    """``mesh doctor`` in this process, as it runs beside ``torch_version``."""
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "ext"))
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    real = doctor.installed_version
    monkeypatch.setattr(doctor, "installed_version", lambda name: torch_version if name == "torch" else real(name))
    out = io.StringIO()
    return doctor.main([], out=out), out.getvalue()


@pytest.mark.parametrize("torch_version", ["2.14.1", "2.15.0+cu132"])
def test_filelock_leftover_beside_a_built_op_is_ready(monkeypatch, tmp_path, torch_version):
    """torch >= 2.14 builds under filelock.FileLock, which leaves the empty ``lock`` after every build."""
    left_lock(built(tmp_path), 10)
    code, text = doctor_on(monkeypatch, tmp_path, torch_version)
    assert code == 0 and "[OK  ] shm op: deepspeed_shm_comm built" in text and "stale" not in text, text


@pytest.mark.parametrize("torch_version", ["2.14.1", "2.15.0"])
def test_a_held_filelock_is_building_however_old(monkeypatch, tmp_path, torch_version):
    from filelock import FileLock  # what torch >= 2.14's _jit_compile holds around the build

    lock = left_lock(built(tmp_path), 60)
    with FileLock(str(lock)):
        code, text = doctor_on(monkeypatch, tmp_path, torch_version)
    assert code == 0 and f"[OK  ] shm op: deepspeed_shm_comm is being built now (lock {lock}" in text, text
    state = doctor.shm_op_state(str(lock.parent), torch_version=torch_version)
    assert state["state"] == "built" and state["lock_rule"] == doctor.FILELOCK  # released: a lock file, no build


def test_a_killed_filebaton_build_is_still_named(monkeypatch, tmp_path):
    """torch <= 2.13: FileBaton's lock exists only while a build runs, so an old one with no builder is stale."""
    lock = left_lock(built(tmp_path), 10)
    code, text = doctor_on(monkeypatch, tmp_path, "2.13.0")
    assert code == 1 and f"[FAIL] shm op: {lock} is a stale lock" in text and f"rm {lock}" in text, text


@pytest.mark.parametrize(
    "version,rule",
    [
        ("2.6.0", "baton"),
        ("2.13.0+cpu", "baton"),
        ("2.14.0", "filelock"),
        ("2.14.1+cu130", "filelock"),
        ("2.15.0", "filelock"),
        (None, "baton"),
    ],
)
def test_lock_rule(version, rule):
    assert doctor.lock_rule(version) == rule


def ninja_file(directory, torch_dir: str, deepspeed_dir: str) -> None:
    """The ``build.ninja`` torch's JIT build writes for the op (its lines that name torch and the sources)."""
    (directory / "build.ninja").write_text(
        f"cflags = -DTORCH_EXTENSION_NAME=deepspeed_shm_comm -I{deepspeed_dir}/ops/csrc/cpu/includes "
        f"-isystem {torch_dir}/include -isystem {torch_dir}/include/torch/csrc/api/include -fPIC\n"
        f"build shm_interface.o: compile {deepspeed_dir}/ops/csrc/cpu/comm/shm_interface.cpp\n"
        f"build shm.o: compile {deepspeed_dir}/ops/csrc/cpu/comm/shm.cpp\n"
        "build deepspeed_shm_comm.so: link shm_interface.o shm.o\n"
    )


def test_a_build_the_next_run_redoes_is_named(monkeypatch, tmp_path):
    """A cache shared with another venv: its build names another torch, so the next run rebuilds."""
    import deepspeed  # the sources this environment's build compiles
    import torch

    here_torch, here_ds = (os.path.dirname(m.__file__) for m in (torch, deepspeed))
    directory = built(tmp_path)
    ninja_file(directory, here_torch, here_ds)
    os.utime(directory / f"{doctor.SHM_OP}.so")  # built after the sources and torch's headers
    assert doctor.shm_op_state(str(directory))["state"] == "built"
    ninja_file(directory, "/other/venv/lib/python3.11/site-packages/torch", here_ds)
    code, text = doctor_on(monkeypatch, tmp_path, "2.15.0")
    assert code == 0, text
    assert (
        f"[OK  ] shm op: deepspeed_shm_comm is built in {directory} but the next DeepSpeed run on CPU builds it again"
    ) in text
    assert "built against the torch in /other/venv/lib/python3.11/site-packages" in text
    ninja_file(directory, here_torch, "/other/venv/lib/python3.11/site-packages/deepspeed")
    state = doctor.shm_op_state(str(directory))
    assert state["state"] == "rebuild" and "DeepSpeed's sources in /other/venv" in state["rebuild_reason"]
    ninja_file(directory, here_torch, here_ds)
    os.utime(directory / f"{doctor.SHM_OP}.so", (time.time() - 10**9,) * 2)  # older than the sources
    state = doctor.shm_op_state(str(directory))
    assert state["state"] == "rebuild" and "changed after the build" in state["rebuild_reason"]


@pytest.mark.parametrize(
    "version,setting,refused",
    [
        ("2.15.0+cu132", None, True),
        ("2.15.0+cu132", "1", True),
        ("2.15.0+cu132", "0", False),
        ("2.14.1+cu130", None, False),
        ("2.14.1+cu130", "1", True),
        ("2.13.0", "1", False),
    ],
)
def test_a_cuda_job_that_would_get_nccl2_is_named(version, setting, refused):
    environ = (
        {"DS_ACCELERATOR": "cuda"} if setting is None else {"DS_ACCELERATOR": "cuda", "TORCH_DIST_USE_NCCL2": setting}
    )
    check = doctor.check_accelerator({"cuda": "13.2"}, 1, environ, torch_version=version)
    assert (check["status"] == doctor.FAIL) is refused, check
    assert ("set TORCH_DIST_USE_NCCL2=0" in check["detail"]) is refused
    cpu = doctor.check_accelerator({"cuda": "13.2"}, 0, {"DS_ACCELERATOR": "cpu"}, torch_version=version)
    assert cpu["status"] == doctor.OK  # gloo: not concerned


def test_json_read_by_a_reader_that_stops_early(tmp_path, site_dir):
    """``mesh doctor --json | head -1``: the reader is gone before the report is written."""
    built(tmp_path)
    read, write = os.pipe()
    os.close(read)  # every write to the pipe now fails (EPIPE)
    env = {k: v for k, v in os.environ.items() if k not in ("DS_MESH", "TORCH_EXTENSIONS_DIR")}
    env.update(PYTHONPATH=ROOT, DS_ACCELERATOR="cpu", TORCH_EXTENSIONS_DIR=str(tmp_path / "ext"))
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "mesh_core", "doctor", "--json"],
            stdout=write,
            stderr=subprocess.PIPE,
            env=env,
            cwd=str(tmp_path),
            text=True,
            timeout=120,
        )
    finally:
        os.close(write)
    assert proc.stderr == "" and proc.returncode in (0, 1), proc.stderr


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
    assert (
        f"[FAIL] torch: torch 2.5.1 is outside {doctor.supported_range('mesh_core/torch_compat.py')}" in out.getvalue()
    )
    assert "verdict: NOT READY: fix torch" in out.getvalue()


def test_json(tmp_path, site_dir):
    built(tmp_path)
    proc = mesh_doctor(tmp_path, "--json", site_dir=site_dir)
    result = json.loads(proc.stdout[: proc.stdout.rindex("IMPORTED")])
    assert result["ok"] is True and result["verdict"] == "ready"
    assert [c["check"] for c in result["checks"]] == [
        "torch",
        "deepspeed",
        "libcst",
        "start-up hook",
        "accelerator",
        "shm op",
    ]


def test_the_ranges_are_the_enforced_ones():
    from mesh_core import torch_compat

    assert doctor.supported_range("mesh_core/torch_compat.py") == torch_compat.SUPPORTED
    assert doctor.supported_range("compat/releases.py") == releases.SUPPORTED
    with open(os.path.join(ROOT, "pyproject.toml"), encoding="utf-8") as fh:
        assert f'"libcst{doctor.LIBCST}"' in fh.read()


@pytest.mark.parametrize(
    "version,constraint,inside",
    [
        ("2.13.0+cpu", ">=2.6.0,<=2.14.1", True),
        ("2.5.1", ">=2.6.0,<=2.14.1", False),
        ("2.14.2", ">=2.6.0,<=2.14.1", False),
        ("1.10.0", ">=1.5,<1.10", False),
        ("1.9.0", ">=1.5,<1.10", True),
    ],
)
def test_in_range(version, constraint, inside):
    assert doctor.in_range(version, constraint) is inside


@pytest.mark.deepspeed
def test_deep_asks_torch_and_deepspeed(monkeypatch):
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    check = doctor.check_deep()
    assert check["status"] == doctor.OK and check["deepspeed_accelerator"] == "cpu"
    assert check["deepspeed_backend"] in ("gloo", "ccl") and check["torch_cuda_available"] in (True, False)


@pytest.mark.parametrize(
    "gpus, text", [(0, "no NVIDIA GPUs visible"), (1, "1 NVIDIA GPU visible"), (8, "8 NVIDIA GPUs visible")]
)
def test_the_accelerator_line_counts_gpus_in_words(gpus, text):
    line = doctor.check_accelerator({"cuda": "12.8", "hip": None}, gpus, environ={})["detail"]
    assert text in line and "(s)" not in line, line
