"""The first run speaks (compat.shm_build): under the shim, a fresh extensions directory gets the
"building" line before DeepSpeed's shm op build ends, a rebuild of a cached op gets it too (with
why), and on torch <= 2.13 (FileBaton) a stale lock is an error naming it (and the command that
clears it) within seconds instead of a silent wait; on torch >= 2.14 (filelock) the lock every build
leaves is no obstacle: a second run after a build runs."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

import _ds_mesh_doctor as doctor
from compat import shm_build

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
pytestmark = [pytest.mark.deepspeed, pytest.mark.torch_releases]

# one rank of a world of one, deepspeed on the shim, as a DS_MESH=1 job's first init_distributed
FIRST_RUN = """
import compat, deepspeed
compat.install()
deepspeed.init_distributed(dist_backend="gloo")
print("INITIALIZED", flush=True)
"""


def _start(extensions: str) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k not in ("DS_MESH", "RANK")}
    env.update(
        PYTHONPATH=ROOT,
        DS_ACCELERATOR="cpu",
        OMP_NUM_THREADS="1",
        TORCH_EXTENSIONS_DIR=extensions,
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(20000 + os.getpid() % 20000),
        WORLD_SIZE="1",
        RANK="0",
        LOCAL_RANK="0",
    )
    return subprocess.Popen(
        [sys.executable, "-u", "-c", FIRST_RUN],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def _stop(proc: subprocess.Popen) -> None:
    """The process and the compilers it started (one session)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=60)


def test_the_first_run_says_what_is_building_before_the_build_ends(tmp_path):
    extensions = tmp_path / "torch_extensions"
    directory = extensions / "deepspeed_shm_comm"
    proc = _start(str(extensions))
    seen = []
    try:
        deadline = time.monotonic() + 240
        for line in proc.stdout:  # read until the line, then stop: the build itself takes minutes
            seen.append(line)
            if "ds-mesh: building DeepSpeed's shared-memory op" in line or time.monotonic() > deadline:
                break
        built_when_said = (directory / "deepspeed_shm_comm.so").exists()
    finally:
        _stop(proc)
    line = seen[-1] if seen else ""
    assert "ds-mesh: building DeepSpeed's shared-memory op deepspeed_shm_comm" in line, "".join(seen)[-3000:]
    assert str(directory) in line and "minutes" in line
    assert not built_when_said


INSTALLED_RULE = doctor.lock_rule(doctor.installed_version("torch"))


@pytest.mark.skipif(INSTALLED_RULE != doctor.BATON, reason="torch <= 2.13 (FileBaton): from 2.14 no lock goes stale")
def test_a_stale_lock_is_named_within_seconds(tmp_path):
    extensions = tmp_path / "torch_extensions"
    directory = extensions / "deepspeed_shm_comm"
    directory.mkdir(parents=True)
    lock = directory / "lock"
    lock.touch()
    hour_ago = time.time() - 3600
    os.utime(lock, (hour_ago, hour_ago))  # a build killed an hour ago left it
    proc = _start(str(extensions))
    try:
        out, _ = proc.communicate(timeout=240)  # the wait it replaces never ends
    finally:
        _stop(proc)
    assert proc.returncode != 0 and "INITIALIZED" not in out
    assert "StaleLockError" in out and f"{lock} is a stale lock" in out, out[-3000:]
    assert f"rm {lock}" in out


def _cached(tmp_path, torch_dir: str):
    """An extensions directory holding the op as a build against ``torch_dir`` left it, with FileLock's lock."""
    directory = tmp_path / "torch_extensions" / "deepspeed_shm_comm"
    directory.mkdir(parents=True)
    (directory / "deepspeed_shm_comm.so").touch()
    (directory / "build.ninja").write_text(f"cflags = -isystem {torch_dir}/include -fPIC\n")
    lock = directory / "lock"
    lock.touch()
    os.utime(lock, (time.time() - 600,) * 2)
    return directory


def _wrapped_in(monkeypatch, directory, torch_version: str):
    monkeypatch.setattr(shm_build, "_jit_directory", lambda: str(directory))
    monkeypatch.setattr(shm_build, "_torch_version", lambda: torch_version)
    monkeypatch.setenv("RANK", "0")
    calls = []
    return shm_build.build_shm_op_wrapper(lambda: calls.append("built") or "op"), calls


