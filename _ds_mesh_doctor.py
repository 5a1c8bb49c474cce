"""``mesh doctor``: is this environment ready for ds-mesh? (DeepSpeed users know ``ds_report``.)

Checks the installed torch / deepspeed / libcst against the supported ranges, the ``DS_MESH``
start-up hook and variable, the accelerator and communication backend a job would use (NCCL's
version where present; whether ``nccl`` would be torch's nccl2 engine, which ds-mesh refuses), and
DeepSpeed's shared-memory op on CPU (built, absent, built but rebuilt by the next run, building, or
a stale lock with the command that clears it; the lock read as the installed torch's JIT build uses
it); then one verdict line. ``--json`` prints the same as JSON. The exit
code is 1 when something would stop a job.

A top-level module beside ``_ds_mesh_startup`` (the layers' packages import torch; this must answer
in well under 2 s): it imports neither ``mesh_core`` nor ``compat``, nor torch or deepspeed unless
``--deep`` asks. The supported ranges are read from the modules that enforce them
(``mesh_core/torch_compat.py``, ``compat/releases.py``) as text. The shim's first-run line
(``compat.shm_build``) uses the shm-op inspection here.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import sys
import time
from typing import Any, Optional, Sequence

_HERE = os.path.dirname(os.path.abspath(__file__))
OK, WARN, FAIL = "ok", "warn", "fail"
LIBCST = ">=1.5,<1.10"  # pyproject.toml's libcst dependency (tests/test_doctor.py keeps them equal)
SHM_OP = "deepspeed_shm_comm"
SHM_BUILD_TIME = "about 2 minutes on 2 CPU cores"
LIVE_BUILD_GRACE_S = 30.0  # a lock this young may belong to a build that has not started ninja yet
_VERSION = re.compile(r"^\s*v?(\d+)\.(\d+)(?:\.(\d+))?")


# --- versions -----------------------------------------------------------------------------------
def supported_range(relative_path: str) -> Optional[str]:
    """The ``SUPPORTED = "..."`` constant of a ds-mesh module, read as text (no import)."""
    try:
        with open(os.path.join(_HERE, relative_path), encoding="utf-8") as fh:
            tree = ast.parse(fh.read())
    except (OSError, SyntaxError):
        return None
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "SUPPORTED" for t in node.targets):
            if isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
                return node.value.value
    return None


def installed_version(distribution: str) -> Optional[str]:
    from importlib import metadata

    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def _release(version: str) -> Optional[tuple[int, int, int]]:
    match = _VERSION.match(version)
    return None if match is None else (int(match[1]), int(match[2]), int(match[3] or 0))


def in_range(version: str, constraint: str) -> bool:
    """Whether ``version`` (its release part) meets ``constraint`` (``>=a,<=b`` / ``<b`` / ``==a``)."""
    release = _release(version)
    if release is None:
        return False
    checks = {
        ">=": lambda a, b: a >= b,
        "<=": lambda a, b: a <= b,
        ">": lambda a, b: a > b,
        "<": lambda a, b: a < b,
        "==": lambda a, b: a == b,
    }
    for part in filter(None, (p.strip() for p in constraint.split(","))):
        op = next(o for o in (">=", "<=", "==", ">", "<") if part.startswith(o))
        bound = _release(part[len(op) :])
        if bound is None or not checks[op](release, bound):
            return False
    return True


def check_versions(versions: Optional[dict[str, Optional[str]]] = None) -> list[dict[str, Any]]:
    versions = (
        versions
        if versions is not None
        else {name: installed_version(name) for name in ("torch", "deepspeed", "libcst")}
    )
    ranges = {
        "torch": (
            supported_range("mesh_core/torch_compat.py"),
            FAIL,
            "mesh_core and the shim refuse it",
            "pip install torch==2.13.0",
        ),
        "deepspeed": (
            supported_range("compat/releases.py"),
            FAIL,
            "DS_MESH=1 / compat.install() cannot run on it",
            'pip install ".[deepspeed]"',
        ),
        "libcst": (LIBCST, WARN, "ds-migrate (the codemods) may fail", f'pip install "libcst{LIBCST}"'),
    }
    found = []
    for name, (constraint, severity, consequence, fix) in ranges.items():
        version = versions.get(name)
        check = {"check": name, "version": version, "supported": constraint}
        if version is None:
            status = FAIL if name == "torch" else WARN
            check.update(status=status, detail=f"{name} is not installed ({fix})")
        elif constraint is not None and not in_range(version, constraint):
            check.update(status=severity, detail=f"{name} {version} is outside {constraint}: {consequence}; {fix}")
        else:
            check.update(status=OK, detail=f"{name} {version} ({constraint})")
        found.append(check)
    return found


# --- the DS_MESH start-up hook ------------------------------------------------------------------
def site_dirs() -> list[str]:
    import site

    dirs = list(site.getsitepackages())
    if site.ENABLE_USER_SITE:
        dirs.append(site.getusersitepackages())
    return dirs


def check_hook(hook_ran: bool, environ=None) -> dict[str, Any]:
    """Whether this interpreter ran the start-up hook, where its ``.pth`` is, and ``DS_MESH``."""
    import _ds_mesh_startup as startup

    environ = os.environ if environ is None else environ
    files = [os.path.join(d, startup.PTH_NAME) for d in site_dirs()]
    present = [f for f in files if os.path.isfile(f)]
    mode = startup.state(environ)
    value = environ.get(startup.ENV_VAR)
    check = {"check": "start-up hook", "pth": present, "hook_ran": hook_ran, "DS_MESH": value}
    if not hook_ran:
        fix = "reinstall ds-mesh (pip install -e .) or run python -m compat.install --write-pth"
        where = (
            f"{present[0]} is there but did not run"
            if present
            else f"no {startup.PTH_NAME} in {', '.join(os.path.dirname(f) for f in files)}"
        )
        status = FAIL if mode == "on" else WARN
        outcome = "this job runs plain DeepSpeed" if mode == "on" else "DS_MESH=1 would do nothing"
        check.update(status=status, detail=f"the DS_MESH start-up hook is not installed ({where}): {outcome}; {fix}")
    elif mode == "on":
        check.update(
            status=OK,
            detail=f"start-up hook installed ({present[0] if present else 'ran'}); DS_MESH={value}: "
            "deepspeed runs on the mesh",
        )
    elif mode == "unknown":
        check.update(status=WARN, detail=f"DS_MESH={value!r} is not understood and counts as off; use DS_MESH=1")
    else:
        check.update(
            status=OK,
            detail=f"start-up hook installed ({present[0] if present else 'ran'}); DS_MESH is off: "
            "set DS_MESH=1 to run unchanged deepspeed scripts on the mesh",
        )
    return check


# --- accelerator, backend -----------------------------------------------------------------------
def torch_build() -> dict[str, Optional[str]]:
    """torch's ``version.py`` (``cuda``, ``hip``), read without importing torch."""
    import importlib.util

    spec = importlib.util.find_spec("torch")
    values: dict[str, Any] = {}
    if spec is not None and spec.origin:
        try:
            with open(os.path.join(os.path.dirname(spec.origin), "version.py"), encoding="utf-8") as fh:
                tree = ast.parse(fh.read())
            for node in tree.body:
                if isinstance(node, (ast.Assign, ast.AnnAssign)):
                    target = node.targets[0] if isinstance(node, ast.Assign) else node.target
                    if isinstance(target, ast.Name) and isinstance(node.value, ast.Constant):
                        values[target.id] = node.value.value
        except (OSError, SyntaxError):
            pass
    return {"cuda": values.get("cuda"), "hip": values.get("hip")}


