"""CPU time and peak memory of migrating one large generated file, against a plain libcst parse +
print of the same file (the floor), alternated, in fresh processes; per MB of source and as a
multiple of the file size, min / median / max over the repeats.

The file repeats a block of ordinary code with legacy sites (groups getters, an ``initialize`` with
``mpu=``, a topology) among unrelated code (f-strings, comments, classes), so that every codemod runs.
``--paths pieces`` is ``migrate_code`` as it is (a big file a group of definitions at a time,
codemods/_engine/chunks.py, when it takes that path: the ``pieces`` column says); ``whole`` forces the
whole-file path (what every file took before), for a before / after in one run.

    python bench/bench_big_file.py [--mb 1 3.8] [--sites-every 1 50] [--repeat 3] [--paths pieces whole]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

HEADER = (
    "import deepspeed\n"
    "import torch\n"
    "from deepspeed.utils import groups\n"
    "from deepspeed.runtime.pipe.topology import PipeModelDataParallelTopology, PipelineParallelGrid\n"
)
BLOCK = '''

class Block{i}(torch.nn.Module):
    """A block ({i})."""

    def __init__(self, width: int = {i}) -> None:
        super().__init__()
        self.width = width  # a comment {i}
        self.name = f"block-{{width}}-{{'x'}}"

    def forward(self, x):
        sp = groups._get_sequence_parallel_world_size()
        dp = groups._get_data_parallel_world_size()
        label = f"{{sp}} {{dp}} {{x.shape[0]}}"
        return x * sp + dp, label


def helper_{i}(values, d):
    total = sum(v * {i} for v in values if v % 3)
    text = f"""{{d["key"]}} {{total:>10}}"""
    return total, text, groups._get_data_parallel_rank()


def train_{i}(model, args):
    topo = PipeModelDataParallelTopology(num_pp=2, num_mp=1, num_dp=2)
    grid = PipelineParallelGrid(topology=topo)
    engine, *_ = deepspeed.initialize(model=model, config={{"train_batch_size": 8}}, mpu=grid)
    return engine, grid.get_data_parallel_world_size()
'''


PLAIN = '''

def table_{i}(x, scale=1.5):
    """Generated code with no legacy site ({i})."""
    values = {{"a": {i}, "b": [1, 2, 3], 'c': (x, x * scale)}}  # data
    if x > {i}:
        return [v * 2 for v in values["b"] if v % 2], f"{{x!r:>8}} {{values['a']}}"
    return values
'''


def generate(megabytes: float, sites_every: int = 1) -> str:
    """About ``megabytes`` of code: one block with legacy sites per ``sites_every`` blocks."""
    parts, size, i = [HEADER], len(HEADER), 0
    while size < megabytes * 1_000_000:
        block = (BLOCK if i % sites_every == 0 else PLAIN).format(i=i)
        parts.append(block)
        size += len(block)
        i += 1
    return "".join(parts)


CHILD = r"""
import json, resource, sys, time
sys.path.insert(0, sys.argv[1])
path, what = sys.argv[2], sys.argv[3]
source = open(path, encoding="utf-8").read()
if what in ("pieces", "whole"):
    from codemods._engine import chunks, pipeline
    if what == "whole":
        chunks.MIN_BYTES = float("inf")
    taken = []
    inner = pipeline._migrate_in_pieces
    pipeline._migrate_in_pieces = lambda *a: taken.append(inner(*a)) or taken[-1]
before = resource.getrusage(resource.RUSAGE_SELF)
start = time.process_time()
if what in ("pieces", "whole"):
    result = pipeline.migrate_code(source, filename=path)
    extra = {"sites": sum(result.sites.values()), "todos": sum(result.todos.values()),
             "pieces": bool(taken) and taken[-1] is not None}
else:
    import libcst as cst
    assert cst.parse_module(source).code == source
    extra = {}
cpu = time.process_time() - start
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps({"cpu": cpu, "peak": peak, **extra}))
"""

BASELINE = r"""
import resource, sys
sys.path.insert(0, sys.argv[1])
import libcst, codemods._engine.pipeline, codemods._engine.chunks  # the same imports, nothing run
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
"""


def one(path: Path, what: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(REPO), str(path), what], capture_output=True, text=True, timeout=900
    )
    if done.returncode:
        raise SystemExit(done.stderr)
    return json.loads(done.stdout.strip().splitlines()[-1])


def _spread(values: list[float], fmt: str = "{:.2f}") -> str:
    values = sorted(values)
    return "/".join(fmt.format(v) for v in (values[0], statistics.median(values), values[-1]))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=float, nargs="+", default=[1.0, 3.8])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--sites-every",
        type=int,
        nargs="+",
        default=[1, 50],
        help="one block with sites per N blocks (1: every block; 50: a mostly generated file)",
    )
    parser.add_argument(
        "--paths",
        nargs="+",
        default=["pieces"],
        choices=["pieces", "whole"],
        help="pieces: migrate_code as it is; whole: the whole-file path forced (before)",
    )
    args = parser.parse_args()
    base = int(subprocess.run([sys.executable, "-c", BASELINE, str(REPO)], capture_output=True, text=True).stdout)
    print(f"(peak memory of the process before any file is read: {base / 2**20:.0f} MiB; subtracted below)")
    print(
        "size MB (sites) | path | pieces taken | CPU s/MB min/median/max | floor CPU s/MB median | ratio | "
        "extra memory x file size min/median/max | floor memory x | sites rewritten / TODOV1",
        flush=True,
    )
    with tempfile.TemporaryDirectory() as tmp:
        for mb, every in [(mb, every) for every in args.sites_every for mb in args.mb]:
            path = Path(tmp) / f"big_{mb}_{every}.py"
            path.write_text(generate(mb, every), encoding="utf-8")
            size = path.stat().st_size
            runs: dict[str, list[dict]] = {what: [] for what in (*args.paths, "floor")}
            for _ in range(args.repeat):  # alternated
                for what in runs:
                    runs[what].append(one(path, what))
            per_mb = size / 1e6
            floor_cpu = statistics.median(r["cpu"] for r in runs["floor"]) / per_mb
            floor_mem = statistics.median((r["peak"] - base) / size for r in runs["floor"])
            for what in args.paths:
                done = runs[what]
                cpu = [r["cpu"] / per_mb for r in done]
                memory = [(r["peak"] - base) / size for r in done]
                last = done[-1]
                taken = sum(r["pieces"] for r in done)
                print(
                    f"{per_mb:.2f} (1/{every} blocks) | {what} | {taken}/{len(done)} | {_spread(cpu)} | {floor_cpu:.2f} | "
                    f"{statistics.median(cpu) / floor_cpu:.1f}x | {_spread(memory, '{:.0f}')} | {floor_mem:.0f} | "
                    f"{last['sites']} / {last['todos']}",
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
