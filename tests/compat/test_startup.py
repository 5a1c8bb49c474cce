"""The DS_MESH start-up hook: ``ds_mesh.pth`` written into a temporary site directory (never the
shared venv) and processed with ``site.addsitedir`` in a subprocess, as interpreter start-up does."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from compat import startup

pytestmark = pytest.mark.torch_releases

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def python(
    code: str, *, env_extra: dict[str, str], cwd: str, pythonpath: "str | None" = ROOT, flags: tuple[str, ...] = ()
) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("DS_MESH", "PYTHONPATH")}
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    env.update(env_extra)
    return subprocess.run(
        [sys.executable, *flags, "-c", code], env=env, cwd=cwd, capture_output=True, text=True, timeout=300
    )


@pytest.fixture
def site_dir(tmp_path):
    directory = tmp_path / "sitedir"
    directory.mkdir()
    startup.write_pth(str(directory))
    return str(directory)


PROBE = """
import site, sys
site.addsitedir({site!r})
heavy = sorted(m for m in ("torch", "numpy", "compat", "mesh_core", "deepspeed", "wrapt") if m in sys.modules)
print("LOADED", heavy, "_ds_mesh_startup" in sys.modules)
"""


@pytest.mark.parametrize("value", [None, "0", "off"])
def test_hook_off_imports_nothing(site_dir, tmp_path, value):
    """Off, the hook only registers the finder that watches for an ignored "mesh" section."""
    env = {} if value is None else {"DS_MESH": value}
    proc = python(PROBE.format(site=site_dir), env_extra=env, cwd=str(tmp_path))
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert "LOADED [] True" in proc.stdout


def test_the_shipped_pth_is_the_hook_line():
    """``ds_mesh.pth`` at the repository root is what every wheel installs (setup.py)."""
    with open(os.path.join(ROOT, startup.PTH_NAME), encoding="utf-8") as fh:
        assert fh.read() == startup.PTH_LINE


IGNORED_MESH = """
import site, sys, os
site.addsitedir({site!r})
import deepspeed
config = {{"train_batch_size": 4, "mesh": {{"dp_replicate": 2, "dp_shard": 2}}}}
for _ in range(2):
    try:
        deepspeed.initialize(model=None, config=config)
    except Exception as err:
        print("RAISED", type(err).__name__)
