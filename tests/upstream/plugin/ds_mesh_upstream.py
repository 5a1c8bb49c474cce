"""pytest plugin of the upstream runner (``-p ds_mesh_upstream``), loaded in both modes.

Gives each concurrent stream its own master-port range: the harness's ``get_master_port`` starts
at 29500 (+1000 per xdist worker), so a legacy and a shim run side by side would race for the
same ports; ``DS_MESH_UPSTREAM_PORT_BASE`` moves this stream's base.

``DS_MESH_UPSTREAM_DEEPSPEED_PROBE`` names a file each pytest process appends the
``deepspeed.__file__`` its collected tests imported to (the runner checks a run of an alternate
deepspeed location really tested that copy).
"""

import os
import sys


def _move_ports() -> None:
    base = os.environ.get("DS_MESH_UPSTREAM_PORT_BASE")
    common = sys.modules.get("unit.common")
    if base and common is not None and hasattr(common, "get_master_port"):
        common.get_master_port.__defaults__ = (int(base), 1000)


def _record_deepspeed() -> None:
    probe = os.environ.get("DS_MESH_UPSTREAM_DEEPSPEED_PROBE")
    if not probe:
        return
    module = sys.modules.get("deepspeed")
    if module is None:  # no collected test imported it yet: the same sys.path decides for them
        import deepspeed as module
    with open(probe, "a", encoding="utf-8") as fh:
        fh.write(f"{module.__file__}\n")


def pytest_collection_finish(session):  # noqa: ARG001
    _move_ports()
    _record_deepspeed()


def pytest_runtest_setup(item):  # noqa: ARG001
    _move_ports()
