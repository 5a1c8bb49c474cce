"""The shim on every node of a multi-node launch: the real DeepSpeed launcher (``deepspeed --hostfile H
--launcher L``, 2 hosts) builds its command for each multi-node runner, and fake ``pdsh`` / ``mpirun`` /
``srun`` executables on PATH record it. With ``DS_MESH=1`` (the start-up hook) every command exports
``DS_MESH`` and ``DS_MESH_STRICT`` the way it exports ``PYTHONPATH``; without the shim none is added;
``compat.install()`` in a wrapper exports ``DS_MESH=1``; a ``.deepspeed_env`` line wins.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from compat import launcher_env, startup

pytestmark = [pytest.mark.deepspeed, pytest.mark.releases, pytest.mark.torch_releases]

ROOT = Path(__file__).resolve().parents[2]
DRIVER = Path(__file__).with_name("launcher_driver.py")
# every multi-node runner deepspeed 0.17.0 .. 0.19.8 ships (deepspeed/launcher/constants.py)
LAUNCHERS = ("pdsh", "openmpi", "mpich", "impi", "mvapich", "slurm")
FAKES = {  # executable -> what it prints (the launchers' backend_exists() look for these)
    "pdsh": "",
    "mpirun": "",
    "srun": "",
    "ompi_info": "",
    "sinfo": "",
    "mpiname": "MVAPICH2-GDR 2.3.7",
}
FAKE = """#!{python}
import json, os, sys
with open(os.environ["FAKE_RECORD"], "a") as fh:
    env = {{k: v for k, v in os.environ.items() if k.startswith(("DS_MESH", "DS_LOG"))}}
    fh.write(json.dumps({{"tool": os.path.basename(sys.argv[0]), "argv": sys.argv[1:], "env": env}}) + "\\n")
print({out!r})
"""


def exports(launcher: str, argv: list[str]) -> dict[str, str]:
    """The variables a recorded command sets on the nodes, read in its runner's syntax."""
    out: dict[str, str] = {}
    if launcher == "pdsh":  # pdsh ... -w HOSTS "export K=V; export K2=V2; " "cd ...;" python -m deepspeed...launch
        for arg in argv:
            out.update(dict(re.findall(r"export ([A-Za-z_][A-Za-z0-9_]*)=(.*?); ", arg, re.S)))
    elif launcher == "slurm":  # srun ... --export=ALL,K=V,K2=V2
        for arg in argv:
            if arg.startswith("--export="):
                out.update(item.split("=", 1) for item in arg[len("--export=") :].split(",") if "=" in item)
    else:
        flag = {"openmpi": "-x", "mpich": "-genv", "impi": "-genv", "mvapich": "-env"}[launcher]
        for i, arg in enumerate(argv[:-1]):
            if arg != flag:
                continue
            if "=" in argv[i + 1]:  # -x K=V / -genv K=V / -env K=V
                key, value = argv[i + 1].split("=", 1)
            else:  # Intel MPI and MPICH's extra ones: -genv K V
                key, value = argv[i + 1], argv[i + 2]
            out[key] = value
    return out


@pytest.fixture(scope="module")
def fakes(tmp_path_factory):
    """Fake launcher executables, a 2-host hostfile, the start-up hook on a private site directory."""
    base = tmp_path_factory.mktemp("launchers")
    bindir = base / "bin"
    bindir.mkdir()
    for name, out in FAKES.items():
        path = bindir / name
        path.write_text(FAKE.format(python=sys.executable, out=out))
        path.chmod(0o755)
    hostfile = base / "hostfile"
    hostfile.write_text("node1 slots=2\nnode2 slots=2\n")
    site = base / "site"
    site.mkdir()
    startup.write_pth(str(site))  # ds_mesh.pth, processed at start-up by the sitecustomize below
    hook = base / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(f"import site\nsite.addsitedir({str(site)!r})\n")
    user_env = base / "with_deepspeed_env"
    user_env.mkdir()
    (user_env / ".deepspeed_env").write_text("DS_MESH_STRICT=0\n")
    return {"base": base, "bin": bindir, "hostfile": hostfile, "hook": hook, "user_env": user_env}


