"""Per-step cost of the shim: plain DeepSpeed vs ``compat.install()`` on a launch-bound step, same run.

    python bench/bench_step.py [--stages 0,1,2,3] [--pairs 7] [--blocks 9] [--steps 50] [--profile STAGE]
    python bench/bench_step.py --interleave 4 [--blocks 40] [--probing]

The model is 2 x Linear(8, 8) on one CPU rank (a gloo world of 1, ``DS_ACCELERATOR=cpu``): a step
is nothing but launches and Python, what a GPU step of a small or well-overlapped model is made of,
so any per-step work of the shim shows. The run alternates child processes, plain (the shim never
installed) and shim (``compat.install()`` once, before ``import deepspeed``, as ``DS_MESH=1``
does), ``--pairs`` times (the order flips every pair). Each child builds one engine per ZeRO stage,
runs 50 untimed steps, then ``--blocks`` blocks of ``--steps`` steps (forward, backward, step) and
reports each block's wall and CPU time (this thread's: the step is CPU work, and its CPU time is far
less disturbed by other processes on a shared machine). Per stage it prints the median microseconds
per step of each mode and shim / plain per pair as min / median / max, from each child's median
block (wall, cpu) and from its fastest block (cpu-min: the least disturbed one, when other work
shares the machine).

``--interleave K`` instead alternates the modes inside each of K child processes (the build order
flips every child): per stage a plain engine built and stepped with the shim uninstalled and a shim
engine built and stepped with it installed, ``--blocks`` blocks of each taken in turn (each after a
few untimed steps in its mode). It prints shim / plain over every neighbouring pair of blocks, min /
median / max: what differs between child processes (memory layout, the machine's load at that
minute) is common to both sides of a pair, so this resolves far smaller costs than the child pairs.

The shim runs in its steady state: its hot getters have stopped probing their call sites for the
deprecation warning (they do on their first ``compat.deprecation.HOT_PROBES`` calls after a
warnings-filter change; this bench's re-installs change the filters). ``--probing`` keeps probing on.

``--profile STAGE`` instead runs cProfile, in one process, over the plain and the shim engine's
steps of that stage (the shim installed for the shim's steps only) and prints the functions whose
call count or own time the shim adds.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import io
import logging
import os
import shutil
import statistics
import sys
import time
import warnings

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1")


# every child gets the same string hashes and, where setarch can turn address randomisation off, the
# same memory layout: what differs between two children of one mode is then the machine, not the process
_CHILD_ENV = {**os.environ, "PYTHONHASHSEED": "0"}
_SAME_LAYOUT = ["setarch", os.uname().machine, "-R"] if shutil.which("setarch") else []


def config(stage: int) -> dict:
    return {
        "train_micro_batch_size_per_gpu": 4,
        "steps_per_print": 10**9,
        "optimizer": {"type": "Adam", "params": {"lr": 1e-3, "torch_adam": True}},
        "zero_optimization": {"stage": stage},
        "wall_clock_breakdown": False,
    }


KEEP_PROBING = [False]  # --probing


def set_shim(on: bool) -> None:
    import compat.install as installer
    from compat.deprecation import end_probing

    (installer.install if on else installer.uninstall)()
    if on and not KEEP_PROBING[0]:
        # a run installs once, and its hot getters stop probing call sites after their first HOT_PROBES
        # calls; this bench re-installs (a warnings-filter change, which re-arms them) at every switch
        end_probing()


def build(stage: int, shim: bool):
    import deepspeed
    import torch

    set_shim(shim)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8))
    with contextlib.redirect_stdout(io.StringIO()):
        engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config(stage))
    return engine


def steps(engine, x, n: int) -> tuple[float, float]:
    """Wall and CPU (this thread's) seconds per step over ``n`` steps."""
    gc.collect()
    start, cpu = time.perf_counter(), time.thread_time()
    for _ in range(n):
        loss = engine(x).pow(2).mean()
        engine.backward(loss)
        engine.step()
    return (time.perf_counter() - start) / n, (time.thread_time() - cpu) / n


def child(shim: bool, stages: list[int], n: int, blocks: int) -> dict:
    """One mode in this process: per stage, every block's (wall, cpu) seconds per step."""
    import torch

    out = {}
    for stage in stages:
        engine = build(stage, shim)
        x = torch.randn(4, 8)
        steps(engine, x, 50)  # warm-up
        out[str(stage)] = [steps(engine, x, n) for _ in range(blocks)]
        engine.destroy()
    return out


def interleaved(shim_first: bool, stages: list[int], n: int, blocks: int) -> dict:
    """Both modes in this process: per stage, ``blocks`` (plain, shim) pairs of CPU seconds per step."""
    import torch

    order = ("shim", "plain") if shim_first else ("plain", "shim")
    out = {}
    for stage in stages:
        engines = {mode: build(stage, mode == "shim") for mode in order}
        x = torch.randn(4, 8)
        for mode in order:
            set_shim(mode == "shim")
            steps(engines[mode], x, 50)  # warm-up
        pairs = []
        for block in range(blocks):
            timed = {}
            for mode in order if block % 2 == 0 else order[::-1]:
                set_shim(mode == "shim")
                steps(engines[mode], x, 5)  # the first steps after a switch pay for cold caches
                timed[mode] = steps(engines[mode], x, n)[1]
            pairs.append((timed["plain"], timed["shim"]))
        for mode in order:
            set_shim(mode == "shim")
            engines[mode].destroy()
        out[str(stage)] = pairs
    set_shim(False)
    return out


def run_interleaved(stages: list[int], children: int, n: int, blocks: int) -> list[dict]:
    import json
    import subprocess

    runs = []
    for child_index in range(children):
        cmd = [
            sys.executable,
            os.path.abspath(__file__),
            "--child",
            "both-shim-first" if child_index % 2 else "both",
            "--stages",
            ",".join(map(str, stages)),
            "--steps",
            str(n),
            "--blocks",
            str(blocks),
            *["--probing"] * KEEP_PROBING[0],
        ]
        proc = subprocess.run([*_SAME_LAYOUT, *cmd], capture_output=True, text=True, timeout=1800, env=_CHILD_ENV)
        if proc.returncode != 0:
            raise SystemExit(f"interleaved child failed:\n{proc.stderr[-3000:]}")
        runs.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    return runs


def report_interleaved(runs: list[dict], stages: list[int], args: argparse.Namespace) -> None:
    print(
        f"2 x Linear(8, 8), 1 CPU rank (gloo), Adam; {args.interleave} child processes, each alternating {args.blocks} "
        f"plain / shim blocks of {args.steps} steps per stage (CPU time of the stepping thread); shim/plain over "
        "every neighbouring pair of blocks: min / median / max"
    )
    print("per child: its shim median block / its plain median block, min / median / max over children")
    print(
        f"{'stage':>6} {'plain us/step':>14} {'shim us/step':>13} {'shim/plain min':>15} {'median':>7} {'max':>6} "
        f"{'pairs':>6} {'per child min':>14} {'median':>7} {'max':>6}"
    )
    for stage in stages:
        pairs = [pair for run in runs for pair in run[str(stage)]]
        ratios = sorted(s / p for p, s in pairs)
        per_child = sorted(
            statistics.median(s for _, s in run[str(stage)]) / statistics.median(p for p, _ in run[str(stage)])
            for run in runs
        )
        print(
            f"{stage:>6} {statistics.median(p for p, _ in pairs) * 1e6:>14.0f} "
            f"{statistics.median(s for _, s in pairs) * 1e6:>13.0f} {ratios[0]:>15.3f} "
            f"{statistics.median(ratios):>7.3f} {ratios[-1]:>6.3f} {len(ratios):>6} {per_child[0]:>14.3f} "
            f"{statistics.median(per_child):>7.3f} {per_child[-1]:>6.3f}",
            flush=True,
        )


def alternate(stages: list[int], pairs: int, n: int, blocks: int) -> dict:
    """Plain and shim children alternated ``pairs`` times: per mode, per pair, each child's result."""
    import json
    import subprocess

    runs: dict[str, list[dict]] = {"plain": [], "shim": []}
    for pair in range(pairs):
        for mode in ("plain", "shim") if pair % 2 == 0 else ("shim", "plain"):
            cmd = [
                *_SAME_LAYOUT,
                sys.executable,
                os.path.abspath(__file__),
                "--child",
                mode,
                "--stages",
                ",".join(map(str, stages)),
                "--steps",
                str(n),
                "--blocks",
                str(blocks),
                *["--probing"] * KEEP_PROBING[0],
            ]
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=_CHILD_ENV)
            if proc.returncode != 0:
                raise SystemExit(f"{mode} child failed:\n{proc.stderr[-3000:]}")
            runs[mode].append(json.loads(proc.stdout.strip().splitlines()[-1]))
    return runs