def visible_gpus() -> int:
    try:
        return len(os.listdir("/proc/driver/nvidia/gpus"))
    except OSError:
        return 0


def nccl_engine(torch_version: Optional[str], environ) -> str:
    """What ``init_process_group("nccl")`` builds on ``torch_version`` with ``TORCH_DIST_USE_NCCL2`` as set:
    ``"nccl2"`` (torch 2.15 unless it is ``0``; 2.14 when it is ``1``) or ``"nccl"`` (stock ProcessGroupNCCL)."""
    release, setting = _release(torch_version or ""), environ.get("TORCH_DIST_USE_NCCL2")
    if release is not None and release >= (2, 15, 0):
        return "nccl" if setting == "0" else "nccl2"
    return "nccl2" if release is not None and release >= (2, 14, 0) and setting == "1" else "nccl"


def check_accelerator(
    build: dict[str, Optional[str]], gpus: int, environ=None, torch_version: Optional[str] = None
) -> dict[str, Any]:
    environ = os.environ if environ is None else environ
    chosen = environ.get("DS_ACCELERATOR")
    accelerator = chosen or ("cuda" if build.get("cuda") and gpus else "cpu")
    backend = {"cuda": "nccl", "cpu": "gloo"}.get(accelerator, "the accelerator's")
    nccl = next(filter(None, (installed_version(f"nvidia-nccl-cu{v}") for v in (13, 12, 11))), None)
    torch_kind = f"CUDA {build['cuda']}" if build.get("cuda") else f"ROCm {build['hip']}" if build.get("hip") else "CPU"
    gpu_count = f"{gpus or 'no'} NVIDIA GPU{'' if gpus == 1 else 's'}"
    detail = (
        f"torch is a {torch_kind} build; {gpu_count} visible; accelerator {accelerator}"
        f"{' (DS_ACCELERATOR)' if chosen else ''}, backend {backend}" + (f"; NCCL {nccl}" if nccl else "")
    )
    status = OK
    engine = nccl_engine(installed_version("torch") if torch_version is None else torch_version, environ)
    if accelerator == "cuda" and not build.get("cuda"):
        status, detail = FAIL, detail + ": DS_ACCELERATOR=cuda needs a CUDA build of torch"
    elif backend == "nccl" and engine == "nccl2":
        status, detail = (
            FAIL,
            detail
            + (
                ": nccl would be nccl2 (ProcessGroupNCCL2; TORCH_DIST_USE_NCCL2="
                f"{environ.get('TORCH_DIST_USE_NCCL2', '<unset>')}), which ds-mesh refuses; set TORCH_DIST_USE_NCCL2=0 "
                "(docs/nccl.md)"
            ),
        )
    elif accelerator == "cpu" and build.get("cuda") and gpus and not chosen:
        status = WARN
    return {
        "check": "accelerator",
        "status": status,
        "accelerator": accelerator,
        "backend": backend,
        "nccl": nccl,
        "gpus": gpus,
        "torch_build": torch_kind,
        "detail": detail,
    }


