"""DeepSpeed's logging under the shim: one ``deepspeed`` tree with per-module loggers and levels
(compat/logging_tree.py). Engines run in a 1-process gloo world; records are collected by a
handler on the tree's root."""

from __future__ import annotations

import contextlib
import logging
import sys
import warnings

import pytest
import torch
import torch.distributed as dist

import compat.install as installer
from compat import logging_tree
from compat.deprecation import LegacyAPIDeprecationWarning

pytestmark = [pytest.mark.deepspeed, pytest.mark.torch_releases]

BASE = {"train_batch_size": 2, "zero_optimization": {"stage": 2}, "zero_allow_untested_optimizer": True}


@pytest.fixture
def shim(monkeypatch):
    import deepspeed  # noqa: F401

    monkeypatch.delenv(logging_tree.ENV_VAR, raising=False)
    installer.install()
    try:
        yield
    finally:
        installer.uninstall()


class Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def below_warning(self) -> set[str]:
        return {r.name for r in self.records if r.levelno < logging.WARNING}


@contextlib.contextmanager
def collected():
    handler = Collect()
    root = logging.getLogger("deepspeed")
    root.addHandler(handler)
    try:
        yield handler
    finally:
        root.removeHandler(handler)


@contextlib.contextmanager
def gloo_world(monkeypatch):
    """A 1-process gloo world with deepspeed.comm on top."""
    import deepspeed.comm as dscomm

    for key, value in dict(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1").items():
        monkeypatch.setenv(key, value)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    monkeypatch.setattr(sys.modules["deepspeed.comm.torch"], "build_shm_op", lambda: None)
    try:
        dscomm.init_distributed(dist_backend="gloo", dist_init_required=False)
        yield
    finally:
        dist.barrier()
        dscomm.destroy_process_group()
        if dist.is_initialized():
            dist.destroy_process_group()


def train(monkeypatch, config, steps=2):
    """Records of a tiny engine's initialize + ``steps`` training steps."""
    import deepspeed

    torch.manual_seed(0)
    with gloo_world(monkeypatch), collected() as handler:
        model = torch.nn.Linear(4, 4)
        engine, *_ = deepspeed.initialize(
            model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), config={**BASE, **config}
        )
        for _ in range(steps):
            engine.backward(engine(torch.randn(2, 4)).sum())
            engine.step()
    return handler


def test_engine_records_carry_their_module_names(shim, monkeypatch):
    handler = train(monkeypatch, {"logging": {"level": "debug"}})
    names = {r.name for r in handler.records}
    assert {"deepspeed.runtime.engine", "deepspeed.runtime.zero.stage_1_and_2"} <= names
    assert all(n.startswith("deepspeed.") for n in names), names  # no shared "DeepSpeed" logger
    for record in handler.records:  # the record's location is in the module it is named after
        if record.name.startswith("deepspeed.runtime"):
            assert record.pathname.replace("\\", "/").endswith(record.name.replace(".", "/") + ".py"), record


def test_default_is_warning_everywhere(shim, monkeypatch):
    handler = train(monkeypatch, {})
    assert handler.below_warning() == set()
    assert logging.getLogger("deepspeed").getEffectiveLevel() == logging.WARNING


def test_per_module_levels_from_the_config(shim, monkeypatch):
    handler = train(monkeypatch, {"logging": {"level": "warning", "modules": {"deepspeed.runtime.engine": "info"}}})
    assert handler.below_warning() == {"deepspeed.runtime.engine"}
    assert {r.levelno for r in handler.records if r.name == "deepspeed.runtime.engine"} >= {logging.INFO}


def test_per_module_levels_from_the_environment_beat_legacy_log_level(shim, monkeypatch):
    monkeypatch.setenv("DS_LOG_LEVELS", "deepspeed=warning,deepspeed.runtime.zero=debug")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("ignore")
        warnings.filterwarnings("always", message='TODOV1: ds_config "log_level"', category=LegacyAPIDeprecationWarning)
        handler = train(monkeypatch, {"log_level": "info"})
    assert [w.filename for w in caught] == [__file__]  # reported at the user's deepspeed.initialize call
    selected = handler.below_warning()
    assert selected and all(n.startswith("deepspeed.runtime.zero") for n in selected), selected
    assert "deepspeed.runtime.zero.stage_1_and_2" in selected


def test_legacy_log_level_still_sets_the_level(shim, monkeypatch):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LegacyAPIDeprecationWarning)
        handler = train(monkeypatch, {"log_level": "info"}, steps=1)
    assert {"deepspeed.runtime.engine", "deepspeed.runtime.zero.stage_1_and_2"} <= handler.below_warning()


