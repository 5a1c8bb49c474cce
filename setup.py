"""ds-mesh's one build customisation: every wheel, editable or not, carries ``ds_mesh.pth`` at the
top of site-packages, so ``DS_MESH=1`` works right after ``pip install`` and ``pip uninstall``
removes the hook with the package (see ``compat/startup.py``). Everything else is in pyproject.toml.
"""

from distutils.command.install_headers import install_headers  # noqa: E402

from setuptools import setup  # first: it provides ``distutils`` (Python >= 3.12 has none of its own)

PTH = "ds_mesh.pth"


class install_pth(install_headers):
    """Installs ``ds_mesh.pth`` beside the packages (purelib) instead of a headers directory.

    The one install step setuptools runs for regular *and* editable wheels (``editable_wheel``
    installs headers and scripts, but not ``data_files``), so the ``.pth`` is declared as the
    distribution's one "header"."""

    def run(self) -> None:
        target = self.get_finalized_command("install").install_lib
        self.mkpath(target)
        written, _ = self.copy_file(PTH, target)
        self.outfiles.append(written)


setup(headers=[PTH], cmdclass={"install_headers": install_pth})