# --- DeepSpeed's shared-memory op (CPU) ---------------------------------------------------------
def shm_op_directory(build: Optional[dict[str, Optional[str]]] = None, environ=None) -> str:
    """Where torch's JIT build of ``deepspeed_shm_comm`` lives (torch.utils.cpp_extension's rule)."""
    environ = os.environ if environ is None else environ
    root = environ.get("TORCH_EXTENSIONS_DIR")
    if root is None:
        build = torch_build() if build is None else build
        cache = environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
        kind = (
            f"rocm{build['hip'].replace('.', '')}"
            if build.get("hip")
            else f"cu{build['cuda'].replace('.', '')}"
            if build.get("cuda")
            else "cpu"
        )
        python = f"py{sys.version_info.major}{sys.version_info.minor}{getattr(sys, 'abiflags', '')}"
        root = os.path.join(os.path.realpath(os.path.join(cache, "torch_extensions")), f"{python}_{kind}")
    return os.path.join(root, SHM_OP)


def live_builders(directory: str) -> list[int]:
    """Processes working in ``directory`` (torch runs ninja and the compiler there)."""
    target = os.path.realpath(directory)
    pids = []
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if entry.isdigit():
            try:
                if os.readlink(f"/proc/{entry}/cwd") == target:
                    pids.append(int(entry))
            except OSError:
                continue
    return pids


FILELOCK, BATON = "filelock", "baton"


def lock_rule(torch_version: Optional[str]) -> str:
    """How ``torch.utils.cpp_extension`` of ``torch_version`` marks a JIT build in progress in the
    build directory's ``lock``: :data:`FILELOCK` from torch 2.14 (``filelock.FileLock``: a build runs
    while a process holds the file's flock; the empty file stays after every build, and a killed
    builder's flock goes with it) or :data:`BATON` up to 2.13 (``FileBaton``: the file exists exactly
    while a build runs, so a killed build leaves it behind, and every later run waits on it forever)."""
    release = _release(torch_version or "")
    return FILELOCK if release is not None and release >= (2, 14, 0) else BATON


def lock_held(lock: str) -> Optional[bool]:
    """Whether some process holds ``lock``'s flock (tried without waiting, released at once);
    None when the file cannot be opened."""
    import fcntl

    try:
        fd = os.open(lock, os.O_RDONLY)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        except OSError:
            return None
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)


