"""Plain deepspeed vs the shim on every deepspeed release: a ZeRO-2 and a pipeline job, 2 gloo ranks.

    python tools/run_releases.py                      # every supported release, plus 0.16.9 (refused)
    python tools/run_releases.py 0.17.0 0.19.8        # some releases
    python tools/run_releases.py --tree ../DeepSpeed  # also a source tree (pip-installed like a release)

Each release is installed with ``pip install --no-deps --target <cache>/ds-<version>`` and put first
on ``PYTHONPATH`` over this interpreter's packages (torch and deepspeed's dependencies), so that all
releases share one torch. For a supported release it runs ``tests/e2e/release_jobs.py`` and prints
one row per job: losses and parameters of plain deepspeed and the shim equal on both ranks. For an
unsupported one it checks the refusal: ``DS_MESH=1 python -c "import deepspeed"`` exits 0 with one
warning, ``compat.install()`` raises naming the range, and ``is_installed()`` is False after.
Exit status 0 when every row passes.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from compat import releases  # noqa: E402

RELEASES = ["0.17.%d" % i for i in range(7)] + ["0.18.%d" % i for i in range(10)] + ["0.19.%d" % i for i in range(9)]
UNSUPPORTED = ["0.16.9"]
JOBS = ("zero2", "pipeline")
REFUSAL = """
import site, sys, warnings
site.addsitedir({site!r})
import deepspeed
import compat.install as installer
assert not installer.is_installed(), "the DS_MESH=1 hook installed the shim"
try:
    installer.install()
except Exception as err:
    print("RAISED", type(err).__name__, err)
print("INSTALLED", installer.is_installed(), len(installer.patched_names()))
"""


def env_for(overlay: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("DS_MESH", "PYTHONPATH")}
    env.update(DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(filter(None, [overlay, ROOT])))
    return env


def overlay_for(version: str | None, cache: str, tree: str | None = None) -> str:
    """``<cache>/ds-<version>`` (or ``ds-tree-<name>``) holding that deepspeed only (installed once)."""
    target = os.path.join(
        cache, f"ds-{version}" if tree is None else f"ds-tree-{os.path.basename(os.path.abspath(tree))}"
    )
    if not os.path.isdir(os.path.join(target, "deepspeed")):
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "install",
                "-q",
                "--no-deps",
                "--target",
                target,
                f"deepspeed=={version}" if tree is None else os.path.abspath(tree),
            ],
            check=True,
            env=dict(os.environ, DS_BUILD_OPS="0"),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
    return target


def run_jobs(overlay: str, out_dir: str, timeout: int) -> tuple[str, list[dict]] | str:
    import torch

    env = env_for(overlay)
    env["TORCH_EXTENSIONS_DIR"] = os.path.join(out_dir, "torch_extensions")
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        os.path.join(ROOT, "tests", "e2e", "release_jobs.py"),
        out_dir,
    ]
    try:
        proc = subprocess.run(cmd, cwd=out_dir, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return f"timed out after {timeout}s"
    if proc.returncode != 0:
        tail = [line for line in (proc.stdout + proc.stderr).splitlines() if "Error" in line][-1:]
        return f"rc={proc.returncode} {' '.join(tail)[:200]}"
    ranks = [torch.load(os.path.join(out_dir, f"rank{r}.pt")) for r in range(2)]
    return ranks[0]["version"], ranks


def job_row(release: str, job: str, ranks: list[dict]) -> tuple[str, bool]:
    import torch

    losses = all(r[job]["plain"]["losses"] == r[job]["shim"]["losses"] for r in ranks)
    params = all(
        r[job]["plain"]["params"].keys() == r[job]["shim"]["params"].keys()
        and all(torch.equal(v, r[job]["shim"]["params"][k]) for k, v in r[job]["plain"]["params"].items())
        for r in ranks
    )
    routed = all(r[job]["shim"]["installed"] and not r[job]["plain"]["installed"] for r in ranks)
    final = ranks[-1][job]["plain"]["losses"][-1]
    ok = losses and params and routed
    return f"| {release} | {job} | {final:.6f} | {losses} | {params} | {routed} | {'PASS' if ok else 'FAIL'} |", ok


def refusal_row(release: str, overlay: str, out_dir: str) -> tuple[str, bool]:
    from compat import startup

    site = os.path.join(out_dir, "site")
    os.makedirs(site, exist_ok=True)
    startup.write_pth(site)
    env = env_for(overlay)
    env["DS_MESH"] = "1"
    proc = subprocess.run(
        [sys.executable, "-c", REFUSAL.format(site=site)],
        env=env,
        cwd=out_dir,
        capture_output=True,
        text=True,
        timeout=600,
    )
    warned = [line for line in (proc.stdout + proc.stderr).splitlines() if "ds-mesh:" in line]
    raised = [line for line in proc.stdout.splitlines() if line.startswith("RAISED")]
    ok = (
        proc.returncode == 0
        and len(warned) == 1
        and len(raised) == 1
        and releases.SUPPORTED in raised[0]
        and "INSTALLED False 0" in proc.stdout
    )
    after = [line.split()[1] for line in proc.stdout.splitlines() if line.startswith("INSTALLED")]
    detail = (
        f"DS_MESH=1 import: rc={proc.returncode}, {len(warned)} warning; install() raised naming the range: "
        f"{bool(raised) and releases.SUPPORTED in raised[0]}; is_installed() after: {after[0] if after else '?'}"
    )
    return f"| {release} | refused | {detail} | | | | {'PASS' if ok else 'FAIL'} |", ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("releases", nargs="*", help="deepspeed versions (default: every supported one and 0.16.9)")
    parser.add_argument("--tree", action="append", default=[], help="a deepspeed source tree to run as well")
    parser.add_argument(
        "--cache",
        default=os.path.join(tempfile.gettempdir(), "ds-mesh-releases"),
        help="where the releases are installed (default: %(default)s)",
    )
    parser.add_argument("--timeout", type=int, default=600, help="seconds per release (default: %(default)s)")
    args = parser.parse_args(argv)
    wanted = args.releases or RELEASES + UNSUPPORTED
    print("| release | job | last loss (plain, rank 1) | losses equal | parameters equal | shim routed | result |")
    print("|---|---|---|---|---|---|---|")
    failures = 0
    targets = [(v, None) for v in wanted] + [(None, tree) for tree in args.tree]
    for version, tree in targets:
        try:
            overlay = overlay_for(version, args.cache, tree)
        except subprocess.CalledProcessError as err:
            print(f"| {version} | install | {err} | | | | FAIL |", flush=True)
            failures += 1
            continue
        out_dir = tempfile.mkdtemp(prefix=f"release-{version or 'tree'}-")
        if version is not None and not releases.is_supported(version):
            row, ok = refusal_row(version, overlay, out_dir)
            print(row, flush=True)
            failures += not ok
            continue
        outcome = run_jobs(overlay, out_dir, args.timeout)
        if isinstance(outcome, str):
            print(f"| {version or tree} | both | {outcome} | | | | FAIL |", flush=True)
            failures += 1
            continue
        reported, ranks = outcome
        name = version or f"{reported} ({os.path.basename(os.path.abspath(tree))})"
        for job in JOBS:
            row, ok = job_row(name, job, ranks)
            print(row, flush=True)
            failures += not ok
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