def test_timers_print_at_default_warning_when_wall_clock_breakdown_is_on(shim, monkeypatch, capsys):
    handler = train(monkeypatch, {"wall_clock_breakdown": True})
    timers = [r for r in handler.records if r.name == "deepspeed.timers"]
    assert handler.below_warning() == {"deepspeed.timers"}
    assert any("fwd" in r.getMessage() and "time (ms)" in r.getMessage() for r in timers)
    assert "[deepspeed.timers]" in capsys.readouterr().out  # the tree's own stdout handler printed them


def test_op_builder_output_arrives_as_records(shim, capsys):
    from deepspeed.ops.op_builder.fused_adam import FusedAdamBuilder

    builder = FusedAdamBuilder()
    with collected() as handler:
        builder.warning("custom op warning")
        assert builder.command_exists("no-such-command-for-ds-mesh") is False
    assert builder.error_log == "custom op warning"
    messages = {(r.name, r.levelname, r.getMessage()) for r in handler.records}
    assert ("deepspeed.ops.op_builder.fused_adam", "WARNING", "custom op warning") in messages
    assert any(
        name.startswith("deepspeed.ops.")
        and level == "WARNING"
        and "no-such-command-for-ds-mesh" in text
        and "\x1b" not in text
        and "[WARNING]" not in text
        for name, level, text in messages
    ), messages
    assert "\x1b[93m" not in capsys.readouterr().out


def test_op_builder_prints_without_the_shim(capsys):
    import deepspeed  # noqa: F401
    from deepspeed.ops.op_builder.fused_adam import FusedAdamBuilder

    assert not installer.is_installed()
    FusedAdamBuilder().warning("plain print")
    assert "[WARNING] \x1b[0m plain print" in capsys.readouterr().out


def snapshot():
    import deepspeed.ops.op_builder.builder as builder
    import deepspeed.runtime.engine as engine
    import deepspeed.utils as utils
    import deepspeed.utils.logging as ds_logging
    import deepspeed.utils.timer as timer

    ds_logger = ds_logging.logger
    root = logging.getLogger("deepspeed")
    return {
        "logger": (
            id(ds_logger),
            type(ds_logger),
            list(ds_logger.handlers),
            ds_logger.level,
            ds_logger.propagate,
            [h.level for h in ds_logger.handlers],
        ),
        "root": (root.level, root.propagate, list(root.handlers)),
        "functions": (
            ds_logging.print_dist,
            ds_logging.set_log_level_from_string,
            utils.set_log_level_from_string,
            timer.print_dist,
            engine.set_log_level_from_string,
            builder.OpBuilder.__dict__["warning"],
            engine.DeepSpeedEngine.__dict__["_configure_with_arguments"],
        ),
        "print": [
            name
            for name, m in sys.modules.items()
            if name.startswith("deepspeed") and m is not None and "print" in vars(m)
        ],
        "levels": {name: logging.getLogger(name).level for name in ("deepspeed.timers", "deepspeed.runtime.engine")},
    }


def test_uninstall_restores_loggers_handlers_and_functions(monkeypatch):
    import deepspeed
    import deepspeed.ops.op_builder.fused_adam  # noqa: F401
    import deepspeed.utils.logging as ds_logging

    before = snapshot()
    monkeypatch.setenv("DS_LOG_LEVELS", "deepspeed.runtime.engine=debug")
    installer.install()
    try:
        during = snapshot()
        assert during["logger"][1] is logging_tree.RoutingLogger and during["logger"][0] == before["logger"][0]
        assert during["functions"][0] is not before["functions"][0] and during["print"]
        deepspeed.utils.set_log_level_from_string("error")  # legacy API: moves the tree's root
        ds_logging.logger.setLevel(logging.INFO)  # the logger only: its handler still drops below ERROR
        assert logging.getLogger("deepspeed").level == logging.ERROR
        assert ds_logging.logger.level == logging.INFO
        logging_tree.configure_from_config({"wall_clock_breakdown": True})
        assert logging.getLogger("deepspeed.timers").level == logging.INFO
    finally:
        installer.uninstall()
    assert snapshot() == before


def test_launcher_defaults_to_warning_and_forwards_its_level(shim, monkeypatch):
    from deepspeed.launcher import runner

    # the launcher sets DS_LOG_LEVELS: recorded here (pytest's delenv records nothing for an unset
    # variable) so that the test ends with it as it was
    monkeypatch.setenv("DS_LOG_LEVELS", "")
    monkeypatch.delenv("DS_LOG_LEVELS")
    with collected() as handler:
        args = runner.parse_args(["train.py"])
        assert args.log_level == "warning" and handler.records == []
        assert logging_tree.parse_env(__import__("os").environ["DS_LOG_LEVELS"]) == {"deepspeed": logging.WARNING}
        monkeypatch.setenv("DS_LOG_LEVELS", "deepspeed.runtime.engine=debug")
        args = runner.parse_args(["--log_level", "info", "train.py"])
    assert args.log_level == "info"
    forwarded = __import__("os").environ["DS_LOG_LEVELS"]
    assert forwarded == "deepspeed=info,deepspeed.runtime.engine=debug"
    assert [(r.name, r.levelno) for r in handler.records] == [("deepspeed.launcher", logging.WARNING)]
    assert "TODOV1: --log_level" in handler.records[0].getMessage()


