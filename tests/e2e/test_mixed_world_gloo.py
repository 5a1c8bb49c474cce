"""Half the ranks on the shim, half plain DeepSpeed (one node without ``DS_MESH``): 4 gloo ranks
started as a node's launcher starts them, ranks 0..1 with ``DS_MESH=1`` and the start-up hook (a
``ds_mesh.pth`` on a private site directory), ranks 2..3 without, all running the same unchanged
AutoTP (tp=2) or pipeline (pp=2) script. Every shim rank fails with one error naming the missing
ranks and ``DS_MESH``; every rank has exited within the process-group timeout plus 30 s of the
moment the last rank's process group was up (a hang guard: the test kills what is left and fails).
With a 10-minute process-group timeout and ``DS_MESH_AGREE_TIMEOUT=5``, one rank without ``DS_MESH``
(rank 0, the store's, or another) is named by every shim rank after the shim's own bound.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from compat import startup

pytestmark = [pytest.mark.multiprocess, pytest.mark.deepspeed]

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).with_name("mixed_world.py")
WORLD = 4
SHIM_RANKS = (0, 1)
GRACE_S = 30  # after the process-group timeout
START_S = 240  # importing deepspeed on 4 processes of a loaded 2-core machine


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_mixed(
    tmp_path: Path,
    job: str,
    timeout_s: int,
    shim_ranks: tuple[int, ...] = SHIM_RANKS,
    wait_for: "tuple[int, ...] | None" = None,
    delays: "dict[int, float] | None" = None,
    world: int = WORLD,
    agree_s: "float | None" = None,
    deadline_s: "float | None" = None,
) -> list[dict]:
    """Run the job on ``world`` ranks with ``DS_MESH=1`` on ``shim_ranks`` (rank r starting its job
    ``delays[r]`` s late; ``DS_MESH_AGREE_TIMEOUT=agree_s`` where given); fail unless the ranks
    ``wait_for`` (default: all) have exited within ``deadline_s`` (default: the process-group timeout
    plus :data:`GRACE_S`) of the moment the last rank's process group was up (the others are killed then)."""
    wait_for = tuple(range(world)) if wait_for is None else wait_for
    deadline_s = timeout_s + GRACE_S if deadline_s is None else deadline_s
    site, hook = tmp_path / "site", tmp_path / "hook"
    site.mkdir()
    hook.mkdir()
    startup.write_pth(str(site))
    (hook / "sitecustomize.py").write_text(f"import site\nsite.addsitedir({str(site)!r})\n")
    base = {k: v for k, v in os.environ.items() if not k.startswith(("DS_MESH", "DS_LOG"))}
    base.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(_free_port()),
        WORLD_SIZE=str(world),
        DS_ACCELERATOR="cpu",
        OMP_NUM_THREADS="1",
    )
    if agree_s is not None:
        base["DS_MESH_AGREE_TIMEOUT"] = str(agree_s)
    procs = []
    for rank in range(world):
        env = dict(base, RANK=str(rank), LOCAL_RANK=str(rank), PYTHONPATH=str(ROOT))
        if rank in shim_ranks:
            env.update(DS_MESH="1", PYTHONPATH=os.pathsep.join([str(hook), str(ROOT)]))
        log = open(tmp_path / f"rank{rank}.log", "w")
        delay = str((delays or {}).get(rank, 0.0))
        procs.append(
            (
                subprocess.Popen(
                    [sys.executable, str(SCRIPT), job, str(timeout_s), str(tmp_path / f"up{rank}"), delay],
                    cwd=str(tmp_path),
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                ),
                log,
            )
        )
    marks = [tmp_path / f"up{rank}" for rank in range(world)]
    start_deadline = time.time() + START_S
    deadline = None
    try:
        while any(procs[r][0].poll() is None for r in wait_for):
            if deadline is None and all(m.exists() and m.read_text() for m in marks):
                deadline = max(float(m.read_text()) for m in marks) + deadline_s
            if time.time() > (deadline or start_deadline):
                when = f"{deadline_s} s after the world was up" if deadline else "before the world was up"
                alive = [r for r in wait_for if procs[r][0].poll() is None]
                pytest.fail(f"ranks {alive} still running {when}:\n" + _logs(tmp_path, world))
            time.sleep(0.5)
    finally:
        for p, log in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
            log.close()
    assert deadline is not None, "a rank ended before its process group was up:\n" + _logs(tmp_path, world)
    return [{"rc": p.returncode, "log": (tmp_path / f"rank{r}.log").read_text()} for r, (p, _) in enumerate(procs)]


def _logs(tmp_path: Path, world: int = WORLD) -> str:
    return "\n".join(f"--- rank {r}\n" + (tmp_path / f"rank{r}.log").read_text()[-3000:] for r in range(world))