"""


@pytest.mark.deepspeed
@pytest.mark.parametrize("rank", ["0", "1"])
def test_ignored_mesh_section_warns_once_on_rank_0(site_dir, tmp_path, rank):
    """Shim off, hook present: a "mesh" section plain DeepSpeed ignores gets one warning naming DS_MESH=1
    (rank 0 only); deepspeed.initialize itself runs unchanged (here: it refuses the missing model)."""
    proc = python(
        IGNORED_MESH.format(site=site_dir), env_extra={"DS_ACCELERATOR": "cpu", "RANK": rank}, cwd=str(tmp_path)
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("RAISED") == 2
    lines = [line for line in proc.stderr.splitlines() if '"mesh" section' in line]
    if rank == "0":
        assert len(lines) == 1 and "DS_MESH=1" in lines[0] and "'dp_replicate': 2" in lines[0], proc.stderr
    else:
        assert lines == [], proc.stderr


def test_hook_on_defers_everything_until_deepspeed_is_imported(site_dir, tmp_path):
    proc = python(PROBE.format(site=site_dir), env_extra={"DS_MESH": "1"}, cwd=str(tmp_path))
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert "LOADED [] True" in proc.stdout  # the finder is registered; no torch, no compat yet


def test_unknown_value_warns_in_one_line(site_dir, tmp_path):
    proc = python(PROBE.format(site=site_dir), env_extra={"DS_MESH": "yes-please"}, cwd=str(tmp_path))
    assert proc.returncode == 0
    lines = proc.stderr.splitlines()
    quiet = python(
        PROBE.format(site=site_dir), env_extra={"DS_MESH": "yes-please", "OMPI_COMM_WORLD_RANK": "2"}, cwd=str(tmp_path)
    )
    assert quiet.returncode == 0 and quiet.stderr == "", quiet.stderr  # once per job: rank 0 says it
    assert len(lines) == 1, proc.stderr
    assert "DS_MESH='yes-please' is not understood" in lines[0] and "DS_MESH=1" in lines[0]
    assert "LOADED []" in proc.stdout


def test_left_over_pth_is_silent_when_the_package_is_gone(site_dir, tmp_path):
    """After ``pip uninstall`` only the .pth remains: -S leaves the venv (and ds-mesh) off sys.path."""
    code = (
        PROBE.format(site=site_dir) + "import importlib.util; print('GONE', importlib.util.find_spec('compat') is None)"
    )
    proc = python(code, env_extra={"DS_MESH": "1"}, cwd=str(tmp_path), pythonpath=None, flags=("-S",))
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert "LOADED [] False" in proc.stdout and "GONE True" in proc.stdout


def test_write_and_remove_pth_from_the_command_line(tmp_path):
    def cli(*args):
        return subprocess.run(
            [sys.executable, "-m", "compat.install", *args],
            capture_output=True,
            text=True,
            env={**os.environ, "PYTHONPATH": ROOT},
            timeout=300,
        )

    directory = str(tmp_path)
    pth = os.path.join(directory, "ds_mesh.pth")
    write = cli("--write-pth", directory)
    assert write.returncode == 0 and os.path.isfile(pth) and pth in write.stdout, write.stderr
    remove = cli("--remove-pth", directory)
    assert remove.returncode == 0 and not os.path.exists(pth) and f"removed {pth}" in remove.stdout
    again = cli("--remove-pth", directory)
    assert again.returncode == 0 and "nothing to remove" in again.stdout
    both = cli("--write-pth", directory, "--remove-pth", directory)
    assert both.returncode == 2 and "not allowed with" in both.stderr


USER_SCRIPT = """
import site, sys
site.addsitedir({site!r})
{first}
print("USER", compat.MARKER)
import _ds_mesh_compat.install as shim
from deepspeed.utils import groups
print("SHIM", shim.is_installed(), groups._get_data_parallel_group.__module__)
"""


@pytest.mark.deepspeed
@pytest.mark.parametrize("first", ["import compat\nimport deepspeed", "import deepspeed\nimport compat"])
def test_users_own_compat_module_still_imports(site_dir, tmp_path, first):
    user = tmp_path / "user"
    user.mkdir()
    (user / "compat.py").write_text("MARKER = 'the user'\n")
    script = user / "train.py"
    script.write_text(USER_SCRIPT.format(site=site_dir, first=first))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(DS_MESH="1", PYTHONPATH=ROOT)
    proc = subprocess.run(
        [sys.executable, str(script)], env=env, cwd=str(user), capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "USER the user" in proc.stdout
    assert "SHIM True _ds_mesh_compat.groups" in proc.stdout


@pytest.mark.deepspeed
def test_hook_on_installs_the_shim_when_deepspeed_is_imported(site_dir, tmp_path):
    code = textwrap.dedent(f"""
        import site, sys
        site.addsitedir({site_dir!r})
        import deepspeed
        import compat.install
        print("SHIM", compat.install.is_installed(), sys.modules["compat"].__file__)
    """)
    proc = python(code, env_extra={"DS_MESH": "1"}, cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"SHIM True {os.path.join(ROOT, 'compat', '__init__.py')}" in proc.stdout


def test_the_shim_takes_the_place_of_the_hooks_watcher_and_uninstall_puts_it_back(monkeypatch):
    """DS_MESH off at start-up (the hook watches ``deepspeed.initialize`` for an ignored ``"mesh"``
    section), then ``compat.install()``: the shim wraps the real ``initialize``, not the watcher (which
    would warn that the section it reads is ignored, and stand between the user's call and the shim)."""
    import importlib
    import types

    import _ds_mesh_startup as hook
    from compat.install_patches import PatchSet

    install = importlib.import_module("compat.install")  # the module (compat.install is also a function)

    module = types.ModuleType("a_deepspeed")

    def initialize(*args, **kwargs):
        return "real"

    module.initialize = initialize
    hook.watch_initialize(module)
    watcher = module.initialize
    assert watcher is not initialize and watcher._ds_mesh_watch
    patches = PatchSet(packages=("a_deepspeed",))
    monkeypatch.setattr(install, "_patches", patches)
    install._route_initialize(module)
    assert module.initialize.__wrapped__ is initialize
    patches.restore()
    assert module.initialize is watcher


@pytest.mark.parametrize(
    "environ, rank, local",
    [
        ({}, 0, 0),
        ({"RANK": "3", "LOCAL_RANK": "1"}, 3, 1),
        ({"RANK": " ", "SLURM_PROCID": "5", "SLURM_LOCALID": "2"}, 5, 2),
        ({"OMPI_COMM_WORLD_RANK": "7", "OMPI_COMM_WORLD_LOCAL_RANK": "0"}, 7, 0),
        ({"PMI_RANK": "x"}, 0, 0),
    ],
)
def test_the_hooks_warnings_know_the_rank_from_every_launchers_variables(environ, rank, local):
    import _ds_mesh_startup as hook

    assert (hook.launcher_rank(environ=environ), hook.launcher_rank(hook.LOCAL_RANK_VARS, environ)) == (rank, local)
