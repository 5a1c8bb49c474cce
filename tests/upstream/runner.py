"""DeepSpeed's own unit tests as the shim's referee: run chosen files without and with the shim.

The pinned tree (``../shared/upstream/deepspeed-tests``) is copied into a work directory (with the
two patches ``shared/upstream/README.md`` describes: fp32 variants of files that ask for fp16/bf16,
and the checkpoint assertion on an attribute 0.19.8 lacks), then each chosen file is run twice with
the installed ``deepspeed==0.19.8``: once plain ("legacy") and once with the shim installed in every
process through ``DS_MESH=1`` (``tests/upstream/site/sitecustomize.py`` on ``PYTHONPATH``). The
report lists per test: outcome without, outcome with, and whether it regressed (passed without,
not passed with).

The harness needs ``pytest<8.4`` + ``pytest-forked`` (the project's pytest is 9.x), so the runs use
a separate virtualenv made by :func:`ensure_env`: a venv of the running interpreter whose
``site-packages`` also reads the running environment's (torch, deepspeed, this project), with only
the harness packages installed into it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Iterable, Optional, Sequence

REPO = Path(__file__).resolve().parents[2]
SITE_HOOK_DIR = Path(__file__).resolve().parent / "site"
PLUGIN_DIR = Path(__file__).resolve().parent / "plugin"
PORT_BASES = {"legacy": 29500, "shim": 41500}


def default_tree() -> Path:
    """``$DS_MESH_UPSTREAM_TREE``, else ``shared/upstream/deepspeed-tests`` beside the checkout (or
    beside the main checkout of a git worktree)."""
    if os.environ.get("DS_MESH_UPSTREAM_TREE"):
        return Path(os.environ["DS_MESH_UPSTREAM_TREE"])
    candidates = [REPO.parent / "shared", REPO / "shared"]
    try:
        common = subprocess.run(
            ["git", "rev-parse", "--git-common-dir"], cwd=REPO, capture_output=True, text=True, check=True
        ).stdout.strip()
        candidates.append((REPO / common).resolve().parent.parent / "shared")
    except (OSError, subprocess.CalledProcessError):
        pass
    for shared in candidates:
        if (shared / "upstream" / "deepspeed-tests").is_dir():
            return shared / "upstream" / "deepspeed-tests"
    return candidates[0] / "upstream" / "deepspeed-tests"


HARNESS_REQUIREMENTS = ("pytest>=8,<8.4", "pytest-forked>=1.6", "pytest-xdist>=3.5", "pytest-timeout>=2.2")
EXTRA_REQUIREMENTS = ("transformers>=4.40",)  # test_ulysses / test_zeropp / hybrid engine import it
MARKERS = (
    "not sequential and not nightly and not inference and not seq_inference and not inference_ops"
    " and not inference_v2 and not inference_v2_ops and not stable_diffusion and not evaluation"
)

# Files named by issue 9 (the full run) and the CI subset (fits ~10 minutes on 2 cores, both modes).
FULL_FILES = (
    "unit/runtime/pipe/test_topology.py",
    "unit/runtime/pipe/test_pipe_schedule.py",
    "unit/utils/test_groups.py",
    "unit/v1/moe/test_moe_tp.py",
    "unit/v1/moe/test_moe.py",
    "unit/runtime/zero/test_zeropp.py",
    "unit/sequence_parallelism/test_ulysses.py",
    "unit/model_parallelism/test_autotp_training.py",
    "unit/pipe/test_pipe_module.py",
    "unit/runtime/pipe/test_pipe.py",
    "unit/hybrid_engine/test_he_all.py",
    "unit/hybrid_engine/test_he_lora.py",
)
FAST_FILES = (
    "unit/runtime/pipe/test_topology.py",
    "unit/runtime/pipe/test_pipe_schedule.py",
    "unit/utils/test_groups.py",
    "unit/runtime/zero/test_zeropp.py",  # run as its fp32 variant in CI (--fp32-only)
)
MODES = ("legacy", "shim")
PASSED, FAILED, ERROR, SKIPPED, MISSING = "passed", "failed", "error", "skipped", "missing"
FP32_SUFFIX = "_fp32"


# --- the harness virtualenv -----------------------------------------------------------------------
def _site_dirs() -> list[str]:
    paths = sysconfig.get_paths()
    return list(dict.fromkeys([paths["purelib"], paths["platlib"]]))


def env_dir_default() -> Path:
    base = os.environ.get("DS_MESH_UPSTREAM_ENV")
    if base:
        return Path(base)
    key = hashlib.sha1("|".join([sys.executable, *HARNESS_REQUIREMENTS, *EXTRA_REQUIREMENTS]).encode()).hexdigest()[:10]
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return cache / "ds-mesh" / f"upstream-env-{key}"


def env_python(env_dir: Path) -> Path:
    return env_dir / "bin" / "python"


def ensure_env(env_dir: Path, *, extras: bool, log=print) -> Path:
    """A venv with the harness's pytest, reading this environment's packages; returns its python."""
    python = env_python(env_dir)
    marker = env_dir / ("ready-extras" if extras else "ready")
    if marker.exists():
        return python
    if not python.exists():
        log(f"creating the upstream harness venv in {env_dir}")
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env_dir)], check=True)
        own_site = subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
        # the running environment's site dirs come after the venv's own (its .pth files processed too)
        lines = "".join(f"import site; site.addsitedir({d!r})\n" for d in _site_dirs())
        Path(own_site, "_ds_mesh_parent_env.pth").write_text(lines, encoding="utf-8")
    requirements = list(HARNESS_REQUIREMENTS) + (list(EXTRA_REQUIREMENTS) if extras else [])
    log(f"installing {' '.join(requirements)} into {env_dir}")
    # pip of the running environment, targeting the venv's interpreter
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", *requirements],
        check=True,
    )
    marker.write_text("\n".join(requirements), encoding="utf-8")
    return python


def needs_transformers(tree: Path, files: Sequence[str]) -> bool:
    """Whether any of ``files`` imports transformers (only then is it installed into the venv)."""
    pattern = re.compile(r"^\s*(from|import)\s+transformers\b", re.M)
    return any((tree / f).is_file() and pattern.search((tree / f).read_text(encoding="utf-8")) for f in files)


# --- the work tree (a patched copy) ---------------------------------------------------------------
_FP32_SUBS = (
    (re.compile(r'("(?:fp16|bf16)"\s*:\s*\{\s*"enabled"\s*:\s*)True'), r"\1False"),
    (re.compile(r'(\[\s*"(?:fp16|bf16)"\s*\]\s*=\s*\{\s*"enabled"\s*:\s*)True'), r"\1False"),
    (re.compile(r"\btorch\.(?:float16|half|bfloat16)\b"), "torch.float32"),
    (re.compile(r"\.half\(\)"), ".float()"),
    (re.compile(r"\bpreferred_dtype\(\)"), "torch.float32"),
    (re.compile(r"\bfp16=True\b"), "fp16=False"),
)


def fp32_source(text: str) -> Optional[str]:
    """The fp32 variant of a test file's source, or None when it names no fp16/bf16 setting."""
    out = text
    for pattern, repl in _FP32_SUBS:
        out = pattern.sub(repl, out)
    if out == text:
        return None
    if "import torch\n" not in out:
        out = "import torch\n" + out
    return out


