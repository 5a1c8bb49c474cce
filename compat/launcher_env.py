"""The shim on every node of a DeepSpeed multi-node launch: the runner forwards ds-mesh's variables.

DeepSpeed's ``deepspeed`` launcher starts the other nodes through a *multi-node runner* (pdsh,
Open MPI, MPICH, Intel MPI, MVAPICH, Slurm), which passes on only the variables whose names start
with one of its prefixes (``PYTHON``, ``MLFLOW``, ``MV2``, ``UCX``, the accelerator's) plus the
lines of ``.deepspeed_env``. With the shim installed in the launching process (``DS_MESH=1`` and the
start-up hook, or ``compat.install()`` in a wrapper), :func:`runner_init_wrapper` adds ds-mesh's
variables to every runner's exports, the way the runner adds ``PYTHONPATH``:

- every variable whose name starts with one of :data:`FORWARDED_PREFIXES` (``DS_MESH``,
  ``DS_MESH_STRICT``, ... and ``DS_LOG_LEVELS``), with its value in the launching process;
- ``DS_MESH=1`` when the launching process has no ``DS_MESH`` (the shim was installed in code):
  the nodes run the shim too.

Slurm's runner passes ``srun --export=ALL,K=V,...``: ``ALL`` already carries the launching
environment, and ``srun`` splits that list at commas, so a value with a comma (``DS_LOG_LEVELS=
deepspeed=info,deepspeed.runtime.zero=debug``) is left to ``ALL`` instead of being cut there.

The runner adds its own prefixes' variables and ``.deepspeed_env`` after these, so a user's
``.deepspeed_env`` line for one of them wins. Without the shim nothing is added.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Mapping

SHIM_ENV = "DS_MESH"
SLURM = "slurm"  # the runner whose export list is comma-separated (srun --export=ALL,K=V)
# every environment variable ds-mesh reads starts with one of these (tests/compat/test_launcher_env.py
# checks the source for others)
FORWARDED_PREFIXES = ("DS_MESH", "DS_LOG_LEVELS")


def forwarded(environ: Mapping[str, str]) -> dict[str, str]:
    """The variables a multi-node runner carries to every node while the shim is installed."""
    out = {key: value for key, value in environ.items() if key.startswith(FORWARDED_PREFIXES)}
    out.setdefault(SHIM_ENV, "1")
    return out


def runner_init_wrapper(wrapped: Callable[..., Any], instance: Any, args: tuple, kwargs: dict) -> Any:
    """``MultiNodeRunner.__init__``: then export :func:`forwarded` of this process's environment."""
    result = wrapped(*args, **kwargs)
    comma_splits = getattr(instance, "name", None) == SLURM
    for key, value in forwarded(os.environ).items():
        if not (comma_splits and "," in value):
            instance.add_export(key, value)
    return result