@pytest.mark.parametrize("torch_version", ["2.14.1", "2.15.0"])
def test_the_lock_filelock_leaves_does_not_stop_the_next_run(monkeypatch, tmp_path, caplog, torch_version):
    import torch

    directory = _cached(tmp_path, os.path.dirname(torch.__file__))
    build, calls = _wrapped_in(monkeypatch, directory, torch_version)
    with caplog.at_level("WARNING", logger="deepspeed.mesh"):
        assert build() == "op" and calls == ["built"]
    assert not caplog.records  # built: nothing to say


def test_the_same_lock_under_filebaton_is_a_killed_build(monkeypatch, tmp_path):
    import torch

    directory = _cached(tmp_path, os.path.dirname(torch.__file__))
    build, calls = _wrapped_in(monkeypatch, directory, "2.13.0")
    with pytest.raises(shm_build.StaleLockError, match=f"{directory / 'lock'} is a stale lock"):
        build()
    assert calls == []


def test_a_rebuild_is_announced_like_a_first_build(monkeypatch, tmp_path, caplog):
    directory = _cached(tmp_path, "/another/venv/lib/python3.11/site-packages/torch")
    build, calls = _wrapped_in(monkeypatch, directory, "2.14.1")
    with caplog.at_level("WARNING", logger="deepspeed.mesh"):
        build()
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 2 and said[0].startswith(
        f"ds-mesh: rebuilding DeepSpeed's shared-memory op deepspeed_shm_comm in {directory}"
    ), said
    assert "built against the torch in /another/venv/lib/python3.11/site-packages" in said[0]
    assert said[1].startswith("ds-mesh: deepspeed_shm_comm ready after")


def test_a_rebuild_for_another_venv_is_said_before_it_ends(tmp_path):
    """The real build (torch rewrites build.ninja for this environment): the line comes before the library."""
    directory = _cached(tmp_path, "/another/venv/lib/python3.11/site-packages/torch")
    os.unlink(directory / "lock")  # FileBaton (torch <= 2.13) would wait on it
    proc = _start(str(directory.parent))
    seen = []
    try:
        deadline = time.monotonic() + 240
        for line in proc.stdout:
            seen.append(line)
            if "ds-mesh: rebuilding DeepSpeed's shared-memory op" in line or time.monotonic() > deadline:
                break
    finally:
        _stop(proc)
    assert "ds-mesh: rebuilding DeepSpeed's shared-memory op deepspeed_shm_comm" in (seen[-1] if seen else ""), "".join(
        seen
    )[-3000:]


@pytest.mark.slow
@pytest.mark.shm_build
def test_a_run_after_the_build_runs_and_the_doctor_is_ready(tmp_path):
    """Two DS_MESH jobs in a row on one extensions directory: the first builds the op (on torch >= 2.14
    it leaves filelock's empty lock), the second loads it; then ``mesh doctor`` is ready. (Minutes.)"""
    extensions = tmp_path / "torch_extensions"
    lock = extensions / "deepspeed_shm_comm" / "lock"
    outputs = []
    for _ in range(2):
        proc = _start(str(extensions))
        try:
            out, _ = proc.communicate(timeout=900)
        finally:
            _stop(proc)
        outputs.append(out)
        assert proc.returncode == 0 and "INITIALIZED" in out, out[-3000:]
        assert lock.exists() is (INSTALLED_RULE == doctor.FILELOCK)  # what the installed torch's build leaves
    assert "ds-mesh: building DeepSpeed's shared-memory op" in outputs[0]
    assert "ds-mesh: building" not in outputs[1] and "rebuilding" not in outputs[1], outputs[1][-3000:]
    env = {k: v for k, v in os.environ.items() if k != "DS_MESH"}
    env.update(PYTHONPATH=ROOT, DS_ACCELERATOR="cpu", TORCH_EXTENSIONS_DIR=str(extensions))
    doc = subprocess.run(
        [sys.executable, "-m", "mesh_core", "doctor"], env=env, capture_output=True, text=True, timeout=120
    )
    assert "[OK  ] shm op: deepspeed_shm_comm built" in doc.stdout, doc.stdout + doc.stderr
