"""The opt-in ``--comm-to-torch`` codemod: which ``deepspeed.comm`` sites it rewrites, and that the
rewritten collectives compute what deepspeed.comm computed, in a 4-process gloo world."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from codemods import migrate_code
from codemods._engine.portable import parse_error
from codemods.rules.comm_to_torch import BACKEND, DIFFERENT, KILL_SWITCH, THIN
from todo_lines import inline

FIXTURE = Path(__file__).parent.parent / "fixtures" / "codemods" / "comm_ops.py"


def test_off_by_default():
    source = FIXTURE.read_text()
    assert migrate_code(source).code == source


def test_thin_wrappers_become_torch_distributed():
    m = migrate_code(FIXTURE.read_text(), comm_to_torch=True)
    assert parse_error(m.code) is None
    calls = [line for line in m.code.splitlines() if "dist." in line and "torch.distributed" not in line]
    assert calls == [], calls  # every deepspeed.comm call of the fixture is a thin wrapper
    assert "torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)" in m.code
    assert "torch.distributed.all_reduce(t, torch.distributed.ReduceOp.PRODUCT)" in m.code  # log_name dropped
    assert "torch.distributed.all_to_all_single(res, input=inp)" in m.code
    assert "torch.distributed.get_world_group" not in m.code and "torch.distributed.group.WORLD is" in m.code
    assert not m.todos
    assert migrate_code(m.code, comm_to_torch=True).code == m.code  # idempotent


@pytest.mark.parametrize(
    "name,table",
    [(n, KILL_SWITCH) for n in sorted(KILL_SWITCH)]
    + [(n, BACKEND) for n in sorted(BACKEND)]
    + [(n, DIFFERENT) for n in sorted(DIFFERENT)],
)
def test_sites_with_other_semantics_keep_deepspeed_comm_with_the_difference_named(name, table):
    source = f"from deepspeed import comm as dist\nx = dist.{name}(a, b)\n"
    m = migrate_code(source, comm_to_torch=True)
    assert m.todos and not m.sites
    line = inline(m.spelled_out()).splitlines()[1]
    assert line.startswith(f"x = dist.{name}(a, b)  # TODOV1: deepspeed.comm.{name} kept: ")
    assert table[name] in line


def test_reduce_op_that_is_not_a_literal_is_left_with_a_todo():
    source = "import deepspeed.comm as dist\ndef f(t, op):\n    dist.all_reduce(t, op=op, prof=False)\n    dist.barrier(prof=True)\n"
    m = migrate_code(source, comm_to_torch=True)
    assert m.code.count("TODOV1") == 2 and not m.sites


def test_classification_covers_every_public_function_of_deepspeed_comm():
    import inspect

    import deepspeed.comm.comm as comm

    public = {
        n
        for n, o in vars(comm).items()
        if inspect.isfunction(o) and o.__module__ == comm.__name__ and not n.startswith("_")
    }
    classified = THIN | set(KILL_SWITCH) | set(BACKEND) | set(DIFFERENT) | {"get_world_group"}
    # helpers that are not collectives (capability probes, env discovery, the logger's internals)
    helpers = {
        n
        for n in public
        if n.startswith(
            (
                "has_",
                "in_",
                "patch_",
                "mpi_",
                "set_",
                "init_deepspeed",
                "reset_",
                "get_comm",
                "get_logged",
                "enable_",
                "timed_",
            )
        )
    }
    assert sorted(public - classified - helpers) == []
    assert sorted(classified - public) == []


RUNNER = textwrap.dedent(
    """
    import importlib.util, os, sys, torch
    import deepspeed.comm as dscomm
    def load(path, name):
        spec = importlib.util.spec_from_file_location(name, path)
        mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod); return mod
    legacy, migrated = load(sys.argv[1], "legacy_ops"), load(sys.argv[2], "migrated_ops")
    dscomm.init_distributed(dist_backend="gloo")
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    a, b = legacy.run(rank, world), migrated.run(rank, world)
    assert a.keys() == b.keys(), (a.keys(), b.keys())
    for k in a:
        same = torch.equal(a[k], b[k]) if isinstance(a[k], torch.Tensor) else a[k] == b[k]
        assert same, (rank, k, a[k], b[k])
    print(f"rank {rank}: {len(a)} results identical", flush=True)
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()
    """
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.multiprocess
@pytest.mark.deepspeed
def test_rewritten_collectives_compute_the_same_in_4_gloo_processes(tmp_path):
    migrated = migrate_code(FIXTURE.read_text(), comm_to_torch=True).code
    (tmp_path / "migrated.py").write_text(migrated)
    (tmp_path / "runner.py").write_text(RUNNER)
    env = dict(os.environ, DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1")
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node=4",
        f"--master_port={_free_port()}",
        str(tmp_path / "runner.py"),
        str(FIXTURE),
        str(tmp_path / "migrated.py"),
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-5000:]
    assert out.count("results identical") == 4
