"""A script that builds an engine under the shim and never calls ``destroy_process_group()`` exits
with its world destroyed (compat.clean_exit): a gloo rank finalising with live groups can abort."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.torch_releases

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent("""
    import atexit, os, sys
    import torch, torch.distributed as dist
    if os.environ["SHIM"] == "1":
        import compat
        compat.install()
    import deepspeed
    # registered before the engine exists, so it runs after any handler the engine's build registers
    atexit.register(lambda: print("WORLD ALIVE AT EXIT", dist.is_initialized(), flush=True))
    model = torch.nn.Linear(4, 4)
    config = {"train_micro_batch_size_per_gpu": 1, "optimizer": {"type": "SGD", "params": {"lr": 0.1}},
              "zero_optimization": {"stage": 1}, "zero_allow_untested_optimizer": True}
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    loss = engine(torch.ones(1, 4)).sum()
    engine.backward(loss)
    engine.step()
    print("TRAINED", flush=True)
""")


def _run(tmp_path: Path, shim: bool) -> str:
    script = tmp_path / "no_destroy.py"
    script.write_text(SCRIPT)
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "DS_ACCELERATOR": "cpu",
        "OMP_NUM_THREADS": "1",
        "RANK": "0",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(29000 + os.getpid() % 1000),
        "SHIM": "1" if shim else "0",
    }
    env.pop("DS_MESH", None)
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "TRAINED" in done.stdout
    return done.stdout


@pytest.mark.multiprocess
def test_a_shim_engine_script_without_destroy_exits_with_its_world_destroyed(tmp_path):
    assert "WORLD ALIVE AT EXIT False" in _run(tmp_path, shim=True)


@pytest.mark.multiprocess
def test_plain_deepspeed_leaves_the_world_alive_at_exit(tmp_path):
    # the case the handler is for: without the shim nothing destroys the world before finalisation
    assert "WORLD ALIVE AT EXIT True" in _run(tmp_path, shim=False)


def test_arming_twice_registers_one_handler(monkeypatch):
    import compat.clean_exit as clean_exit

    registered = []
    monkeypatch.setattr(clean_exit, "_armed", False)
    monkeypatch.setattr(clean_exit.atexit, "register", registered.append)
    clean_exit.arm()
    clean_exit.arm()
    assert registered == [clean_exit._destroy_world]