def profile(stage: int, n: int) -> None:
    import cProfile
    import pstats

    import torch

    plain, shim = build(stage, False), build(stage, True)
    x = torch.randn(4, 8)
    own: dict[str, dict] = {}
    for mode, engine in (("plain", plain), ("shim", shim)):
        set_shim(mode == "shim")
        steps(engine, x, 50)
        prof = cProfile.Profile()
        prof.enable()
        steps(engine, x, n)
        prof.disable()
        stats = pstats.Stats(prof).stats  # (file, line, name) -> (cc, nc, tottime, cumtime, callers)
        own[mode] = {
            f"{os.path.relpath(k[0], ROOT) if k[0].startswith(ROOT) else k[0]}:{k[1]}({k[2]})": v
            for k, v in stats.items()
        }
    set_shim(False)
    print(
        f"ZeRO-{stage}: {n} steps, per step: plain {sum(v[2] for v in own['plain'].values()) / n * 1e6:.0f} us, "
        f"shim {sum(v[2] for v in own['shim'].values()) / n * 1e6:.0f} us (profiled)"
    )
    rows = []
    for key, (cc, nc, tt, ct, _) in own["shim"].items():
        base = own["plain"].get(key)
        extra_calls = nc - (base[1] if base else 0)
        extra_tt = tt - (base[2] if base else 0)
        if extra_calls > 0 or (base is None):
            rows.append((extra_tt, extra_calls / n, ct / n, key))
    rows.sort(reverse=True)
    print(f"{'own us/step added':>18} {'calls/step added':>17} {'cum us/step':>12}  function")
    for extra_tt, calls, ct, key in rows[:40]:
        print(f"{extra_tt / n * 1e6:18.1f} {calls:17.1f} {ct * 1e6:12.1f}  {key}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stages", default="0,1,2,3")
    parser.add_argument("--pairs", type=int, default=7, help="plain / shim child processes alternated")
    parser.add_argument("--blocks", type=int, default=9, help="timed blocks per stage in each child")
    parser.add_argument("--steps", type=int, default=50, help="steps per timed block")
    parser.add_argument(
        "--interleave",
        type=int,
        default=0,
        metavar="K",
        help="K child processes, each alternating plain and shim blocks (see above)",
    )
    parser.add_argument("--profile", type=int, default=None, metavar="STAGE")
    parser.add_argument(
        "--probing",
        action="store_true",
        help="keep the hot getters' call-site probing on (a run's first HOT_PROBES calls)",
    )
    parser.add_argument("--child", choices=("plain", "shim", "both", "both-shim-first"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    stages = [int(s) for s in args.stages.split(",")]
    KEEP_PROBING[0] = args.probing
    if args.child is None and args.profile is None:
        if args.interleave:
            report_interleaved(run_interleaved(stages, args.interleave, args.steps, args.blocks), stages, args)
        else:
            report(alternate(stages, args.pairs, args.steps, args.blocks), stages, args)
        return
    warnings.filterwarnings("ignore", category=FutureWarning)  # torch's per-call deprecation notes (ZeRO-3)
    if args.child != "plain":
        import compat  # noqa: F401  (the shim child installs it below, before deepspeed is imported)
    if args.child == "shim":
        set_shim(True)
    import deepspeed

    sys.modules["deepspeed.comm.torch"].build_shm_op = lambda: None  # skip the shm op's JIT build
    with socket_port() as port:
        os.environ["MASTER_PORT"] = str(port)
    deepspeed.init_distributed(dist_backend="gloo")
    logging.getLogger("DeepSpeed").setLevel(logging.WARNING)
    if args.profile is not None:
        profile(args.profile, args.steps)
        return
    import json

    if args.child in ("both", "both-shim-first"):
        print(json.dumps(interleaved(args.child == "both-shim-first", stages, args.steps, args.blocks)))
        return
    print(json.dumps(child(args.child == "shim", stages, args.steps, args.blocks)))


def report(runs: dict, stages: list[int], args: argparse.Namespace) -> None:
    print(
        f"2 x Linear(8, 8), 1 CPU rank (gloo), Adam; {args.pairs} plain/shim child pairs, {args.blocks} blocks of "
        f"{args.steps} steps per stage each; us/step: medians over children of each child's median block "
        "(cpu-min: of its fastest block); shim/plain per pair: min / median / max"
    )
    print(
        f"{'stage':>6} {'clock':>6} {'plain us/step':>14} {'shim us/step':>13} {'shim/plain min':>15} {'median':>7} {'max':>6}"
    )
    for stage in stages:
        for clock, i, pick in (("wall", 0, statistics.median), ("cpu", 1, statistics.median), ("cpu-min", 1, min)):
            per_run = {mode: [pick(block[i] for block in run[str(stage)]) for run in runs[mode]] for mode in runs}
            ratios = sorted(s / p for s, p in zip(per_run["shim"], per_run["plain"]))
            print(
                f"{stage:>6} {clock:>6} {statistics.median(per_run['plain']) * 1e6:>14.0f} "
                f"{statistics.median(per_run['shim']) * 1e6:>13.0f} {ratios[0]:>15.3f} {statistics.median(ratios):>7.3f} "
                f"{ratios[-1]:>6.3f}",
                flush=True,
            )


@contextlib.contextmanager
def socket_port():
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield sock.getsockname()[1]


if __name__ == "__main__":
    main()
