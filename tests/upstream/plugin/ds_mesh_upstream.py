"""pytest plugin of the upstream runner (``-p ds_mesh_upstream``), loaded in both modes.

Gives each concurrent stream its own master-port range: the harness's ``get_master_port`` starts
at 29500 (+1000 per xdist worker), so a legacy and a shim run side by side would race for the
same ports; ``DS_MESH_UPSTREAM_PORT_BASE`` moves this stream's base.
"""
import os
import sys


def _move_ports() -> None:
    base = os.environ.get("DS_MESH_UPSTREAM_PORT_BASE")
    common = sys.modules.get("unit.common")
    if base and common is not None and hasattr(common, "get_master_port"):
        common.get_master_port.__defaults__ = (int(base), 1000)


def pytest_collection_finish(session):  # noqa: ARG001
    _move_ports()


def pytest_runtest_setup(item):  # noqa: ARG001
    _move_ports()
