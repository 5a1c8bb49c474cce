import os
import sys

os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, os.path.dirname(__file__))

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