def prepare_tree(source: Path, work: Path, files: Sequence[str], *, fp32: bool, fp32_only: bool = False) -> list[str]:
    """Copy the tree to ``work`` (patched); returns the test files to run, variants included
    (``fp32_only``: a file's variant instead of the file, where it has one)."""
    if work.exists():
        shutil.rmtree(work)
    shutil.copytree(source, work, ignore=shutil.ignore_patterns("__pycache__", ".pytest_cache"))
    for path in work.rglob("*"):
        if path.is_file():
            path.chmod(0o644)
        elif path.is_dir():
            path.chmod(0o755)
    ckpt = work / "unit" / "checkpoint" / "common.py"
    if ckpt.exists():  # 0.19.8 no longer has engine.sparse_tensor_module_names
        text = ckpt.read_text(encoding="utf-8")
        ckpt.write_text(
            re.sub(r"^(\s*)assert saved_model\.sparse_tensor_module_names ==.*$", r"\1pass", text, flags=re.M),
            encoding="utf-8",
        )
    selected: list[str] = []
    for rel in files:
        if not (work / rel).exists():
            raise FileNotFoundError(f"{rel} is not in {source}")
        variant = fp32_source((work / rel).read_text(encoding="utf-8")) if (fp32 or fp32_only) else None
        if variant is None or not fp32_only:
            selected.append(rel)
        if variant is not None:
            target = rel[: -len(".py")] + FP32_SUFFIX + ".py"
            (work / target).write_text(variant, encoding="utf-8")
            selected.append(target)
    return selected


