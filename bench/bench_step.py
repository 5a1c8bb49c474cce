"""Per-step cost of the shim: plain DeepSpeed vs ``compat.install()`` on a launch-bound step, same run.

    python bench/bench_step.py [--stages 0,1,2,3] [--steps 200] [--reps 9] [--profile STAGE]

The model is 2 x Linear(8, 8) on one CPU rank (a gloo world of 1, ``DS_ACCELERATOR=cpu``): a step
is nothing but launches and Python, what a GPU step of a small or well-overlapped model is made of,
so any per-step work of the shim shows. For each ZeRO stage one process builds a plain engine (shim
uninstalled) and a shim engine (shim installed), warms both up, then alternates blocks of
``--steps`` steps (forward, backward, step) between them, ``--reps`` times (the order flips every
repetition; the shim is installed for the shim's blocks only, uninstalled for the plain ones, and
each block follows ``WARM`` untimed steps: installing resets the call-site caches of the legacy
getters, a one-time cost a training run pays once, not per block).
Prints, per stage, the median microseconds per step of each and shim / plain per repetition as
min / median / max, by wall clock and by this thread's CPU time (the step is CPU work: its CPU
time is what the shim adds, and it is far less disturbed by other processes on a shared machine).

``--profile STAGE`` instead runs cProfile over the shim's and the plain engine's steps of that stage
and prints the functions the shim adds (compat / mesh_core / wrapt frames), by own time.
"""
from __future__ import annotations

import argparse
import warnings
import contextlib
import gc
import io
import logging
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1")


SHIM_FIRST = os.environ.get("BENCH_SHIM_FIRST") == "1"
WARM = 10  # untimed steps after each switch between plain and shim


def config(stage: int) -> dict:
    return {"train_micro_batch_size_per_gpu": 4, "steps_per_print": 10**9,
            "optimizer": {"type": "Adam", "params": {"lr": 1e-3, "torch_adam": True}},
            "zero_optimization": {"stage": stage}, "wall_clock_breakdown": False}


def set_shim(on: bool) -> None:
    import compat.install as installer

    (installer.install if on else installer.uninstall)()


def build(stage: int, shim: bool):
    import torch

    import deepspeed

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


def measure(stage: int, n: int, reps: int) -> dict:
    import torch

    if SHIM_FIRST:
        shim, plain = build(stage, True), build(stage, False)
    else:
        plain, shim = build(stage, False), build(stage, True)
    x = torch.randn(4, 8)
    for shimmed, engine in ((False, plain), (True, shim)):
        set_shim(shimmed)
        steps(engine, x, max(20, n // 4))  # warm-up
    times: dict[str, list[tuple[float, float]]] = {"plain": [], "shim": []}
    for rep in range(reps):
        order = (("plain", plain), ("shim", shim)) if rep % 2 == 0 else (("shim", shim), ("plain", plain))
        for mode, engine in order:
            set_shim(mode == "shim")
            steps(engine, x, WARM)  # untimed: what (un)installing resets (call-site caches) refills here
            times[mode].append(steps(engine, x, n))
    set_shim(False)
    for engine in (plain, shim):
        engine.destroy()
    return times


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
        own[mode] = {f"{os.path.relpath(k[0], ROOT) if k[0].startswith(ROOT) else k[0]}:{k[1]}({k[2]})": v
                     for k, v in stats.items()}
    set_shim(False)
    print(f"ZeRO-{stage}: {n} steps, per step: plain {sum(v[2] for v in own['plain'].values()) / n * 1e6:.0f} us, "
          f"shim {sum(v[2] for v in own['shim'].values()) / n * 1e6:.0f} us (profiled)")
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
    parser.add_argument("--steps", type=int, default=200, help="steps per timed block")
    parser.add_argument("--reps", type=int, default=9, help="alternated blocks of each")
    parser.add_argument("--profile", type=int, default=None, metavar="STAGE")
    args = parser.parse_args()
    warnings.filterwarnings("ignore", category=FutureWarning)  # torch's per-call deprecation notes (ZeRO-3)
    import deepspeed

    import compat  # noqa: F401

    sys.modules["deepspeed.comm.torch"].build_shm_op = lambda: None  # skip the shm op's JIT build
    with socket_port() as port:
        os.environ["MASTER_PORT"] = str(port)
    deepspeed.init_distributed(dist_backend="gloo")
    logging.getLogger("DeepSpeed").setLevel(logging.WARNING)
    if args.profile is not None:
        profile(args.profile, args.steps)
        return
    print(f"2 x Linear(8, 8), 1 CPU rank (gloo), Adam; {args.reps} alternated blocks of {args.steps} steps each; "
          "us/step: medians; shim/plain per block pair: min / median / max")
    print(f"{'stage':>6} {'clock':>6} {'plain us/step':>14} {'shim us/step':>13} {'shim/plain min':>15} {'median':>7} {'max':>6}")
    for stage in (int(s) for s in args.stages.split(",")):
        times = measure(stage, args.steps, args.reps)
        for i, clock in enumerate(("wall", "cpu")):
            plain = [t[i] for t in times["plain"]]
            shim = [t[i] for t in times["shim"]]
            ratios = sorted(s / p for s, p in zip(shim, plain))
            print(f"{stage:>6} {clock:>6} {statistics.median(plain) * 1e6:>14.0f} {statistics.median(shim) * 1e6:>13.0f} "
                  f"{ratios[0]:>15.3f} {statistics.median(ratios):>7.3f} {ratios[-1]:>6.3f}", flush=True)


@contextlib.contextmanager
def socket_port():
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield sock.getsockname()[1]


if __name__ == "__main__":
    main()
