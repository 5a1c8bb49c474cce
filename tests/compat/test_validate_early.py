"""Issue 21, item 4: bad input is reported before any process group exists.

- one table of the on/off environment values (``DS_MESH``, ``DS_MESH_STRICT``: the one parser,
  ``_ds_mesh_startup.switch_on``), ``DS_LOG_LEVELS`` entries, the ``"logging"`` section and the
  ``"mesh"`` section's world-free checks;
- a fresh process under the shim: ``deepspeed.initialize`` with a bad ``"mesh"`` value raises while
  ``torch.distributed.is_initialized()`` is still False; a value that needs the world size raises
  right after ``init_distributed``, with no group but the world created.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import socket
import subprocess
import sys

import pytest

import _ds_mesh_startup
from compat import group_trace, logging_tree
from compat.engine_spec import check_before_world
from mesh_core import MeshSpecError

pytestmark = pytest.mark.torch_releases

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _switch(name):
    return lambda value: _ds_mesh_startup.switch_on(name, "test", {} if value is None else {name: value})


def _strict(value):
    return group_trace.strict_requested({group_trace.STRICT_ENV: value})


def _install_from_env(value):
    installer = importlib.import_module("compat.install")  # compat.install may name the function

    return installer.install_from_env({"DS_MESH": value})


def _log_levels(text):
    return logging_tree.parse_env(text)  # cached per text: one warning per value, however often it is read


def _logging_section(section):
    return logging_tree.levels_from_config({"logging": section})


def _mesh_section(section):
    check_before_world({"mesh": section} if section is not None else {})
    return "ok"


D, I, E = logging.DEBUG, logging.INFO, logging.ERROR
# (parser, input, expected result or the text of the error it raises, text of the one warning or None)
CASES = [
    # DS_MESH / DS_MESH_STRICT: one parser, the same words, an odd value warns once and is off
    (_switch("DS_MESH"), None, False, None),
    (_switch("DS_MESH"), "", False, None),
    (_switch("DS_MESH"), "1", True, None),
    (_switch("DS_MESH"), " Yes ", True, None),
    (_switch("DS_MESH"), "off", False, None),
    (_switch("DS_MESH"), "enabled", False, "DS_MESH='enabled' is not understood"),
    (_switch("DS_MESH_STRICT"), "true", True, None),
    (_switch("DS_MESH_STRICT"), "0", False, None),
    (_switch("DS_MESH_STRICT"), "no", False, None),
    (_strict, "on", True, None),
    (_strict, "enabled", False, "DS_MESH_STRICT='enabled' is not understood"),
    (_strict, "2", False, "DS_MESH_STRICT='2' is not understood"),
    (_install_from_env, "2", False, "DS_MESH='2' is not understood"),
    (_install_from_env, "false", False, None),
    # DS_LOG_LEVELS: one name=level per entry; a malformed entry is warned and ignored, the rest apply
    (_log_levels, "deepspeed=info=debug", {}, "'info=debug' is not a log level"),
    (_log_levels, "deepspeed=info=debug,deepspeed.ops=error", {"deepspeed.ops": E}, "is not a log level"),
    (_log_levels, "deep speed=info", {}, "'deep speed' is not a logger name"),
    (_log_levels, "info, deepspeed.runtime.zero = DEBUG", {"deepspeed": I, "deepspeed.runtime.zero": D}, None),
    (_log_levels, "=debug", {"deepspeed": D}, None),
    (_log_levels, "deepspeed=loud", {}, "'loud' is not a log level"),
    # the config's "logging" section
    (_logging_section, {"modules": []}, ValueError('config "logging.modules" must map logger names to levels'), None),
    (_logging_section, {"modules": ""}, ValueError('config "logging.modules" must map logger names to levels'), None),
    (_logging_section, {"modules": {"deepspeed.ops": "error"}}, {"deepspeed.ops": E}, None),
    (_logging_section, {"modules": None, "level": "info"}, {"deepspeed": I}, None),
    # the "mesh" section: every check that needs no world size
    (_mesh_section, None, "ok", None),
    (_mesh_section, {"dp": 2, "ranks": [0, 5]}, "ok", None),  # rank 5 needs the world size: checked later
    (_mesh_section, [2, 2], MeshSpecError("config 'mesh' section must be a dict, got list"), None),
    (
        _mesh_section,
        {"DP": 2},
        MeshSpecError("unknown key(s) ['DP'] in config 'mesh'; 'DP' (did you mean 'dp'?)"),
        None,
    ),
    (_mesh_section, {"dp": "2"}, MeshSpecError("config 'mesh.dp'='2' is a string; write the number 2"), None),
    (_mesh_section, {"tp": True}, MeshSpecError("not a boolean"), None),
    (_mesh_section, {"tp": 0}, MeshSpecError('write "auto" to infer this dim'), None),
    (_mesh_section, {"data_before_expert": "false"}, MeshSpecError("write true or false"), None),
    (_mesh_section, {"ranks": "0,1"}, MeshSpecError("write a list of global ranks"), None),
    (_mesh_section, {"ranks": [0, -1]}, MeshSpecError("ranks [-1] are out of range"), None),
    (_mesh_section, {"ranks": [1, 1]}, MeshSpecError("ranks contain duplicates [1]"), None),
    (_mesh_section, {"order": ["dp", "data"]}, MeshSpecError("order has unknown dim(s) ['data']"), None),
    (_mesh_section, {"order": ["dp", "dp"]}, MeshSpecError("repeats dim(s) ['dp']"), None),
]


@pytest.mark.parametrize(
    "parser, value, expected, warning", CASES, ids=[f"{getattr(c[0], '__name__', 'switch')}-{c[1]!r}" for c in CASES]
)
def test_parsing_table(parser, value, expected, warning, caplog, monkeypatch):
    monkeypatch.setattr(_ds_mesh_startup, "_warned", set())
    logging_tree.parse_env.cache_clear()
    caplog.set_level(logging.WARNING)
    if isinstance(expected, Exception):
        with pytest.raises(type(expected)) as err:
            parser(value)
        assert str(expected) in str(err.value)
    else:
        assert parser(value) == expected
        assert parser(value) == expected  # asked twice: still one warning
    warned = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    if warning is None:
        assert warned == []
    else:
        assert len(warned) == 1 and warning in warned[0], warned


FRESH = r"""
import json, os, sys, torch, torch.distributed as dist
import compat
compat.install()
import deepspeed
from compat import group_trace
sys.modules["deepspeed.comm.torch"].build_shm_op = lambda: None
BASE = {"train_micro_batch_size_per_gpu": 1, "steps_per_print": 10**6,
        "optimizer": {"type": "Adam", "params": {"torch_adam": True}}}