PREBUILT_OPS = ("ShareMemCommBuilder", "FusedAdamBuilder", "CPUAdamBuilder", "CPUAdagradBuilder", "CPULionBuilder")


def prebuild_ops(python: Path, *, log=print, deepspeed: Optional[Path] = None) -> None:
    """JIT-build the CPU ops the tests load, once, so that per-test timings exclude compilation."""
    code = (
        "from deepspeed.accelerator import get_accelerator\n"
        f"for name in {PREBUILT_OPS!r}:\n"
        "    try:\n"
        "        get_accelerator().create_op_builder(name).load(verbose=False)\n"
        "    except Exception as exc:\n"
        "        print(name, 'not built:', exc)\n"
    )
    start = time.monotonic()
    proc = subprocess.run(
        [str(python), "-c", code],
        env=run_env("legacy", timeout=60, deepspeed=deepspeed),
        capture_output=True,
        text=True,
    )
    log(
        f"CPU ops ready in {time.monotonic() - start:.0f}s"
        + (f" ({proc.stdout.strip()})" if proc.stdout.strip() else "")
    )


# --- running ---------------------------------------------------------------------------------------
@dataclasses.dataclass
class RunResult:
    mode: str
    seconds: float
    outcomes: dict[str, str]
    returncode: int
    log: Path


def deepspeed_package(path: Path) -> Path:
    """``path`` checked to be a ``deepspeed`` package directory (e.g. a migrated copy); resolved."""
    path = Path(path).resolve()
    if path.name != "deepspeed" or not (path / "__init__.py").is_file():
        raise ValueError(
            f"--deepspeed {str(path)!r} is not a deepspeed package directory; pass the directory "
            "named 'deepspeed' that holds __init__.py (e.g. <copy>/deepspeed)"
        )
    return path


def run_env(
    mode: str,
    *,
    timeout: int,
    probe: Optional[Path] = None,
    deepspeed: Optional[Path] = None,
    deepspeed_probe: Optional[Path] = None,
    port_offset: int = 0,
) -> dict[str, str]:
    """The environment of one pytest run. ``deepspeed``: a deepspeed package directory to test
    instead of the installed one (its parent goes first on ``PYTHONPATH``; its JIT-built ops get
    their own ``TORCH_EXTENSIONS_DIR`` beside it, as their include paths differ from the installed
    package's). ``deepspeed_probe``: a file the pytest process appends ``deepspeed.__file__`` to."""
    env = dict(os.environ)
    env.pop("DS_MESH", None)
    env.pop("PYTEST_ADDOPTS", None)
    env.update(
        DS_ACCELERATOR="cpu",
        LOCAL_SIZE="16",
        OMP_NUM_THREADS="1",
        DS_UNITTEST_TIMEOUT=str(timeout * 2),
        DS_DISABLE_REUSE_DIST_ENV="1",
        PYTHONDONTWRITEBYTECODE="1",
        TRANSFORMERS_OFFLINE="1",
        HF_HUB_OFFLINE="1",
        TORCH_EXTENSIONS_DIR=os.environ.get(
            "TORCH_EXTENSIONS_DIR", str(Path(tempfile.gettempdir()) / "ds_mesh_torch_ext")
        ),
    )
    path = [str(REPO), str(PLUGIN_DIR)]
    if deepspeed is not None:
        deepspeed = deepspeed_package(deepspeed)
        path.insert(0, str(deepspeed.parent))
        env["TORCH_EXTENSIONS_DIR"] = str(deepspeed.parent / ".torch_extensions")
    if deepspeed_probe is not None:
        env["DS_MESH_UPSTREAM_DEEPSPEED_PROBE"] = str(deepspeed_probe)
    # two runners side by side: DS_MESH_UPSTREAM_PORT_OFFSET moves one of them (e.g. 3000)
    offset = int(os.environ.get("DS_MESH_UPSTREAM_PORT_OFFSET", "0")) + port_offset
    env["DS_MESH_UPSTREAM_PORT_BASE"] = str(PORT_BASES.get(mode, 29500) + offset)
    if mode == "shim":
        env["DS_MESH"] = "1"
        path.insert(0, str(SITE_HOOK_DIR))
        if probe is not None:
            env["DS_MESH_UPSTREAM_PROBE"] = str(probe)
    elif mode != "legacy":
        raise ValueError(f"mode {mode!r} is not one of {MODES}")
    if env.get("PYTHONPATH"):
        path.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(path)
    return env


