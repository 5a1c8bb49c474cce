"""Start-up hook of the upstream runner's shim runs (on PYTHONPATH only for those runs).

Every interpreter of a shim run (the pytest process, ``--forked`` children, the harness's
forkserver / spawn workers) installs the shim through the project's own ``DS_MESH=1`` mechanism
before any test module imports ``deepspeed``. ``DS_MESH_UPSTREAM_PROBE`` names a file each
installing process appends its pid to, so the runner can prove the shim was active in workers.
"""

import os

if os.environ.get("DS_MESH", "").strip().lower() in ("1", "true", "yes", "on"):
    import compat.install as _install

    if _install.install_from_env():
        _probe = os.environ.get("DS_MESH_UPSTREAM_PROBE")
        if _probe:
            with open(_probe, "a", encoding="utf-8") as _fh:
                _fh.write(f"{os.getpid()}\n")
