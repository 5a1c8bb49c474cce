"""The part-by-part driver of tools/gpu_check.sh: one torchrun of tests/gpu/nccl_checks.py per part,
each under its own bound (:data:`gpu_world.SPECS`), each reported as one JSON line as soon as it ends,
so a hang names its part and the later parts still run.

Per part: its world (bound where DeepSpeed binds, or unbound), the timeout of its world and groups
inside its bound, ``NCCL_ALGO=Ring NCCL_NVLS_ENABLE=0`` where it compares plain DeepSpeed with the
shim bit for bit. A part that outlives its bound is killed (its whole process group) and reported
``"ok": false`` with ``"hung": true``, the tail of its log and the ranks that had not finished.

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
        return {"part": name, "bound_s": spec.bound_s, "seconds": 0.0, "world_kind": spec.world, "ok": True,
                "skipped": why, "world": world}
    part_dir = os.path.join(out_dir, name)
    os.makedirs(part_dir, exist_ok=True)
    log_path = os.path.join(part_dir, "run.log")
    cmd = [python, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={world}",
           os.path.join(HERE, "nccl_checks.py"), part_dir, name]
    env = part_env(name, dry)
    start = time.monotonic()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc: Optional[int] = proc.wait(timeout=spec.bound_s)
        except subprocess.TimeoutExpired:
            rc = None
            os.killpg(proc.pid, signal.SIGKILL)  # torchrun and every rank it started
            proc.wait()
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
        line.update(ok=False, hung=True, error=f"no result within its {spec.bound_s} s bound (killed): it hung or "
                    "was too slow", unfinished_ranks=sorted(set(range(world)) - set(ranks)), log_tail=tail)
        return line
    if len(ranks) < world or rc != 0:
        line.update(ok=False, error=f"torchrun exit {rc}; ranks without a result: {sorted(set(range(world)) - set(ranks))}",
                    log_tail=tail)
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