def run_mode(
    python: Path,
    work: Path,
    files: Sequence[str],
    mode: str,
    out_dir: Path,
    *,
    jobs: int,
    timeout: int,
    keyword: Optional[str] = None,
    log=print,
    deepspeed: Optional[Path] = None,
    port_offset: int = 0,
) -> RunResult:
    return start_mode(
        python,
        work,
        files,
        mode,
        out_dir,
        jobs=jobs,
        timeout=timeout,
        keyword=keyword,
        log=log,
        deepspeed=deepspeed,
        port_offset=port_offset,
    )()


def imported_deepspeed(probe: Path) -> list[str]:
    """The distinct ``deepspeed.__file__`` values the run's pytest processes recorded."""
    if not probe.exists():
        return []
    return sorted({line.strip() for line in probe.read_text(encoding="utf-8").splitlines() if line.strip()})


def check_deepspeed(found: Sequence[str], expected: Optional[Path], where: Path) -> None:
    """Raise unless the run imported deepspeed, and only from ``expected`` when one is given."""
    if not found:
        raise RuntimeError(f"the run never recorded which deepspeed it imported (no probe lines); see {where}")
    if expected is not None:
        wrong = [f for f in found if Path(f).resolve().parent != deepspeed_package(expected)]
        if wrong:
            raise RuntimeError(f"the run imported deepspeed from {wrong[0]}, not from {expected}; see {where}")


_SESSION_END = re.compile(r"^=+ .* in [0-9.]+s( \(\S+\))? =+$")
END_GRACE_SECONDS = 60


def wait_for_session(proc: "subprocess.Popen[bytes]", log_path: Path, *, grace: float = END_GRACE_SECONDS) -> int:
    """Wait for a pytest process; once its log shows the session's last line, give it ``grace``
    seconds, then kill its whole process group (a hung test's forked child and its workers can keep
    the session from exiting forever)."""
    ended_at: Optional[float] = None
    while proc.poll() is None:
        time.sleep(2)
        if ended_at is None:
            tail = log_path.read_text(encoding="utf-8", errors="replace")[-4000:]
            if any(_SESSION_END.match(_ANSI.sub("", line).strip()) for line in tail.splitlines()):
                ended_at = time.monotonic()
        elif time.monotonic() - ended_at > grace:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
    try:  # leftovers of the session (forked children, pool workers) never outlive it
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    return proc.returncode


MAX_ROUNDS = 20  # restarts after a hung test ended a pytest session
HUNG = "hung"


