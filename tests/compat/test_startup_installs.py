"""One shim per process whatever the install: with ``DS_MESH=1`` the start-up hook's ``compat`` is the
module ``import compat`` gives the program (the README's editable install without ``PYTHONPATH``, and a
zipapp), so the program's warning filters and ``compat`` names are the running shim's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import zipfile

import pytest

from compat import startup

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

pytestmark = pytest.mark.deepspeed

# the program: deepspeed first (the hook loads the shim then), its own ``compat`` after
PROGRAM = """
import os, sys, warnings
import deepspeed
import compat, compat.install
print("PRIVATE", "_ds_mesh_compat" in sys.modules, "INSTALLED", compat.install.is_installed())
print("FILE", compat.__file__)
import torch.distributed as dist
dist.init_process_group("gloo", init_method="file://" + os.path.abspath("store"), rank=0, world_size=1)
from deepspeed.utils import groups
warnings.simplefilter("error", compat.LegacyAPIDeprecationWarning)
try:
    groups._get_data_parallel_world_size()
    print("RAISED nothing")
except compat.LegacyAPIDeprecationWarning as warning:
    print("RAISED", str(warning).split(" ")[0])
warnings.simplefilter("ignore", compat.LegacyAPIDeprecationWarning)
groups._get_data_parallel_world_size()   # the README's filter: silent
dist.destroy_process_group()
"""


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "DS_MESH")}
    env.update(DS_MESH="1", DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1")
    return env


def _check(proc: subprocess.CompletedProcess, compat_file: str) -> None:
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "PRIVATE False INSTALLED True" in proc.stdout, proc.stdout + proc.stderr[-3000:]
    assert f"FILE {compat_file}" in proc.stdout
    assert "RAISED TODOV1:" in proc.stdout  # the user's "error" filter reaches the shim's warnings
    assert "TODOV1" not in proc.stderr  # and the user's "ignore" filter silences them


def _fresh_venv(venv) -> tuple[str, str]:
    """``(python, site dir)`` of a new venv; torch and deepspeed come from this interpreter's
    site-packages through a path line (not a site dir: its own ``.pth`` files stay unprocessed)."""
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = str(venv / "bin" / "python")
    site_dir = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout.strip()
    with open(os.path.join(site_dir, "_shared_packages.pth"), "w", encoding="utf-8") as fh:
        fh.write(sysconfig.get_paths()["purelib"] + "\n")
    return python, site_dir


def _pip(python: str, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run(
        [sys.executable, "-m", "pip", "--python", python, *args], capture_output=True, text=True, env=env, timeout=300
    )


def _hook_shipped(site_dir: str) -> None:
    """The install itself put the start-up hook in site-packages (no ``--write-pth``)."""
    with open(os.path.join(site_dir, startup.PTH_NAME), encoding="utf-8") as fh:
        assert fh.read() == startup.PTH_LINE


@pytest.fixture(scope="module")
def editable_venv(tmp_path_factory) -> str:
    """A fresh venv holding only an editable install of this tree (``pip install -e``, setuptools'
    editable finder), which brings the hook's ``.pth``."""
    python, site_dir = _fresh_venv(tmp_path_factory.mktemp("venv"))
    pip = _pip(python, "install", "-q", "--no-deps", "--no-build-isolation", "--no-index", "-e", ROOT)
    if pip.returncode != 0:
        pytest.skip(f"pip install -e failed here: {pip.stderr[-500:]}")
    assert any(name.startswith("__editable__") for name in os.listdir(site_dir))
    _hook_shipped(site_dir)
    return python


def test_editable_install_gives_one_shim(editable_venv, tmp_path):
    script = tmp_path / "train.py"
    script.write_text(PROGRAM)
    proc = subprocess.run(
        [editable_venv, str(script)], env=_env(), cwd=str(tmp_path), capture_output=True, text=True, timeout=300
    )
    _check(proc, os.path.join(ROOT, "compat", "__init__.py"))


def test_wheel_install_brings_the_hook_and_uninstall_removes_it(tmp_path):
    """``pip install .`` (a regular wheel): DS_MESH=1 works at once; ``pip uninstall`` leaves no hook."""
    python, site_dir = _fresh_venv(tmp_path / "venv")
    work = tmp_path / "work"
    work.mkdir()
    pip = _pip(python, "install", "-q", "--no-deps", "--no-build-isolation", "--no-index", ROOT)
    if pip.returncode != 0:
        pytest.skip(f"pip install failed here: {pip.stderr[-500:]}")
    _hook_shipped(site_dir)
    script = work / "train.py"
    script.write_text(PROGRAM)
    proc = subprocess.run([python, str(script)], env=_env(), cwd=str(work), capture_output=True, text=True, timeout=300)
    _check(proc, os.path.join(site_dir, "compat", "__init__.py"))
    assert _pip(python, "uninstall", "-y", "-q", "ds-mesh").returncode == 0
    assert not os.path.exists(os.path.join(site_dir, startup.PTH_NAME))
    assert not os.path.exists(os.path.join(site_dir, "_ds_mesh_startup.py"))


