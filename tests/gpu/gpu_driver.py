"""The part-by-part driver of tools/gpu_check.sh: one torchrun of tests/gpu/nccl_checks.py per part,
each under its own bound (:data:`gpu_world.SPECS`), each reported as one JSON line as soon as it ends,
so a hang names its part and the later parts still run.

Per part: its world (bound where DeepSpeed binds, or unbound), the timeout of its world and groups
inside its bound, ``NCCL_ALGO=Ring NCCL_NVLS_ENABLE=0`` where it compares plain DeepSpeed with the
shim bit for bit. A part that outlives its bound is killed and reported ``"ok": false`` with
``"hung": true``, the tail of its log and the ranks that had not finished. Killed means torchrun's
process group *and* every rank's: torch elastic starts each rank in a session of its own
(``start_new_session=True``), so a signal to torchrun's group leaves the ranks running, holding their
GPU memory and communicators while the next parts run; the ranks are found by their command line
(the part's directory) and ``"left_alive"`` lists any that outlived the kill.

usage: gpu_driver.py OUT_DIR WORLD [--dry] [PART ...]   (default: every part but the self-test)
Prints one JSON line per part, then a summary table; exits 1 when a part failed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from typing import Optional

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import gpu_world  # noqa: E402

LOG_TAIL = 3000
KILL_WAIT_S = 30.0


def part_processes(part_dir: str) -> list[int]:
    """Processes of a part: those whose command line names its directory (torchrun and every rank)."""
    marker = os.path.abspath(part_dir).encode()
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as fh:
                    argv = fh.read().split(b"\0")
            except OSError:
                continue
            if marker in argv:
                pids.append(int(entry))
    return sorted(pids)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has exited
    except OSError:
        return False


def kill_part(proc: subprocess.Popen, part_dir: str) -> list[int]:
    """SIGKILL torchrun's process group and each rank's own (their sessions), scanning again until a
    scan finds none alive (a rank torchrun was starting when it died appears after the first scan);
    the pids still alive after :data:`KILL_WAIT_S` (none when the kill worked)."""

    def kill(pid: int) -> None:
        for signal_to in (lambda p: os.killpg(os.getpgid(p), signal.SIGKILL), lambda p: os.kill(p, signal.SIGKILL)):
            try:
                signal_to(pid)
            except (ProcessLookupError, PermissionError):
                pass

    kill(proc.pid)
    proc.wait()
    deadline = time.monotonic() + KILL_WAIT_S
    quiet_scans = 0
    while True:
        left = [pid for pid in part_processes(part_dir) if _alive(pid)]
        for pid in left:
            kill(pid)
        quiet_scans = 0 if left else quiet_scans + 1
        if quiet_scans == 3 or time.monotonic() > deadline:
            return [pid for pid in left if _alive(pid)]
        time.sleep(0.2)  # a SIGKILLed rank is reaped, or a rank being started shows up


def default_parts() -> list[str]:
    return [name for name, spec in gpu_world.SPECS.items() if not spec.selftest]


def part_env(name: str, dry: bool, base: Optional[dict] = None) -> dict:
    """The environment of one part's torchrun."""
    spec = gpu_world.SPECS[name]
    env = dict(os.environ if base is None else base)
    env["MESH_GPU_GROUP_TIMEOUT_S"] = str(gpu_world.group_timeout_s(spec))
    if spec.compares and not dry:
        env.update(gpu_world.COMPARE_ENV)
    return env


def run_part(name: str, out_dir: str, world: int, dry: bool, python: str = sys.executable) -> dict:
    """Run one part under its bound; its JSON line (a dict)."""
    spec = gpu_world.SPECS[name]
    why = gpu_world.nothing_to_run(spec, world, dry)
    if why:
        return {
            "part": name,
            "bound_s": spec.bound_s,
            "seconds": 0.0,
            "world_kind": spec.world,
            "ok": True,
            "skipped": why,
            "world": world,
        }
    part_dir = os.path.join(out_dir, name)
    os.makedirs(part_dir, exist_ok=True)
    log_path = os.path.join(part_dir, "run.log")
    cmd = [
        python,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={world}",
        os.path.join(HERE, "nccl_checks.py"),
        part_dir,
        name,
    ]
    env = part_env(name, dry)
    start = time.monotonic()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc: Optional[int] = proc.wait(timeout=spec.bound_s)
        except subprocess.TimeoutExpired:
            rc = None
            left_alive = kill_part(proc, part_dir)  # torchrun and every rank it started
    seconds = round(time.monotonic() - start, 1)
    line: dict = {"part": name, "bound_s": spec.bound_s, "seconds": seconds, "world_kind": spec.world}
    if spec.compares and not dry:
        line["nccl_env"] = dict(gpu_world.COMPARE_ENV)
    ranks = {}
    for r in range(world):
        path = os.path.join(part_dir, f"{name}.rank{r}.json")
        if os.path.exists(path):
            with open(path) as fh:
                ranks[r] = json.load(fh)
    with open(log_path) as fh:
        tail = fh.read()[-LOG_TAIL:]
    if rc is None:
        line.update(
            ok=False,
            hung=True,
            error=f"no result within its {spec.bound_s} s bound (killed): it hung or was too slow",
            unfinished_ranks=sorted(set(range(world)) - set(ranks)),
            left_alive=left_alive,
            log_tail=tail,
        )
        return line
    if len(ranks) < world or rc != 0:
        line.update(
            ok=False,
            error=f"torchrun exit {rc}; ranks without a result: {sorted(set(range(world)) - set(ranks))}",
            log_tail=tail,
        )
        if ranks:
            line["ranks"] = {r: rec["result"] for r, rec in ranks.items()}
        return line
    results = {r: rec["result"] for r, rec in ranks.items()}
    skipped = sorted({res.get("skipped") for res in results.values()} - {None})
    line["ok"] = all(res["ok"] for res in results.values())
    if skipped:
        line["skipped"] = "; ".join(skipped)
    first = ranks[0]
    line.update(torch=first["torch"], gpu=first["gpu"], world=first["world"], world_bound=first["world_bound"])
    line["ranks"] = results if not line["ok"] else {0: results[0]}
    return line


def state(line: dict) -> str:
    if not line["ok"]:
        return "HUNG" if line.get("hung") else "FAILED"
    return f"skipped: {line['skipped']}" if line.get("skipped") else "ok"


def main(argv: list[str]) -> int:
    out_dir, world = argv[0], int(argv[1])
    dry = "--dry" in argv[2:]
    parts = [a for a in argv[2:] if a != "--dry"] or default_parts()
    unknown = sorted(set(parts) - set(gpu_world.SPECS))
    if unknown:
        print(f"unknown parts {unknown}; the parts are {default_parts()}", file=sys.stderr)
        return 2
    lines = []
    with open(os.path.join(out_dir, "parts.jsonl"), "a") as report:
        for name in parts:
            line = run_part(name, out_dir, world, dry)
            lines.append(line)
            text = json.dumps(line)
            print(text, flush=True)
            report.write(text + "\n")
    print()
    for line in lines:
        print(f"{line['part']:18} {state(line)}  ({line['seconds']} s of {line['bound_s']} s)")
    hook = next((rec.get("startup_hook_installed_the_shim") for rec in _first_records(out_dir, lines)), None)
    print(f"start-up hook installed the shim: {hook}")
    return 0 if all(line["ok"] for line in lines) else 1


def _first_records(out_dir: str, lines: list[dict]):
    for line in lines:
        path = os.path.join(out_dir, line["part"], f"{line['part']}.rank0.json")
        if os.path.exists(path):
            with open(path) as fh:
                yield json.load(fh)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
