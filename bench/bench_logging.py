"""Per-call cost of DeepSpeed's logger under the shim's logging tree, beside DeepSpeed 0.19.8's own.

    python bench/bench_logging.py [--number 200000]

Same process, same call sites, timed alternately: legacy (the shared "DeepSpeed" logger) and
routed (compat.logging_tree: the record goes to the calling module's logger, found from the
caller's frame). Rows: a disabled call (``logger.info`` at the default WARNING, the common case in
training loops), ``log_dist`` disabled, and an enabled call formatted into an in-memory stream.
"""

from __future__ import annotations

import argparse
import io
import logging
import timeit

import common  # noqa: F401  (environment and sys.path)

# isort: split


def per_call_ns(stmt: str, env: dict, number: int, repeat: int = 5) -> float:
    return min(timeit.repeat(stmt, globals=env, number=number, repeat=repeat)) / number * 1e9


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--number", type=int, default=200_000)
    args = parser.parse_args()

    import deepspeed.utils.logging as ds_logging

    import compat.install as installer

    ds_logger = ds_logging.logger
    rows = [
        ("logger.info (disabled, WARNING)", "logger.info('step %d', 1)", args.number),
        ("log_dist INFO (disabled)", "log_dist('step', ranks=[0])", args.number // 4),
        ("logger.warning (enabled, formatted)", "logger.warning('step %d', 1)", args.number // 10),
    ]
    sink = io.StringIO()
    results = []
    for label, stmt, number in rows:
        env = {"logger": ds_logger, "log_dist": ds_logging.log_dist}
        times = {}
        for mode in ("legacy", "routed", "legacy", "routed"):
            if mode == "routed":
                installer.install()
                root = logging.getLogger("deepspeed")
                saved = root.handlers[:]
                root.handlers[:] = [logging.StreamHandler(sink)]
                root.handlers[0].setFormatter(logging.Formatter(ds_logging.logger.handlers[0].formatter._fmt))
            else:
                saved_handlers = ds_logger.handlers[:]
                ds_logger.handlers[0].setStream(sink)
            try:
                t = per_call_ns(stmt, env, number)
            finally:
                if mode == "routed":
                    root.handlers[:] = saved
                    installer.uninstall()
                else:
                    import sys

                    ds_logger.handlers[:] = saved_handlers
                    ds_logger.handlers[0].setStream(sys.stdout)
            times[mode] = min(times.get(mode, float("inf")), t)
            sink.seek(0)
            sink.truncate()
        results.append((label, times["legacy"], times["routed"]))
    print(f"{'call':<38}{'legacy ns':>11}{'routed ns':>11}{'routed/legacy':>15}")
    for label, legacy, routed in results:
        print(f"{label:<38}{legacy:>11.0f}{routed:>11.0f}{routed / legacy:>15.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