def test_zipapp_gives_one_shim(tmp_path):
    """A zipapp carrying ds-mesh: the hook's ``compat`` is the archive's, the one the program imports."""
    app = tmp_path / "train.pyz"
    pth_dir = tmp_path / "site"
    pth_dir.mkdir()
    startup.write_pth(str(pth_dir))
    # run with -S: this venv's own ds_mesh.pth (the installed ds-mesh's hook) must not run first; the
    # archive's hook runs from the .pth of the site directory the program adds, as where ds-mesh is not installed
    import site

    main = (
        f"import site, sys\nsys.path.extend({site.getsitepackages()!r})\nsite.addsitedir({str(pth_dir)!r})\n" + PROGRAM
    )
    with zipfile.ZipFile(app, "w") as zf:
        zf.writestr("__main__.py", main)
        for module in ("_ds_mesh_startup.py", "_ds_mesh_doctor.py"):  # the distribution's top-level modules
            zf.write(os.path.join(ROOT, module), module)
        for package in ("compat", "mesh_core", "ds_mesh_advice"):
            for folder, _, files in os.walk(os.path.join(ROOT, package)):
                for name in files:
                    if name.endswith((".py", ".json")):
                        path = os.path.join(folder, name)
                        zf.write(path, os.path.relpath(path, ROOT))
    proc = subprocess.run(
        [sys.executable, "-S", str(app)], env=_env(), cwd=str(tmp_path), capture_output=True, text=True, timeout=300
    )
    _check(proc, os.path.join(str(app), "compat", "__init__.py"))


# a plain ZeRO-2 script, as a user runs it: no ds-mesh import, no destroy of anything but the world
ZERO2 = """
import json, os, sys
import torch
import torch.distributed as dist
import deepspeed
import deepspeed.comm.torch

sys.modules["deepspeed.comm.torch"].build_shm_op = lambda: None  # the test's own: no JIT build of the shm op (see test_shm_op.py)
net = torch.nn.Linear(8, 8)
config = {"train_batch_size": 8, "zero_optimization": {"stage": 2}, "zero_allow_untested_optimizer": True}
config.update(json.loads(sys.argv[1]))
engine, *_ = deepspeed.initialize(model=net, optimizer=torch.optim.SGD(net.parameters(), lr=0.1), config=config)
engine.backward(engine(torch.randn(2, 8)).sum())
engine.step()
mesh = getattr(engine, "mesh_device", None)
print(f"RANK {dist.get_rank()} MESH {None if mesh is None else mesh.spec.describe()}", flush=True)
dist.barrier()
dist.destroy_process_group()
"""
BANNER = "ds-mesh: this engine runs on the mesh"
IGNORED = '"mesh" section'


def _torchrun(python: str, tmp_path, extra: dict, section: "dict | None") -> subprocess.CompletedProcess:
    script = tmp_path / "zero2.py"
    script.write_text(ZERO2)
    env = {**_env(), **extra}
    if extra.get("DS_MESH") is None:
        env.pop("DS_MESH")
    config = json.dumps({} if section is None else {"mesh": section})
    return subprocess.run(
        [python, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "4", str(script), config],
        env=env,
        cwd=str(tmp_path),
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.multiprocess
def test_ds_mesh_1_right_after_the_install_says_the_mesh_once(editable_venv, tmp_path):
    """README set-up, then DS_MESH=1 torchrun of a plain ZeRO-2 script: one line names the mesh (HSDP
    here), engine.mesh_device is set on every rank."""
    proc = _torchrun(editable_venv, tmp_path, {"DS_MESH": "1"}, {"dp_replicate": 2, "dp_shard": 2})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    out = proc.stdout + proc.stderr
    assert out.count(BANNER) == 1, out[-3000:]
    line = next(line for line in out.splitlines() if BANNER in line)
    assert "dp_replicate=2 x dp_shard=2" in line and "HSDP" in line and "all 4 ranks" in line
    for rank in range(4):
        assert f"RANK {rank} MESH MeshSpec(dp_replicate=2, dp_shard=2; ranks 0..3 of world 4)" in proc.stdout
    assert IGNORED not in out


@pytest.mark.multiprocess
def test_a_mesh_section_without_the_shim_gets_one_warning(editable_venv, tmp_path):
    proc = _torchrun(editable_venv, tmp_path, {"DS_MESH": None}, {"dp_replicate": 2, "dp_shard": 2})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    out = proc.stdout + proc.stderr
    warnings_ = [line for line in out.splitlines() if IGNORED in line]
    assert len(warnings_) == 1 and "DS_MESH=1" in warnings_[0], out[-3000:]
    assert BANNER not in out
    for rank in range(4):
        assert f"RANK {rank} MESH None" in proc.stdout