out = {}
for name, section in json.loads(sys.argv[1]).items():
    try:
        with group_trace.trace() as created:
            deepspeed.initialize(model=torch.nn.Linear(2, 2), config={**BASE, "mesh": section})
        error = None
    except Exception as err:
        error = f"{type(err).__name__}: {err}"
    out[name] = {"error": error, "initialized": dist.is_initialized(), "groups": [list(e.ranks) for e in created]}
print("RESULT" + json.dumps(out))
"""

BEFORE_WORLD = {
    "key": {"DP": 1},
    "string": {"dp": "1"},
    "negative": {"tp": -1},
    "ranks": {"ranks": "0"},
    "order": {"order": ["dp", "data"]},
}
# run last: it needs the world size, so init_distributed runs first
AFTER_WORLD = {"world": {"dp": 2}}


@pytest.fixture(scope="module")
def fresh():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(
        os.environ,
        PYTHONPATH=ROOT,
        DS_ACCELERATOR="cpu",
        OMP_NUM_THREADS="1",
        RANK="0",
        LOCAL_RANK="0",
        WORLD_SIZE="1",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    env.pop("DS_MESH", None)
    proc = subprocess.run(
        [sys.executable, "-c", FRESH, json.dumps({**BEFORE_WORLD, **AFTER_WORLD})],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(next(l for l in proc.stdout.splitlines() if l.startswith("RESULT"))[len("RESULT") :])


@pytest.mark.deepspeed
@pytest.mark.parametrize("case", sorted(BEFORE_WORLD))
def test_bad_mesh_value_raises_before_the_world_exists(fresh, case):
    result = fresh[case]
    assert result["error"] is not None and result["error"].startswith("MeshSpecError: "), result
    assert "config 'mesh" in result["error"]
    assert result["initialized"] is False, f"{case}: init_distributed ran before the 'mesh' section was checked"
    assert result["groups"] == []


@pytest.mark.deepspeed
def test_a_value_that_needs_the_world_size_raises_before_any_other_group(fresh):
    result = fresh["world"]
    assert result["error"] is not None and result["error"].startswith("MeshSpecError: "), result
    assert "world_size=1" in result["error"] or "1 ranks" in result["error"] or "world 1" in result["error"], result
    assert result["initialized"] is True  # the world group exists: the size comes from it
    assert result["groups"] == []  # and no other group was created