def _package_dir(name: str) -> Optional[str]:
    """Where package ``name`` would be imported from (found, not imported)."""
    import importlib.util

    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    return os.path.realpath(locations[0]) if locations else None


def _under(path: str, directory: str) -> bool:
    return os.path.realpath(path).startswith(directory.rstrip(os.sep) + os.sep)


def rebuild_reason(directory: str) -> Optional[str]:
    """Why the next JIT build redoes the op although its library is there (its ``build.ninja`` names
    another torch or DeepSpeed than this environment's, or a source or torch's headers are newer than
    the library: ninja rebuilds then; a cache shared by several venvs or releases), or None."""
    library = os.path.join(directory, f"{SHM_OP}.so")
    try:
        with open(os.path.join(directory, "build.ninja"), encoding="utf-8") as fh:
            text = fh.read()
        built_at = os.stat(library).st_mtime
    except OSError:
        return None
    torch_dir, deepspeed_dir = _package_dir("torch"), _package_dir("deepspeed")
    includes = re.findall(r"-isystem\s+(\S+)", text)
    built_torch = next(
        (os.path.dirname(i) for i in includes if i.rstrip("/").endswith(os.path.join("torch", "include"))), None
    )
    if torch_dir and built_torch and os.path.realpath(built_torch) != torch_dir:
        return (
            f"built against the torch in {os.path.dirname(built_torch)}, this environment's is in "
            f"{os.path.dirname(torch_dir)}"
        )
    sources = re.findall(r"^build \S+: compile (\S+)$", text, flags=re.MULTILINE)
    for source in sources:
        if deepspeed_dir and not _under(source, deepspeed_dir):
            return (
                f"built from DeepSpeed's sources in {source.split(os.sep + 'deepspeed' + os.sep)[0]}, this "
                f"environment's DeepSpeed is in {os.path.dirname(deepspeed_dir)}"
            )
        try:
            if os.stat(source).st_mtime > built_at:
                return f"its source {source} changed after the build"
        except OSError:
            return f"its source {source} is gone"
    if torch_dir:
        try:
            if os.stat(os.path.join(torch_dir, "include", "torch", "extension.h")).st_mtime > built_at:
                return f"the torch in {os.path.dirname(torch_dir)} was installed after the build"
        except OSError:
            pass
    return None


def shm_op_state(directory: str, now: Optional[float] = None, torch_version: Optional[str] = None) -> dict[str, Any]:
    """``state``: ``built``, ``absent`` (the next run builds it), ``rebuild`` (built, but the next run
    builds it again: ``rebuild_reason``), ``building`` or ``stale`` (a :data:`BATON` lock no live
    process holds: every run waits on it forever). ``lock_rule`` is the installed torch's
    (``torch_version``, default the installed one's): under :data:`FILELOCK` a ``lock`` means a
    build only while its flock is held, and never goes stale."""
    lock = os.path.join(directory, "lock")
    library = os.path.join(directory, f"{SHM_OP}.so")
    rule = lock_rule(installed_version("torch") if torch_version is None else torch_version)
    state: dict[str, Any] = {"directory": directory, "lock": lock, "lock_rule": rule, "built": os.path.isfile(library)}
    try:
        age = (time.time() if now is None else now) - os.stat(lock).st_mtime
    except OSError:
        age = None
    if age is not None and rule == FILELOCK and lock_held(lock):
        state.update(lock_age_s=round(age, 1), builders=live_builders(directory), state="building")
    elif age is not None and rule == BATON:
        builders = live_builders(directory)
        state.update(lock_age_s=round(age, 1), builders=builders)
        state["state"] = "building" if builders or age < LIVE_BUILD_GRACE_S else "stale"
    elif not state["built"]:
        state["state"] = "absent"
    else:
        reason = rebuild_reason(directory)
        state["state"] = "built" if reason is None else "rebuild"
        if reason is not None:
            state["rebuild_reason"] = reason
    return state


def stale_lock_message(state: dict[str, Any]) -> str:
    minutes = state.get("lock_age_s", 0) / 60
    return (
        f"{state['lock']} is a stale lock of DeepSpeed's {SHM_OP} build (left {minutes:.0f} min ago by a build "
        f"that was stopped; no process builds in {state['directory']}): every run on CPU waits on it forever. "
        f"Clear it with: rm {state['lock']}   (unless another machine builds into this directory)"
    )