def start_mode(
    python: Path,
    work: Path,
    files: Sequence[str],
    mode: str,
    out_dir: Path,
    *,
    jobs: int,
    timeout: int,
    keyword: Optional[str] = None,
    log=print,
    deepspeed: Optional[Path] = None,
    port_offset: int = 0,
):
    """Start one mode's run; returns a callable that waits for it and gives its RunResult.

    A test that hangs ends the whole pytest session (pytest-timeout's INTERNALERROR under
    ``--forked``, or the harness's own ``pytest.exit``), so the run goes on in rounds: the hung test
    is recorded as ``hung`` and the next round deselects it and every test that already finished.
    Round r > 0 writes ``<mode>.r<r>.log`` / ``.xml``. ``deepspeed``: test that deepspeed package
    directory instead of the installed one (checked: the run fails if its pytest processes imported
    deepspeed from anywhere else).
    """
    probe = out_dir / f"{mode}.probe"
    ds_probe = out_dir / f"{mode}.deepspeed"
    for p in (probe, ds_probe):
        p.unlink(missing_ok=True)
    for stale in [*out_dir.glob(f"{mode}.xml"), *out_dir.glob(f"{mode}.log"), *out_dir.glob(f"{mode}.r*.*")]:
        stale.unlink()
    base = [
        str(python),
        "-m",
        "pytest",
        *files,
        "--forked",
        "-p",
        "no:cacheprovider",
        "-p",
        "ds_mesh_upstream",
        "-m",
        MARKERS,
        f"--timeout={timeout}",
        "-q",
        "-rN",
        "--durations=0",
        "--color=no",
    ]
    if jobs > 1:
        base += ["-n", str(jobs)]
    if keyword:
        base += ["-k", keyword]
    log(f"[{mode}] {' '.join(base[1:])}")
    start = time.monotonic()
    env = run_env(
        mode, timeout=timeout, probe=probe, deepspeed=deepspeed, deepspeed_probe=ds_probe, port_offset=port_offset
    )
    result: dict[str, RunResult] = {}

    def rounds() -> None:
        outcomes: dict[str, str] = {}
        skip: list[str] = []
        returncode = 0
        for number in range(MAX_ROUNDS):
            suffix = "" if number == 0 else f".r{number}"
            xml, log_path = out_dir / f"{mode}{suffix}.xml", out_dir / f"{mode}{suffix}.log"
            cmd = [*base, f"--junitxml={xml}", *(f"--deselect={nodeid}" for nodeid in skip)]
            with open(log_path, "w", encoding="utf-8") as fh:
                proc = subprocess.Popen(
                    cmd, cwd=work, env=env, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True
                )
                returncode = wait_for_session(proc, log_path)
            outcomes.update(parse_junit(xml) if xml.exists() else parse_log(log_path))
            finished, hung = finished_and_hung(log_path)
            if hung is None:
                break
            log(f"[{mode}] {hung} hung (pytest exit {returncode}); round {number + 1} goes on without it")
            outcomes[nodeid_to_junit(hung)] = HUNG
            skip += [*finished, hung]
        seconds = time.monotonic() - start
        log(f"[{mode}] {len(outcomes)} tests in {seconds:.0f}s (pytest exit {returncode}); log: {out_dir / mode}.log")
        result["run"] = RunResult(mode, seconds, outcomes, returncode, out_dir / f"{mode}.log")

    thread = threading.Thread(target=rounds, name=f"upstream-{mode}", daemon=True)
    thread.start()

    def wait() -> RunResult:
        thread.join()
        run = result["run"]
        if mode == "shim" and run.outcomes and not probe.exists():
            raise RuntimeError(f"the shim run never installed the shim (no {probe}); see {run.log}")
        found = imported_deepspeed(ds_probe)
        if run.outcomes:
            check_deepspeed(found, deepspeed, run.log)
        log(f"[{mode}] deepspeed imported from {', '.join(found) or '(not recorded)'}")
        return run

    return wait


_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_LOG_LINE = re.compile(r"^(\S+\.py::\S+?)\s+(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\b")
_LOG_OUTCOME = {
    "PASSED": PASSED,
    "XPASS": PASSED,
    "FAILED": FAILED,
    "ERROR": ERROR,
    "SKIPPED": SKIPPED,
    "XFAIL": SKIPPED,
}


def nodeid_to_junit(nodeid: str) -> str:
    """``unit/a/test_b.py::C::t[x]`` → ``unit.a.test_b.C::t[x]`` (the junit report's id)."""
    path, *rest = nodeid.split("::")
    module = path[: -len(".py")].replace("/", ".")
    *classes, name = rest
    return f"{'.'.join([module, *classes])}::{name}"


def parse_log(path: Path) -> dict[str, str]:
    """``{test id: outcome}`` from a (possibly cut-off) verbose pytest log: for runs stopped early."""
    outcomes: dict[str, str] = {}
    for raw in path.read_text(encoding="utf-8", errors="replace").splitlines():
        line = _ANSI.sub("", raw).strip()
        line = re.sub(r"^\[gw\d+\]\s+\[\s*\d+%\]\s+", "", line)  # xdist prefix
        for match in re.finditer(r"(\S+\.py::\S+?)\s+(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\b", line):
            outcomes[nodeid_to_junit(match.group(1))] = _LOG_OUTCOME[match.group(2)]
    return outcomes


_TEST_START = re.compile(r"^(?:\[gw\d+\]\s+)?(\S+\.py::\S+)")