def launch(fakes, items: list[str], env_extra: dict[str, str], *, install: bool = False):
    record = fakes["base"] / f"record-{len(list(fakes['base'].glob('record-*')))}.jsonl"
    home = fakes["base"] / "home"  # no ~/.deepspeed_env of the user running the tests
    home.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(launcher_env.FORWARDED_PREFIXES)}
    env.update(
        PATH=f"{fakes['bin']}{os.pathsep}{env.get('PATH', '')}",
        HOME=str(home),
        FAKE_RECORD=str(record),
        PYTHONPATH=os.pathsep.join([str(fakes["hook"]), str(ROOT)]),
        DS_ACCELERATOR="cpu",
        # deepspeed 0.17.0's OpenMPIRunner reads these in the launching process
        OMPI_COMM_WORLD_LOCAL_RANK="0",
        OMPI_COMM_WORLD_RANK="0",
        OMPI_COMM_WORLD_SIZE="1",
    )
    env.update(env_extra)
    cmd = [sys.executable, str(DRIVER), str(fakes["hostfile"]), *(["--install"] if install else []), *items]
    proc = subprocess.run(cmd, cwd=str(fakes["base"]), env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    rows = [json.loads(line) for line in record.read_text().splitlines()]
    runs = [r for r in rows if r["tool"] in ("pdsh", "mpirun", "srun")]
    assert len(runs) == len(items), rows  # one launch command per launcher
    shim = re.search(r"^SHIM (True|False)$", proc.stdout, re.M)
    assert shim, proc.stdout[-2000:]
    return [(item.partition("@")[0], r["argv"], r["env"]) for item, r in zip(items, runs)], shim.group(1) == "True"


def test_with_ds_mesh_every_runner_carries_ds_mesh_and_strict_to_every_node(fakes):
    levels = "deepspeed.runtime.engine=info"
    runs, shim = launch(fakes, list(LAUNCHERS), {"DS_MESH": "1", "DS_MESH_STRICT": "1", "DS_LOG_LEVELS": levels})
    assert shim  # the start-up hook installed the shim in the launcher process
    for launcher, argv, env in runs:
        carried = exports(launcher, argv)
        assert "PYTHONPATH" in carried, (launcher, argv)
        assert carried.get("DS_MESH") == "1", (launcher, shlex.join(argv))
        assert carried.get("DS_MESH_STRICT") == "1", (launcher, shlex.join(argv))
        # the launcher puts its own level first (the shim's logging tree reads DS_LOG_LEVELS on each node)
        logging_levels = env["DS_LOG_LEVELS"] if launcher == "slurm" else carried["DS_LOG_LEVELS"]
        assert logging_levels.startswith("deepspeed=") and logging_levels.endswith("," + levels), (launcher, argv)
    srun = next(argv for launcher, argv, _ in runs if launcher == "slurm")
    # srun splits --export=ALL,K=V at commas: a value with one travels through ALL, not cut in the list
    assert "--export=ALL," in " ".join(srun) and "DS_LOG_LEVELS" not in " ".join(srun)


def test_without_the_shim_no_variable_is_added(fakes):
    runs, shim = launch(fakes, list(LAUNCHERS), {})
    assert not shim
    for launcher, argv, _ in runs:
        carried = exports(launcher, argv)
        assert "PYTHONPATH" in carried, (launcher, argv)
        assert not [k for k in carried if k.startswith(("DS_MESH", "DS_LOG"))], (launcher, shlex.join(argv))
        assert "DS_MESH" not in " ".join(argv), (launcher, shlex.join(argv))


def test_compat_install_in_a_wrapper_exports_ds_mesh_and_a_deepspeed_env_line_wins(fakes):
    items = ["pdsh", "slurm", f"openmpi@{fakes['user_env']}", f"pdsh@{fakes['user_env']}"]
    runs, shim = launch(fakes, items, {"DS_MESH_STRICT": "1"}, install=True)
    assert shim
    carried = [exports(launcher, argv) for launcher, argv, _ in runs]
    assert [c.get("DS_MESH") for c in carried] == ["1"] * 4  # no DS_MESH in the environment: the shim's own
    # DS_MESH_STRICT=1 from the environment, then .deepspeed_env's DS_MESH_STRICT=0 where there is one
    assert [c.get("DS_MESH_STRICT", "").strip() for c in carried] == ["1", "1", "0", "0"]


def test_every_variable_ds_mesh_reads_is_forwarded():
    """The names the project's code reads (``DS_MESH*`` / ``DS_LOG*`` string constants) all match a
    forwarded prefix."""
    names = set()
    for path in [ROOT / "_ds_mesh_startup.py", *(ROOT / "compat").rglob("*.py"), *(ROOT / "mesh_core").rglob("*.py")]:
        names.update(re.findall(r"[\"'](DS_(?:MESH|LOG)[A-Z_]*)[\"']", path.read_text()))
    assert {"DS_MESH", "DS_MESH_STRICT", "DS_LOG_LEVELS"} <= names
    assert all(name.startswith(launcher_env.FORWARDED_PREFIXES) for name in names), names


def test_install_wraps_every_runner_and_uninstall_restores_it(monkeypatch):
    import importlib

    import deepspeed.launcher.multinode_runner as mnr

    installer = importlib.import_module("compat.install")  # the module (compat.install may name the function)

    original = mnr.MultiNodeRunner.__dict__["__init__"]
    args = type("Args", (), {"user_script": "train.py", "user_args": [], "launcher_args": ""})()
    monkeypatch.setenv("DS_MESH_STRICT", "1")
    monkeypatch.delenv("DS_MESH", raising=False)
    installer.install()
    try:
        assert mnr.MultiNodeRunner.__dict__["__init__"] is not original
        assert "deepspeed.launcher.multinode_runner.MultiNodeRunner.__init__" in installer.patched_names()
        runner = mnr.PDSHRunner(args, "e30=")
        assert runner.exports == {"DS_MESH_STRICT": "1", "DS_MESH": "1"}
    finally:
        installer.uninstall()
    assert mnr.MultiNodeRunner.__dict__["__init__"] is original
    assert mnr.PDSHRunner(args, "e30=").exports == {}
