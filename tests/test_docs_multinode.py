"""docs/multinode.md's commands, run where one machine can run them: the start-up hook's command, the
``mesh show`` output it prints (the default run), and (``-m slow``) two torchrun "nodes" on one
machine and the real ``deepspeed --hostfile`` launcher through a pdsh that runs each node's command
locally in a clean environment (as over ssh), both with ``DS_MESH=1`` only where the page sets it:
every rank of ``examples/multinode_check.py`` must report the shim on."""

from __future__ import annotations

import os
import re
import shlex
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOC = (ROOT / "docs" / "multinode.md").read_text(encoding="utf-8")
CHECK = ROOT / "examples" / "multinode_check.py"
TORCHRUN = [
    f"DS_MESH=1 .venv/bin/torchrun --nnodes 2 --node-rank {n} --nproc-per-node 4 --master-addr HOST0 --master-port 29500 "
    "train.py"
    for n in (0, 1)
]
DEEPSPEED = "DS_MESH=1 .venv/bin/deepspeed --hostfile hostfile --launcher pdsh train.py"
WRITE_PTH = ".venv/bin/python -m compat.install --write-pth"
SHOW = ".venv/bin/mesh show -w 8 --pp 2 --tp 2 -g 4"


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DS_MESH", "DS_LOG"))}
    env.update(DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1", **extra)
    return env


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_page_has_the_commands_this_test_runs():
    for command in [*TORCHRUN, DEEPSPEED, WRITE_PTH, f"$ {SHOW}"]:
        assert command in DOC, command


def test_mesh_show_prints_what_the_page_shows():
    shown = DOC.split(f"$ {SHOW}\n", 1)[1].split("```", 1)[0]
    proc = subprocess.run(
        [sys.executable, "-m", "mesh_core", "show", *shlex.split(SHOW)[2:]],
        capture_output=True,
        text=True,
        env=_env(PYTHONPATH=str(ROOT)),
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(shown), f"docs/multinode.md shows:\n{shown}\nmesh show prints:\n{proc.stdout}"
    assert "nodes: 2 x 4 GPUs" in shown and re.search(r"^  pp\s+2\s+4\s+4$", shown, re.M)  # pp crosses nodes
    one = subprocess.run(
        [sys.executable, "-m", "mesh_core", "show", *shlex.split(SHOW)[2:], "--rank", "5"],
        capture_output=True,
        text=True,
        env=_env(PYTHONPATH=str(ROOT)),
        timeout=120,
    )
    assert "rank 5, node 1" in one.stdout and "crosses nodes" in one.stdout, one.stdout


@pytest.fixture
def hook(tmp_path):
    """The page's ``python -m compat.install --write-pth``, into a private site directory that a
    sitecustomize on PYTHONPATH adds at start-up (the shared environment stays untouched)."""
    site, hook = tmp_path / "site", tmp_path / "hook"
    site.mkdir()
    hook.mkdir()
    proc = subprocess.run(
        [sys.executable, *shlex.split(WRITE_PTH)[1:], str(site)],
        capture_output=True,
        text=True,
        env=_env(PYTHONPATH=str(ROOT)),
        timeout=120,
    )
    assert proc.returncode == 0 and (site / "ds_mesh.pth").exists(), proc.stderr
    (hook / "sitecustomize.py").write_text(f"import site\nsite.addsitedir({str(site)!r})\n")
    return os.pathsep.join([str(hook), str(ROOT), str(ROOT / "examples")])


def _shim_lines(output: str) -> list[str]:
    return re.findall(r"^rank (\d) of 4 on .*: DS_MESH=(\S*), shim (on|off).*$", output, re.M)


@pytest.mark.slow
def test_torchrun_on_each_node_puts_every_rank_on_the_shim(tmp_path, hook):
    port = str(_free_port())
    procs = []
    for command in TORCHRUN:
        argv = shlex.split(
            command.replace("HOST0", "127.0.0.1")
            .replace("29500", port)
            .replace("--nproc-per-node 4", "--nproc-per-node 2")
        )
        assert argv[0] == "DS_MESH=1" and argv[1] == ".venv/bin/torchrun"
        argv = [sys.executable, "-m", "torch.distributed.run", *argv[2:-1], str(CHECK)]
        procs.append(
            subprocess.Popen(
                argv,
                env=_env(DS_MESH="1", PYTHONPATH=hook),
                cwd=str(tmp_path),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    outputs = [p.communicate(timeout=400)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), "\n".join(o[-3000:] for o in outputs)
    lines = sorted(_shim_lines("".join(outputs)))
    assert lines == [(str(r), "1", "on") for r in range(4)], "".join(outputs)[-3000:]


# pdsh as over ssh, on this machine: each host's command (%n = its index) in a clean environment: the
# node's own variables (PATH, HOME, the CPU settings), nothing of the launching shell
LOCAL_PDSH = """#!{python}
import subprocess, sys
args = sys.argv[1:]
hosts = args[args.index("-w") + 1].split(",")
command = " ".join(args[args.index("-w") + 2:])
node_env = {node_env!r}
procs = [subprocess.Popen(["bash", "-c", command.replace("%n", str(i))], env=node_env) for i in range(len(hosts))]
sys.exit(max(p.wait() for p in procs))
"""


@pytest.mark.slow
@pytest.mark.deepspeed
def test_the_deepspeed_launcher_carries_ds_mesh_to_every_node(tmp_path, hook):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    node_env = {
        "PATH": os.environ.get("PATH", ""),
        "HOME": str(tmp_path),
        "DS_ACCELERATOR": "cpu",
        "OMP_NUM_THREADS": "1",
        "TORCH_EXTENSIONS_DIR": str(tmp_path / "torch_extensions"),
    }
    pdsh = bindir / "pdsh"
    pdsh.write_text(LOCAL_PDSH.format(python=sys.executable, node_env=node_env))
    pdsh.chmod(0o755)
    (tmp_path / "hostfile").write_text("node1 slots=2\nnode2 slots=2\n")
    argv = shlex.split(DEEPSPEED)
    assert argv[:2] == ["DS_MESH=1", ".venv/bin/deepspeed"] and argv[-1] == "train.py"
    cmd = [
        sys.executable,
        "-c",
        "from deepspeed.launcher.runner import main; main()",
        *argv[2:-1],
        "--no_ssh_check",
        "--master_addr",
        "127.0.0.1",
        "--master_port",
        str(_free_port()),
        str(CHECK),
    ]
    env = _env(
        DS_MESH="1", PYTHONPATH=hook, PATH=f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}", HOME=str(tmp_path)
    )
    proc = subprocess.run(cmd, cwd=str(tmp_path), env=env, capture_output=True, text=True, timeout=500)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-4000:]
    assert sorted(_shim_lines(output)) == [(str(r), "1", "on") for r in range(4)], output[-4000:]