def _check(
    results: list[dict], shim_ranks: tuple[int, ...] = SHIM_RANKS, missing: "dict[int, str] | None" = None
) -> None:
    """Every shim rank names the plain ranks (``missing[r]``: what rank r saw missing, default the
    plain ranks) as never having run ds-mesh, and DS_MESH."""
    plain = sorted(set(range(WORLD)) - set(shim_ranks))
    text = f"{plain[0]}..{plain[-1]}"
    for rank in shim_ranks:
        log = results[rank]["log"]
        errors = re.findall(r"^(?:\[rank\d\]: )?(\S*AbsentRanksError): (.*)$", log, re.M)
        assert len(errors) == 1, f"rank {rank}: expected one AbsentRanksError:\n{log[-4000:]}"
        message = errors[0][1]
        seen = (missing or {}).get(rank, text)
        assert f"missing: ranks {seen}" in message and f"ranks {text} built no mesh at all" in message, message
        assert f"ranks {text} run DeepSpeed without the ds-mesh shim" in message and "DS_MESH=1 is not set" in message
        assert results[rank]["rc"] != 0
    for rank in plain:
        assert results[rank]["rc"] != 0  # plain DeepSpeed: its groups' peers are gone (a raw error of its own)


def test_autotp_job_with_one_node_off_the_shim_names_the_node_and_ds_mesh(tmp_path):
    _check(run_mixed(tmp_path, "autotp", 10))


@pytest.mark.slow
@pytest.mark.parametrize("job", ["pipe", "autotp"])
def test_with_one_node_off_the_shim_every_job_names_it_within_the_timeout(tmp_path, job):
    _check(run_mixed(tmp_path, job, 20))


@pytest.mark.slow
def test_a_shim_rank_later_than_the_timeout_still_reads_the_verdict_before_the_store_goes(tmp_path):
    """Rank 1 (shim) starts its job 4 s after the timeout: rank 0, which holds the store, gives up first,
    and waits (bounded) for rank 1, which announced itself when its world came up, to read the verdict:
    rank 1 names the missing ranks and DS_MESH too, not just "the store went away"."""
    _check(run_mixed(tmp_path, "autotp", 10, delays={1: 14.0}), missing={0: "1..3"})  # rank 0 gave up before 1 came


@pytest.mark.slow
def test_when_rank_0s_node_is_off_the_shim_the_shim_ranks_still_name_it(tmp_path):
    """The store is held by a plain rank: the shim ranks 2..3 fail in time with the same error. The
    plain ranks wait in plain DeepSpeed's group creation (torch's 30-minute default for a new group:
    nothing of ds-mesh runs there); the test ends them once the shim ranks are done."""
    _check(run_mixed(tmp_path, "autotp", 10, shim_ranks=(2, 3), wait_for=(2, 3)), shim_ranks=(2, 3))


AGREE_S = 5  # the shim's own bound in these tests (60 s by default)
LONG_TIMEOUT_S = 600  # the process-group timeout, far beyond it


@pytest.mark.parametrize(
    "world, shim_ranks",
    [
        (2, (1,)),  # the store's rank (0) forgot DS_MESH
        pytest.param(2, (0,), marks=pytest.mark.slow),
        pytest.param(4, (1, 2, 3), marks=pytest.mark.slow),  # several shim ranks, each names rank 0
    ],
)
def test_a_rank_without_ds_mesh_is_named_within_the_shims_own_bound_not_the_process_group_timeout(
    tmp_path, world, shim_ranks
):
    """One rank without DS_MESH, a 10-minute process-group timeout: every shim rank names the plain one
    after DS_MESH_AGREE_TIMEOUT (5 s here), also when the plain rank is rank 0, whose process holds the
    store. The run fails unless the shim ranks have exited well before the process-group timeout (their
    start-up, the bound and a grace), and each message says which wait ran out. The plain rank runs no
    ds-mesh code: the test ends it (docs/multinode.md says what bounds it)."""
    (plain,) = set(range(world)) - set(shim_ranks)
    arrived = f"rank {shim_ranks[0]}" if len(shim_ranks) == 1 else f"ranks {shim_ranks[0]}..{shim_ranks[-1]}"
    results = run_mixed(
        tmp_path,
        "autotp",
        LONG_TIMEOUT_S,
        shim_ranks=shim_ranks,
        wait_for=shim_ranks,
        world=world,
        agree_s=AGREE_S,
        deadline_s=AGREE_S + 3 * GRACE_S,
    )
    for rank in shim_ranks:
        log = results[rank]["log"]
        errors = re.findall(r"^(?:\[rank\d\]: )?(\S*AbsentRanksError): (.*)$", log, re.M)
        assert len(errors) == 1 and results[rank]["rc"] != 0, log[-4000:]
        message = errors[0][1]
        assert (
            f"started checking it within 0:00:05 (arrived: {arrived}; missing: rank {plain}; rank {plain} "
            "built no mesh at all in this world); the missing rank builds a different mesh (or none), or has "
            "started no mesh within 0:00:05"
        ) in message, message
        assert "up to the process-group timeout, 0:10:00" in message, message
        assert (
            f"Likely cause: rank {plain} runs DeepSpeed without the ds-mesh shim (it has built no mesh in this "
            "world, and did not say within 5 s that it runs the shim; DS_MESH_AGREE_TIMEOUT sets that wait: raise "
            "it if it does run the shim but starts far later than the others): DS_MESH=1 is not set in its "
            "environment, the start-up hook is not installed on its node, or the shim could not be installed "
            "there"
        ) in message, message
