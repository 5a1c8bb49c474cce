import os
import shutil
import sys
import tempfile

os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.setdefault("OMP_NUM_THREADS", "1")
# One extensions directory for the run, as a user's jobs share torch's cache: DeepSpeed's shm op is
# JIT-built by the first DeepSpeed job that needs it (half a minute and more on 2 cores) and loaded by
# every later one, whichever test launched it. A test about the build names a directory of its own.
# Removed at the end of the run; a directory given by the caller (CI sets one) is kept as it is.
_RUN_EXTENSIONS = None
if not os.environ.get("TORCH_EXTENSIONS_DIR"):
    _RUN_EXTENSIONS = tempfile.mkdtemp(prefix="ds_mesh_tests_torch_extensions_")
    os.environ["TORCH_EXTENSIONS_DIR"] = _RUN_EXTENSIONS
sys.path.insert(0, os.path.dirname(__file__))

# tests/<package>/ folders: a test may import a test module of another folder (``from test_layout import specs``)
for _folder in ("mesh_core", "compat", "codemods", "e2e"):
    sys.path.insert(1, os.path.join(os.path.dirname(__file__), _folder))

import pytest  # noqa: E402


@pytest.fixture
def shim():
    """The shim installed (deepspeed imported) for one test, uninstalled after."""
    import importlib

    import deepspeed  # noqa: F401

    installer = importlib.import_module("compat.install")  # the module (compat.install may name the function)
    installer.install()
    try:
        yield installer
    finally:
        installer.uninstall()


@pytest.fixture
def world(monkeypatch):
    """Rank 1 of a fake world of 4 with deepspeed.comm on top (deepspeed needs LOCAL_RANK)."""
    from fakepg import FAKE_RANK, FAKE_WORLD, fake_world

    monkeypatch.setenv("LOCAL_RANK", str(FAKE_RANK))
    monkeypatch.setenv("RANK", str(FAKE_RANK))
    monkeypatch.setenv("WORLD_SIZE", str(FAKE_WORLD))
    with fake_world(FAKE_RANK, FAKE_WORLD, deepspeed_comm=True):
        yield


@pytest.fixture(autouse=True)
def _forget_engines():
    """Engines a test built under the shim do not outlive it: compat's wrong-grid protection counts
    live engines, so one left registered would change what a later test's legacy getters serve."""
    yield
    scope = sys.modules.get("compat.engine_scope")
    if scope is not None and scope._engines:
        scope._engines.clear()
        scope.settle()


def pytest_addoption(parser):
    parser.addoption(
        "--fast",
        action="store_true",
        help="leave out the multi-process runs (gloo worlds under torchrun or spawn): unit and property tests only",
    )


def pytest_collection_modifyitems(config, items):
    if not config.getoption("--fast"):
        return
    slow = [item for item in items if "multiprocess" in item.keywords]
    if slow:
        config.hook.pytest_deselected(items=slow)
        items[:] = [item for item in items if "multiprocess" not in item.keywords]


def pytest_unconfigure(config):
    if _RUN_EXTENSIONS is not None:
        shutil.rmtree(_RUN_EXTENSIONS, ignore_errors=True)
