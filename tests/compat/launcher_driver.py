"""Run the real DeepSpeed launcher (what the ``deepspeed`` command runs: ``deepspeed.launcher.runner.main``)
once per launcher in this process, for 2 hosts, against fake ``pdsh`` / ``mpirun`` / ``srun`` executables
on PATH that record the command they are given.

Usage: ``python launcher_driver.py HOSTFILE [--install] LAUNCHER[@DIR] ...``: each launcher runs with
``DIR`` (default: the current one) as working directory, where a ``.deepspeed_env`` may lie;
``--install`` calls ``compat.install()`` first, as a wrapper around the launcher would. Prints
``SHIM <installed>`` (whether the shim is installed in this launcher process, as seen at the end).
"""

import os
import sys


def main() -> None:
    hostfile, *rest = sys.argv[1:]
    if rest and rest[0] == "--install":
        rest = rest[1:]
        import compat

        compat.install()
    from deepspeed.launcher.runner import main as launch

    home = os.getcwd()
    for item in rest:
        launcher, _, where = item.partition("@")
        os.chdir(where or home)
        launch(
            [
                "--hostfile",
                hostfile,
                "--no_ssh_check",
                "--master_addr",
                "127.0.0.1",
                "--launcher",
                launcher,
                "train.py",
                "--epochs",
                "1",
            ]
        )
    os.chdir(home)
    installer = sys.modules.get("compat.install") or sys.modules.get("_ds_mesh_compat.install")
    print("SHIM", bool(installer is not None and installer.is_installed()))


if __name__ == "__main__":
    main()
