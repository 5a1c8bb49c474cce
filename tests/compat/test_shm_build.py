"""The first run speaks (compat.shm_build): under the shim, a fresh extensions directory gets the
"building" line before DeepSpeed's shm op build ends, and a stale lock is an error naming it (and
the command that clears it) within seconds instead of a silent wait."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

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
    env.update(PYTHONPATH=ROOT, DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1", TORCH_EXTENSIONS_DIR=extensions,
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(20000 + os.getpid() % 20000), WORLD_SIZE="1", RANK="0",
               LOCAL_RANK="0")
    return subprocess.Popen([sys.executable, "-u", "-c", FIRST_RUN], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)


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