def check_shm_op(accelerator: str, environ=None) -> dict[str, Any]:
    if accelerator != "cpu":
        return {
            "check": "shm op",
            "status": OK,
            "state": "not used",
            "detail": f"DeepSpeed's {SHM_OP} op is for CPU runs; not used with {accelerator}",
        }
    state = shm_op_state(shm_op_directory(environ=environ))
    detail = {
        "built": f"{SHM_OP} built ({state['directory']})",
        "absent": f"{SHM_OP} not built yet: the first DeepSpeed run on CPU builds it ({SHM_BUILD_TIME}) into "
        f"{state['directory']}",
        "rebuild": f"{SHM_OP} is built in {state['directory']} but the next DeepSpeed run on CPU builds it again "
        f"({SHM_BUILD_TIME}): {state.get('rebuild_reason')}",
        "building": f"{SHM_OP} is being built now (lock {state['lock']}, processes {state.get('builders')})",
        "stale": stale_lock_message(state),
    }[state["state"]]
    return {"check": "shm op", "status": FAIL if state["state"] == "stale" else OK, **state, "detail": detail}


# --- deep: what torch and deepspeed say when imported --------------------------------------------
def check_deep() -> dict[str, Any]:
    import torch

    detail = {"torch_cuda_available": torch.cuda.is_available()}
    if torch.cuda.is_available() and hasattr(torch.cuda, "nccl"):
        detail["torch_nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
    try:
        from deepspeed.accelerator import get_accelerator

        accelerator = get_accelerator()
        detail.update(
            deepspeed_accelerator=accelerator._name, deepspeed_backend=accelerator.communication_backend_name()
        )
    except Exception as err:  # report, do not fail the doctor
        detail["deepspeed_error"] = repr(err)
    text = ", ".join(f"{k}={v}" for k, v in detail.items())
    return {"check": "imports", "status": FAIL if "deepspeed_error" in detail else OK, "detail": text, **detail}


# --- the report ---------------------------------------------------------------------------------
def report(*, deep: bool = False, hook_ran: Optional[bool] = None, environ=None) -> dict[str, Any]:
    environ = os.environ if environ is None else environ
    hook_ran = ("_ds_mesh_startup" in sys.modules) if hook_ran is None else hook_ran
    checks = check_versions()
    checks.append(check_hook(hook_ran, environ))
    accelerator = check_accelerator(torch_build(), visible_gpus(), environ)
    checks += [accelerator, check_shm_op(accelerator["accelerator"], environ)]
    if deep:
        checks.append(check_deep())
    failed = [c["check"] for c in checks if c["status"] == FAIL]
    warned = [c["check"] for c in checks if c["status"] == WARN]
    verdict = (
        f"NOT READY: fix {', '.join(failed)} (above) before running a job"
        if failed
        else f"ready, with warnings about {', '.join(warned)}"
        if warned
        else "ready"
    )
    return {"checks": checks, "verdict": verdict, "ok": not failed}


def format_report(result: dict[str, Any]) -> str:
    lines = [f"[{c['status'].upper():4}] {c['check']}: {c['detail']}" for c in result["checks"]]
    return "\n".join(lines + [f"verdict: {result['verdict']}"])


def main(argv: Optional[Sequence[str]] = None, out=None) -> int:
    """``mesh doctor [--json] [--deep]``; returns 1 when something would stop a job."""
    hook_ran = "_ds_mesh_startup" in sys.modules  # before anything here imports it
    out = out or sys.stdout
    parser = argparse.ArgumentParser(prog="mesh doctor", description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--deep", action="store_true", help="also import torch and deepspeed and report what they say")
    args = parser.parse_args(argv)
    result = report(deep=args.deep, hook_ran=hook_ran)
    code = 0 if result["ok"] else 1
    try:
        out.write(json.dumps(result, indent=1) + "\n" if args.json else format_report(result) + "\n")
        out.flush()
    except BrokenPipeError:  # the reader stopped early (``mesh doctor --json | head -1``): the verdict stands
        if out is sys.stdout:  # so that the flush at exit cannot fail again
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return code


if __name__ == "__main__":
    sys.exit(main())