def test_bad_levels_name_the_value():
    with pytest.raises(ValueError, match="'loud' is not a log level; valid levels are debug, info"):
        logging_tree.levels_from_config({"logging": {"modules": {"deepspeed.runtime.engine": "loud"}}})
    with pytest.raises(ValueError, match="unknown keys \\['levels'\\]"):
        logging_tree.levels_from_config({"logging": {"levels": "info"}})
    assert logging_tree.parse_env("info, deepspeed.runtime.zero = DEBUG") == {
        "deepspeed": logging.INFO,
        "deepspeed.runtime.zero": logging.DEBUG,
    }
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logging.getLogger("compat").addHandler(handler)
    try:
        assert logging_tree.parse_env("deepspeed=verbose,deepspeed.ops=error") == {"deepspeed.ops": logging.ERROR}
    finally:
        logging.getLogger("compat").removeHandler(handler)
    assert len(records) == 1 and "'verbose' is not a log level" in records[0].getMessage()


def test_plain_logging_configuration_is_kept(shim):
    logging.getLogger("deepspeed").setLevel(logging.INFO)  # the user's own configuration, after install
    logging.getLogger("deepspeed.runtime.engine").setLevel(logging.DEBUG)
    logging_tree.configure_from_config({"wall_clock_breakdown": True})  # what an engine's init does
    assert logging.getLogger("deepspeed").level == logging.INFO
    assert logging.getLogger("deepspeed.runtime.engine").level == logging.DEBUG
    logging_tree.configure_from_config({"logging": {"level": "error"}})  # an explicit level wins
    assert logging.getLogger("deepspeed").level == logging.ERROR
    logging.getLogger("deepspeed.runtime.engine").setLevel(logging.NOTSET)


def test_inference_v2_logger_joins_the_tree(shim):
    import deepspeed.inference.v2.logging as v2_logging

    v2_logger = v2_logging.inference_logger()
    assert isinstance(v2_logger, logging_tree.RoutingLogger)
    with collected() as handler:
        v2_logger.warning("from the inference engine")
    assert [(r.name, r.getMessage()) for r in handler.records] == [("deepspeed", "from the inference engine")]
    installer.uninstall()
    assert type(v2_logger) is logging.Logger


LAUNCH = """
import base64, json, sys
{install}
from deepspeed.launcher import launch
world = base64.urlsafe_b64encode(json.dumps({{"localhost": [0]}}).encode()).decode()
sys.argv = ["launch", "--world_info=" + world, "--master_addr=127.0.0.1", "--master_port=29561", {child!r}]
launch.main()
"""


@pytest.mark.parametrize("shimmed", [True, False])
def test_launcher_is_quiet_and_forwards_its_level_to_the_training_process(shimmed, tmp_path):
    import os
    import subprocess

    child = tmp_path / "child.py"
    child.write_text("import os\nprint('CHILD', os.environ.get('DS_LOG_LEVELS', '<unset>'))\n")
    code = LAUNCH.format(install="import compat; compat.install()" if shimmed else "", child=str(child))
    env = {k: v for k, v in os.environ.items() if k != "DS_LOG_LEVELS"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    info_lines = [line for line in proc.stdout.splitlines() if "[INFO]" in line]
    if shimmed:
        assert "CHILD deepspeed=warning" in proc.stdout and info_lines == []
    else:  # legacy: the launcher logs at INFO and the children learn nothing
        assert "CHILD <unset>" in proc.stdout and info_lines


def test_a_level_set_after_disabled_calls_takes_effect_at_once(shim):
    """DeepSpeed's logger answers disabled calls without looking up its caller while no logger of the
    tree is enabled; a level set later (logging clears that answer) is honoured by the next call."""
    from deepspeed.utils.logging import logger as ds_logger

    code = compile("logger.debug('probe %d', n)", "<deepspeed module>", "exec")

    def call(module, n):
        exec(code, {"__name__": module, "logger": ds_logger, "n": n})

    target = logging.getLogger("deepspeed.runtime.engine")
    old = target.level
    with collected() as handler:
        for n in range(3):
            call("deepspeed.runtime.engine", n)
        target.setLevel(logging.DEBUG)
        try:
            call("deepspeed.runtime.engine", 9)
            call("deepspeed.runtime.zero.stage3", 10)  # its own logger is still at WARNING
        finally:
            target.setLevel(old)
        call("deepspeed.runtime.engine", 11)
    assert [(r.name, r.getMessage()) for r in handler.records] == [("deepspeed.runtime.engine", "probe 9")]
