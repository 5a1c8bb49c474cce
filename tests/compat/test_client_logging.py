"""A client's ``deepspeed.utils.logger.setLevel(...)`` (HF Trainer's ``log_level``, Lightning) under
the shim shows what plain deepspeed shows and reports what plain deepspeed reports; the v1 levels
(config ``"logging"``, ``DS_LOG_LEVELS``) still win. Plain = the real deepspeed with the shim uninstalled.

Behaviour by release: the DeepSpeed logger's ``setLevel`` moves the logger but not its handler in
every supported release (0.17.0 … 0.19.8); that handler is at WARNING from 0.17.6 on and at INFO
before (so plain 0.17.0 prints INFO by default; the shim's default stays WARNING);
``set_log_level_from_string`` (logger and handler) exists from 0.17.6 on.
"""

from __future__ import annotations

import contextlib
import io
import logging

import pytest

import compat.install as installer
from compat import logging_tree

pytestmark = [pytest.mark.deepspeed, pytest.mark.releases, pytest.mark.torch_releases]
LEVELS = (logging.DEBUG, logging.INFO, logging.WARNING, logging.ERROR)


def emit_all(ds_logger) -> None:
    ds_logger.debug("line debug")
    ds_logger.info("line info")
    ds_logger.warning("line warning")
    ds_logger.error("line error")


def observe(level: int) -> tuple[list[str], int, int, bool]:
    """What the DeepSpeed logger prints and reports after a client's setLevel(level)."""
    from deepspeed.utils import logger as ds_logger
    from deepspeed.utils.logging import should_log_le

    ds_logger.setLevel(level)
    out = io.StringIO()
    # plain deepspeed's handler holds the sys.stdout of its import; the shim's follows sys.stdout
    handlers = [h for h in ds_logger.handlers if type(h) is logging.StreamHandler]
    streams = [h.stream for h in handlers]
    for handler in handlers:
        handler.stream = out
    try:
        with contextlib.redirect_stdout(out):
            emit_all(ds_logger)
    finally:
        for handler, stream in zip(handlers, streams):
            handler.stream = stream
    shown = [line.rsplit(" ", 1)[-1] for line in out.getvalue().splitlines() if "line " in line]
    return shown, ds_logger.getEffectiveLevel(), ds_logger.level, should_log_le("info")


@pytest.mark.parametrize("level", LEVELS, ids=logging.getLevelName)
def test_client_set_level_shows_and_reports_what_plain_deepspeed_does(level):
    import deepspeed  # noqa: F401
    from deepspeed.utils import logger as ds_logger

    original = ds_logger.level
    installer.uninstall()
    try:
        plain = observe(level)
        ds_logger.setLevel(original)
        installer.install()
        shim = observe(level)
    finally:
        installer.uninstall()
        ds_logger.setLevel(original)
    assert shim == plain
    floor = max(h.level for h in ds_logger.handlers)  # the release's handler: WARNING from 0.17.6, INFO before
    names = ("debug", "info", "warning", "error")
    assert plain[0] == [n for n in names if logging.getLevelName(n.upper()) >= max(level, floor)]


def test_client_level_does_not_override_v1_levels(monkeypatch):
    import deepspeed  # noqa: F401

    monkeypatch.setenv("DS_LOG_LEVELS", "deepspeed=info")
    installer.install()
    try:
        logging_tree.apply_levels()
        shown, reported, _, _ = observe(logging.WARNING)  # HF Trainer's default ("passive")
        assert shown == ["info", "warning", "error"] and reported == logging.INFO
        monkeypatch.delenv("DS_LOG_LEVELS")
        logging_tree.configure_from_config({"logging": {"level": "error"}})
        shown, reported, _, _ = observe(logging.DEBUG)
        assert shown == ["error"] and reported == logging.ERROR
    finally:
        installer.uninstall()