def finished_and_hung(path: Path) -> tuple[list[str], Optional[str]]:
    """Node ids of a verbose log with an outcome, and the test that started last without one (the
    one a hang cut off), or None when every started test finished."""
    finished: list[str] = []
    started: Optional[str] = None
    for raw in path.read_text(encoding="utf-8", errors="replace").splitlines():
        line = _ANSI.sub("", raw).strip()
        for match in re.finditer(r"(\S+\.py::\S+?)\s+(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\b", line):
            finished.append(match.group(1))
        start = _TEST_START.match(line)
        if start:
            started = start.group(1)
    hung = started if started is not None and started not in finished else None
    return finished, hung


def parse_junit(path: Path) -> dict[str, str]:
    """``{test id: outcome}`` from a junit XML report."""
    outcomes: dict[str, str] = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        classname, name = case.get("classname", ""), case.get("name", "")
        test_id = f"{classname}::{name}" if classname else name
        outcome = PASSED
        for child in case:
            if child.tag == "failure":
                outcome = FAILED
            elif child.tag == "error":
                outcome = ERROR if outcome == PASSED else outcome
            elif child.tag == "skipped":
                outcome = SKIPPED if outcome == PASSED else outcome
        outcomes[test_id] = outcome
    return outcomes


# --- reporting ----------------------------------------------------------------------------------
@dataclasses.dataclass
class Row:
    test: str
    legacy: str
    shim: str

    @property
    def regression(self) -> bool:
        return self.legacy == PASSED and self.shim != PASSED

    @property
    def fixed(self) -> bool:
        return self.legacy != PASSED and self.shim == PASSED


def compare(legacy: dict[str, str], shim: dict[str, str]) -> list[Row]:
    return [Row(t, legacy.get(t, MISSING), shim.get(t, MISSING)) for t in sorted(set(legacy) | set(shim))]


@dataclasses.dataclass
class Summary:
    tests: int
    pass_both: int
    regressions: int
    legacy_seconds: float
    shim_seconds: float
    legacy_counts: dict[str, int]
    shim_counts: dict[str, int]


def summarize(rows: Sequence[Row], legacy_seconds: float, shim_seconds: float) -> Summary:
    def counts(pick) -> dict[str, int]:
        out: dict[str, int] = {}
        for row in rows:
            out[pick(row)] = out.get(pick(row), 0) + 1
        return out

    return Summary(
        tests=len(rows),
        pass_both=sum(r.legacy == PASSED and r.shim == PASSED for r in rows),
        regressions=sum(r.regression for r in rows),
        legacy_seconds=legacy_seconds,
        shim_seconds=shim_seconds,
        legacy_counts=counts(lambda r: r.legacy),
        shim_counts=counts(lambda r: r.shim),
    )


def format_table(rows: Sequence[Row], summary: Summary, *, markdown: bool = False) -> str:
    def mark(row: Row) -> str:
        return "REGRESSION" if row.regression else ("fixed" if row.fixed else "")

    lines: list[str] = []
    if markdown:
        lines += ["| test | without shim | with shim | regression |", "|---|---|---|---|"]
        lines += [f"| `{r.test}` | {r.legacy} | {r.shim} | {mark(r)} |" for r in rows]
    else:
        width = max([len(r.test) for r in rows] + [4])
        lines.append(f"{'test':<{width}}  {'without':<8}  {'with':<8}  regression")
        lines += [f"{r.test:<{width}}  {r.legacy:<8}  {r.shim:<8}  {mark(r)}" for r in rows]
    lines.append("")
    lines.append(summary_line(summary))
    return "\n".join(lines)


def per_file_table(rows: Sequence[Row]) -> str:
    """Markdown: per test file, tests / pass both ways / fail both ways / regressions / fixed."""
    files: dict[str, list[Row]] = {}
    for row in rows:
        files.setdefault(row.test.split("::")[0].rsplit(".Test", 1)[0], []).append(row)
    lines = [
        "| file | tests | pass both | not passing both | regressions | fixed by the shim |",
        "|---|---|---|---|---|---|",
    ]
    for name, group in sorted(files.items()):
        both = sum(r.legacy == PASSED and r.shim == PASSED for r in group)
        lines.append(
            f"| `{name}` | {len(group)} | {both} | {sum(r.legacy != PASSED and r.shim != PASSED for r in group)} "
            f"| {sum(r.regression for r in group)} | {sum(r.fixed for r in group)} |"
        )
    return "\n".join(lines)


