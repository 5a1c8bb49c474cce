"""examples/rl_two_jobs: a 4-rank ZeRO-3 trainer job and a 2-rank tp=2 rollout job launched
separately (gloo, CPU), joined only by the weight link's address.

- run.sh as a user runs it: 3 syncs, each rollout rank's shard bit-identical to the trainer's
  gathered weights every time;
- the rollout job killed after its first sync: every trainer rank reports one clear error within
  the timeout + 30 s and goes on training; a relaunched rollout job claims the next sync and gets
  the weights bit for bit.
"""

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

pytestmark = [pytest.mark.multiprocess, pytest.mark.deepspeed]
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLE = os.path.join(ROOT, "examples", "rl_two_jobs")


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env() -> dict:
    return dict(
        os.environ,
        DS_ACCELERATOR="cpu",
        OMP_NUM_THREADS="1",
        PYTHON=sys.executable,
        DS_MESH_LINK_SECRET="e2e",
        PYTHONPATH=ROOT,
    )


def test_run_sh_three_syncs_bit_identical():
    env = dict(_env(), LINK_PORT=str(_port()))
    del env["DS_MESH_LINK_SECRET"]  # run.sh draws one for its two jobs
    proc = subprocess.run(
        ["bash", os.path.join(EXAMPLE, "run.sh")], capture_output=True, text=True, timeout=240, env=env
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    for n in range(3):
        for rank in (0, 1):
            assert re.search(rf"\[rollout rank {rank}\] sync {n}: [0-9.]+ s, 1400 bytes, .* WEIGHTS EQUAL", out), out[
                -4000:
            ]
        for rank in range(4):
            assert re.search(rf"\[trainer rank {rank}\] sync {n}: [0-9.]+ s, 1400 bytes", out)
    assert "WEIGHTS DIFFER" not in out and "FAILED" not in out


class _Job:
    """A torchrun job in its own process group, its output lines timestamped as they come."""

    def __init__(self, script: str, nproc: int, args: list, env: dict) -> None:
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc-per-node={nproc}",
            os.path.join(EXAMPLE, script),
            *args,
        ]
        self.proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True
        )
        self.lines: list = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append((time.monotonic(), line.rstrip("\n")))

    def wait_for(self, pattern: str, count: int, timeout: float) -> list:
        deadline = time.monotonic() + timeout
        ended = None
        while time.monotonic() < deadline and (ended is None or time.monotonic() < ended + 1):
            hits = [(t, line) for t, line in list(self.lines) if re.search(pattern, line)]
            if len(hits) >= count:
                return hits
            if ended is None and self.proc.poll() is not None:
                ended = time.monotonic()  # read what it printed last, then give up
            time.sleep(0.2)
        raise AssertionError(f"{count} lines like {pattern!r} not seen; output:\n" + self.text()[-6000:])

    def text(self) -> str:
        return "\n".join(line for _, line in self.lines)

    def kill(self) -> None:
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()


def test_a_killed_rollout_job_is_one_error_per_trainer_rank_and_a_relaunched_one_gets_the_next_sync():
    env = _env()
    link, timeout = f"127.0.0.1:{_port()}", 20
    trainer = _Job("trainer.py", 4, ["--link", link, "--steps", "3", "--timeout", str(timeout)], env)
    first = _Job(
        "rollout.py", 2, ["--link", link, "--syncs", "3", "--timeout", str(timeout), "--generate-seconds", "60"], env
    )  # killed while it generates
    try:
        first.wait_for(r"\[rollout rank \d\] sync 0: .* WEIGHTS EQUAL", 2, 200)
        first.kill()
        killed = time.monotonic()
        failed = trainer.wait_for(r"\[trainer rank \d\] sync after step 1 FAILED: ", 4, timeout + 60)
        assert {line.split("]")[0] for _, line in failed} == {f"[trainer rank {r}" for r in range(4)}
        assert all(t - killed < timeout + 30 for t, _ in failed), [t - killed for t, _ in failed]
        assert len({line.split("FAILED: ")[1] for _, line in failed}) == 1  # one error, the same on every rank
        assert "weight sync 1: no receiving job joined within 0:00:20" in failed[0][1]
        trainer.wait_for(r"\[trainer rank \d\] step 2: loss", 4, 60)  # training went on
        second = _Job("rollout.py", 2, ["--link", link, "--syncs", "1", "--timeout", str(timeout)], env)
        hits = second.wait_for(r"\[rollout rank \d\] sync 2: .* WEIGHTS (EQUAL|DIFFER)", 2, 120)
        assert all("WEIGHTS EQUAL" in line for _, line in hits), second.text()[-3000:]
        assert second.proc.wait(timeout=60) == 0, second.text()[-3000:]
        assert trainer.proc.wait(timeout=120) == 0, trainer.text()[-3000:]
    finally:
        for job in ("trainer", "first", "second"):
            j = locals().get(job)
            if j is not None and j.proc.poll() is None:
                j.kill()
