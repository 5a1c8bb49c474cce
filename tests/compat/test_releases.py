"""The declared deepspeed release range (compat/releases.py): install() refuses outside it with one
error naming the installed version and the range, before anything is patched; the DS_MESH=1 hook
warns once and runs plain deepspeed; install is all or nothing (a route failing midway, now or inside
a later ``import deepspeed``, leaves nothing patched and ``is_installed()`` False).

The refusals here move the range's bound or the reported version (the real deepspeed is in range);
tools/run_releases.py checks the same refusal on a real 0.16.9 and the supported releases' jobs.
Every test here holds on every supported release (marker ``releases``: CI runs them on 0.17.0 and
0.19.7 too); the routes they break are the same modules in all of them.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
from test_install import differences, snapshot_deepspeed

import compat.install as installer
from compat import logging_tree, releases, startup

pytestmark = [pytest.mark.deepspeed, pytest.mark.releases, pytest.mark.torch_releases]
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.parametrize(
    "version,ok",
    [
        ("0.16.9", False),
        ("0.17.0", True),
        ("0.18.4", True),
        ("0.19.6+edaa722", True),
        ("0.19.8", True),
        ("0.19.9", False),
        ("0.20.0", False),
        ("1.0", False),
        ("unknown", False),
    ],
)
def test_range(version, ok):
    assert releases.is_supported(version) is ok


def test_declared_range_is_the_same_everywhere():
    with open(os.path.join(ROOT, "pyproject.toml"), encoding="utf-8") as fh:
        assert f'"deepspeed{releases.SUPPORTED}"' in fh.read()
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as fh:
        assert f"deepspeed {releases.SUPPORTED}" in fh.read()
    assert releases.SUPPORTED == ">={},<={}".format(
        *(".".join(map(str, r)) for r in (releases.OLDEST, releases.NEWEST))
    )


@pytest.mark.parametrize("version", ["0.16.9", "0.20.0"])
def test_install_refuses_an_unsupported_release_and_patches_nothing(monkeypatch, version):
    import deepspeed

    installer.uninstall()
    before = snapshot_deepspeed()
    monkeypatch.setattr(deepspeed, "__version__", version)
    with pytest.raises(releases.UnsupportedDeepSpeedError) as err:
        installer.install()
    assert version in str(err.value) and releases.SUPPORTED in str(err.value)
    assert not installer.is_installed() and installer.patched_names() == [] and not logging_tree.is_installed()
    monkeypatch.undo()
    assert differences(before, snapshot_deepspeed()) == []
    installer.install()  # a supported release installs afterwards
    try:
        assert installer.is_installed() and installer.patched_names()
    finally:
        installer.uninstall()


def test_a_route_failing_midway_undoes_everything():
    import deepspeed  # noqa: F401

    installer.install()  # the post-import hooks are registered with the real routes
    installer.uninstall()
    before = snapshot_deepspeed()
    names = [name for name, _ in installer._APPLIERS]
    index = names.index(installer.TOPOLOGY_MODULE)  # after comm, groups and config were routed

    def broken(module):
        raise AttributeError(f"{module.__name__} lacks what the route needs")

    real = installer._APPLIERS[index]
    installer._APPLIERS[index] = (installer.TOPOLOGY_MODULE, broken)
    try:
        with pytest.raises(AttributeError, match="lacks what the route needs"):
            installer.install()
    finally:
        installer._APPLIERS[index] = real
    assert not installer.is_installed() and installer.patched_names() == [] and not logging_tree.is_installed()
    assert differences(before, snapshot_deepspeed()) == []
    installer.install()  # a retry installs for real (no half-installed state left to skip it)
    try:
        assert installer.is_installed() and installer.TOPOLOGY_MODULE + ".ProcessTopology" in installer.patched_names()
    finally:
        installer.uninstall()
    assert differences(before, snapshot_deepspeed()) == []


def run(code: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k not in ("DS_MESH", "PYTHONPATH")}
    base.update(PYTHONPATH=ROOT, DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1", **env)
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], env=base, cwd=ROOT, capture_output=True, text=True, timeout=300
    )


def test_a_route_failing_inside_a_later_import_leaves_plain_deepspeed():
    proc = run(
        """
        import compat.install as installer
        def broken(module):
            raise AttributeError("no such thing in this release")
        index = [n for n, _ in installer._APPLIERS].index(installer.TOPOLOGY_MODULE)
        installer._APPLIERS[index] = (installer.TOPOLOGY_MODULE, broken)
        installer.install()              # deepspeed not imported yet: the routes wait for it
        import deepspeed                 # the failure happens in here; the import goes on
        from deepspeed.utils import groups
        print("STATE", installer.is_installed(), installer.patched_names(), groups.__class__.__name__,
              groups._get_data_parallel_group.__module__)
    """,
        {},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "STATE False [] module deepspeed.utils.groups" in proc.stdout
    warned = [line for line in (proc.stdout + proc.stderr).splitlines() if "ds-mesh:" in line]
    assert len(warned) == 1 and "no such thing in this release" in warned[0] and "without the mesh" in warned[0]


@pytest.mark.parametrize(
    "rank, local_rank, warns",
    [("", "", True), ("3", "3", False), ("4", "0", True)],
    ids=["outside-a-job", "rank-3", "rank-4-first-on-its-node"],
)
def test_ds_mesh_hook_on_an_unsupported_release_warns_once_and_runs_plain_deepspeed(tmp_path, rank, local_rank, warns):
    """One warning per node (its local rank 0: each node's install may differ), not one per rank; every
    rank runs plain DeepSpeed."""
    site = tmp_path / "site"
    site.mkdir()
    startup.write_pth(str(site))
    proc = run(
        f"""
        import compat.releases as releases
        installed = releases.installed_version()
        major, minor, patch = releases.release(installed)
        releases.OLDEST = (major, minor, patch + 1)   # the installed release is now older than the range
        print("RANGE", installed, releases.OLDEST)
        import site
        site.addsitedir({str(site)!r})   # the ds_mesh.pth line, as at interpreter start
        import deepspeed
        import compat.install as installer
        print("HOOK", installer.is_installed(), installer.patched_names())
        try:
            installer.install()
        except releases.UnsupportedDeepSpeedError as err:
            print("RAISED", err)
        print("AFTER", installer.is_installed())
    """,
        {"DS_MESH": "1", "RANK": rank, "LOCAL_RANK": local_rank},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (line,) = [line for line in proc.stdout.splitlines() if line.startswith("RANGE")]
    installed = line.split()[1]
    major, minor, patch = releases.release(installed)
    declared = f">={major}.{minor}.{patch + 1},<={'.'.join(map(str, releases.NEWEST))}"
    warned = [line for line in (proc.stdout + proc.stderr).splitlines() if "ds-mesh:" in line]
    if warns:
        assert len(warned) == 1 and f"deepspeed is {installed}" in warned[0] and declared in warned[0], warned
    else:
        assert warned == [], warned
    assert "HOOK False []" in proc.stdout and "AFTER False" in proc.stdout
    (raised,) = [line for line in proc.stdout.splitlines() if line.startswith("RAISED")]
    assert f"installed deepspeed is {installed}" in raised and declared in raised