def summary_line(s: Summary) -> str:
    def fmt(c: dict[str, int]) -> str:
        return ", ".join(f"{v} {k}" for k, v in sorted(c.items()))

    return (
        f"{s.tests} tests run; {s.pass_both} pass both ways; {s.regressions} regressions; "
        f"without shim: {fmt(s.legacy_counts)} in {s.legacy_seconds:.0f}s; "
        f"with shim: {fmt(s.shim_counts)} in {s.shim_seconds:.0f}s"
    )


def write_json(path: Path, rows: Sequence[Row], summary: Summary, files: Sequence[str]) -> None:
    path.write_text(
        json.dumps(
            {
                "files": list(files),
                "summary": dataclasses.asdict(summary),
                "tests": [
                    {"test": r.test, "legacy": r.legacy, "shim": r.shim, "regression": r.regression} for r in rows
                ],
            },
            indent=1,
        ),
        encoding="utf-8",
    )


def mode_outcomes(out_dir: Path, mode: str) -> dict[str, str]:
    """One mode's outcomes over all its rounds (junit XML where written, else the log); a test that
    ended a round which has a successor is ``hung``."""
    logs = sorted(out_dir.glob(f"{mode}.r*.log"), key=lambda p: int(p.name.split(".r")[1].split(".")[0]))
    logs = [out_dir / f"{mode}.log", *logs]
    outcomes: dict[str, str] = {}
    for number, log in enumerate(logs):
        if not log.exists():
            continue
        xml = log.with_suffix(".xml")
        outcomes.update(parse_junit(xml) if xml.exists() else parse_log(log))
        _, hung = finished_and_hung(log)
        if hung is not None and number + 1 < len(logs):
            outcomes[nodeid_to_junit(hung)] = HUNG
    return outcomes


def from_logs(out_dir: Path) -> tuple[list[Row], Summary]:
    """The table of an earlier (or stopped) run from its junit XML, else its logs; times unknown (0)."""
    found = {mode: mode_outcomes(out_dir, mode) for mode in MODES}
    legacy, shim = found["legacy"], found["shim"]
    both = set(legacy) & set(shim)  # a stopped run: only the tests both passes reached
    rows = compare({t: legacy[t] for t in both}, {t: shim[t] for t in both})
    return rows, summarize(rows, 0.0, 0.0)


def main_run(
    files: Iterable[str],
    *,
    tree: Path,
    env_dir: Path,
    out_dir: Path,
    jobs: int,
    timeout: int,
    fp32: bool,
    extras: bool,
    modes: Sequence[str] = MODES,
    keyword: Optional[str] = None,
    parallel: bool = False,
    prebuild: bool = False,
    fp32_only: bool = False,
    log=print,
    deepspeed: Optional[Path] = None,
    port_offset: int = 0,
) -> tuple[list[Row], Summary]:
    """Run ``files`` in ``modes``; ``deepspeed``: against that deepspeed package directory instead of
    the installed one; ``port_offset``: moves every stream's ports (runs side by side)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    python = ensure_env(env_dir, extras=extras, log=log)
    work = out_dir / "tree"
    selected = prepare_tree(tree, work, list(files), fp32=fp32, fp32_only=fp32_only)
    if prebuild:
        prebuild_ops(python, log=log, deepspeed=deepspeed)
    if parallel:  # both modes side by side (each its own port range); timings then include the other's load
        waits = {
            m: start_mode(
                python,
                work,
                selected,
                m,
                out_dir,
                jobs=jobs,
                timeout=timeout,
                keyword=keyword,
                log=log,
                deepspeed=deepspeed,
                port_offset=port_offset,
            )
            for m in modes
        }
        results = {m: wait() for m, wait in waits.items()}
    else:
        results = {
            m: run_mode(
                python,
                work,
                selected,
                m,
                out_dir,
                jobs=jobs,
                timeout=timeout,
                keyword=keyword,
                log=log,
                deepspeed=deepspeed,
                port_offset=port_offset,
            )
            for m in modes
        }
    legacy = results.get("legacy")
    shim = results.get("shim")
    rows = compare(legacy.outcomes if legacy else {}, shim.outcomes if shim else {})
    summary = summarize(rows, legacy.seconds if legacy else 0.0, shim.seconds if shim else 0.0)
    write_json(out_dir / "results.json", rows, summary, selected)
    return rows, summary
