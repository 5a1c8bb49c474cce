"""The shim's word on ranks that never join (:mod:`compat.mixed_world`): its own bound on the wait for
a rank that never said it runs the shim (``DS_MESH_AGREE_TIMEOUT``), set while the shim is installed,
and the hint's grammar for one rank and for several. The multi-process runs: tests/e2e/test_mixed_world_gloo.py."""

from __future__ import annotations

import logging
from datetime import timedelta

import pytest

from compat import mixed_world
from mesh_core import AbsentRanksError, absence

pytestmark = pytest.mark.torch_releases


def _error(missing, quiet, timeout=timedelta(seconds=60)):
    return AbsentRanksError(
        "only some started", mesh="m", rank=0, arrived=[0], missing=missing, quiet=quiet, timeout=timeout
    )


@pytest.mark.parametrize(
    "value, seconds",
    [(None, 60.0), ("", 60.0), ("5", 5.0), (" 2.5 ", 2.5), ("0", None), ("off", None), ("inf", None), ("1e300", None)],
)
def test_the_bound_is_60_s_by_default_and_settable(monkeypatch, value, seconds):
    if value is None:
        monkeypatch.delenv(mixed_world.AGREE_ENV, raising=False)
    else:
        monkeypatch.setenv(mixed_world.AGREE_ENV, value)
    assert mixed_world.agree_bound() == (None if seconds is None else timedelta(seconds=seconds))


@pytest.mark.parametrize("value", ["abc", "-3", "nan"])
def test_a_bound_that_is_no_positive_number_is_reported_once_and_the_default_used(monkeypatch, caplog, value):
    monkeypatch.setenv(mixed_world.AGREE_ENV, value)
    monkeypatch.setattr(mixed_world, "_warned_values", set())
    for var in ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"):
        monkeypatch.delenv(var, raising=False)
    with caplog.at_level(logging.WARNING, logger="compat.mixed_world"):
        assert mixed_world.agree_bound() == mixed_world.agree_bound() == timedelta(seconds=60)
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 1 and f"DS_MESH_AGREE_TIMEOUT={value!r} is not a positive number of seconds" in warned[0]


def test_the_hint_speaks_of_one_rank_in_the_singular():
    text = mixed_world.hint(_error([1], [1]))
    assert text.startswith(
        "Likely cause: rank 1 runs DeepSpeed without the ds-mesh shim (it has built no mesh in "
        "this world, and did not say within 60 s that it runs the shim; DS_MESH_AGREE_TIMEOUT sets "
        "that wait: raise it if it does run the shim but starts far later than the others): "
        "DS_MESH=1 is not set in its "
        "environment, the start-up hook is not installed on its node, or the shim could not be "
        "installed there (the node's first rank says why)."
    ), text


def test_the_hint_speaks_of_several_ranks_in_the_plural_and_names_the_bound_only_when_it_gave_up(monkeypatch):
    monkeypatch.delenv(mixed_world.AGREE_ENV, raising=False)
    text = mixed_world.hint(_error([2, 3], [2, 3], timeout=timedelta(seconds=20)))  # the process-group timeout
    assert text.startswith(
        "Likely cause: ranks 2..3 run DeepSpeed without the ds-mesh shim (they have built no mesh "
        "in this world, and did not say within 20 s that they run the shim): DS_MESH=1 is not set "
        "in their environment, the start-up hook is not installed on their node, or the shim "
        "could not be installed there (the node's first rank says why)."
    ), text
    assert mixed_world.hint(_error([2, 3], [])) is None  # they build meshes: another layout, or late


def test_install_sets_the_bound_and_uninstall_takes_it_back(monkeypatch):
    import compat.install as installer

    monkeypatch.setenv(mixed_world.AGREE_ENV, "7")
    was = installer.is_installed()
    installer.install()
    try:
        assert absence.quiet_bound() == timedelta(seconds=7)
    finally:
        if not was:
            installer.uninstall()
    if not was:
        assert absence.quiet_bound() is None
