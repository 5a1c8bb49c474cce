"""Shared helpers of the bench scripts: timing, tracemalloc peaks, fake worlds and tables."""

from __future__ import annotations

import contextlib
import gc
import os
import sys
import time
import tracemalloc
from typing import Any, Callable, Iterator, Sequence

os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.setdefault("OMP_NUM_THREADS", "1")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))  # fakepg: the fake process-group helpers

MiB = 1024 * 1024


def timed(fn: Callable[[], Any], repeat: int = 1) -> tuple[float, Any]:
    """Best wall time (s) of ``repeat`` calls, and the last result."""
    best, result = float("inf"), None
    for _ in range(repeat):
        gc.collect()
        start = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - start)
    return best, result


def peak_memory(fn: Callable[[], Any]) -> tuple[int, Any]:
    """Peak bytes allocated by Python while ``fn`` runs (tracemalloc), and its result."""
    gc.collect()
    tracemalloc.start()
    try:
        result = fn()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return peak, result


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Silence stdout (DeepSpeed's grid prints the whole topology on rank 0) and DeepSpeed's logger."""
    import io
    import logging

    ds_logger = logging.getLogger("DeepSpeed")
    level = ds_logger.level
    ds_logger.setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            yield
    finally:
        ds_logger.setLevel(level)


def ratio(new: float, legacy: float) -> str:
    if not legacy:
        return "-"
    return f"{new / legacy:.3f}"


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A plain fixed-width table."""
    cells = [[str(h) for h in headers]] + [[_cell(v) for v in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3f}" if value < 100 else f"{value:.0f}"
    return str(value)
