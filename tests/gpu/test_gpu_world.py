"""What tools/gpu_check.sh's parts run under, checked without a GPU: DeepSpeed's own binding rule (the
real ``deepspeed/comm/torch.py`` of the installed release, run with torch's version and the world size
patched), every group's timeout inside its part's bound, NCCL pinned for the plain-vs-shim parts, and
a part that hangs named by its own report while the next part runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types

import pytest
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)

import gpu_driver  # noqa: E402
import gpu_world  # noqa: E402


@pytest.mark.parametrize(
    "version",
    [
        "2.6.0",
        "2.6.0+cu124",
        "2.6.1",
        "2.7.0",
        "2.7.0+cu126",
        "2.7.1",
        "2.8.0+cu128",
        "2.13.0",
        "2.14.1+cu130",
        "2.15.0+cu132",
    ],
)
@pytest.mark.parametrize("world_size", [1, 4])
def test_the_run_binds_exactly_where_deepspeed_binds(monkeypatch, version, world_size):
    import deepspeed  # noqa: F401

    ds_torch = sys.modules["deepspeed.comm.torch"]  # (deepspeed.comm's attribute "torch" is torch itself)

    calls = []
    fake_accelerator = types.SimpleNamespace(device_name=lambda *a: "cuda", device=lambda i: torch.device("cuda", i))
    monkeypatch.setattr(ds_torch, "get_accelerator", lambda: fake_accelerator)
    monkeypatch.setattr(torch, "__version__", version)
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: False)

    def init_process_group(backend, init_method=None, timeout=None, world_size=-1, rank=-1, device_id=None):
        calls.append({} if device_id is None else {"device_id": device_id})  # (deepspeed reads the signature)

    monkeypatch.setattr(torch.distributed, "init_process_group", init_process_group)
    monkeypatch.setattr(torch.distributed, "get_backend", lambda group=None: "nccl")
    monkeypatch.setenv("LOCAL_RANK", "0")
    ds_torch.TorchBackend.init_process_group(types.SimpleNamespace(), "nccl", None, "env://", 0, world_size)
    (kwargs,) = calls
    assert ("device_id" in kwargs) is gpu_world.deepspeed_binds(version, world_size)
    if world_size > 1:
        assert gpu_world.version_allows_binding(version) is ("device_id" in kwargs)


def test_every_part_has_a_bound_and_its_groups_time_out_inside_it():
    import nccl_checks  # noqa: F401  (asserts its parts are exactly gpu_world.SPECS)

    for name, spec in gpu_world.SPECS.items():
        assert 0 < gpu_world.group_timeout_s(spec) < spec.bound_s, name
        env = gpu_driver.part_env(name, dry=False, base={})
        assert int(env["MESH_GPU_GROUP_TIMEOUT_S"]) == gpu_world.group_timeout_s(spec)
        pinned = {k: env.get(k) for k in gpu_world.COMPARE_ENV}
        assert (pinned == gpu_world.COMPARE_ENV) is spec.compares, name  # Ring, no NVLS: only where compared
    assert {n for n, s in gpu_world.SPECS.items() if s.compares} == {"zero_bf16", "pipelines", "unbound_engine"}
    assert {n for n, s in gpu_world.SPECS.items() if s.world == "unbound"} == {"unbound_engine"}
    assert "hang_selftest" not in gpu_driver.default_parts()


@pytest.mark.multiprocess
@pytest.mark.deepspeed
def test_a_hung_part_is_killed_at_its_bound_named_and_the_next_part_still_runs(tmp_path):
    env = dict(os.environ, TMPDIR=str(tmp_path))
    proc = subprocess.run(
        [
            "bash",
            os.path.join(ROOT, "tools", "gpu_check.sh"),
            "--cpu",
            "--python",
            sys.executable,
            "hang_selftest",
            "member_only",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=280,
    )
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith('{"part"')]
    by_part = {line["part"]: line for line in lines}
    assert list(by_part) == ["preflight", "hang_selftest", "member_only"], proc.stdout + proc.stderr[-3000:]
    hung = by_part["hang_selftest"]
    bound = gpu_world.SPECS["hang_selftest"].bound_s
    assert hung["ok"] is False and hung["hung"] is True and f"within its {bound} s bound" in hung["error"]
    assert bound <= hung["seconds"] < bound + 20 and hung["unfinished_ranks"] == [0]
    assert by_part["member_only"]["ok"] is True
    assert proc.returncode == 1 and "hang_selftest      HUNG" in proc.stdout
    # its ranks are gone too, not only torchrun (each rank runs in a session of its own)
    assert hung["left_alive"] == []
    assert gpu_driver.part_processes(os.path.join(hung_dir(tmp_path), "hang_selftest")) == [], (
        "a rank outlived the kill"
    )
    leftovers = [
        pid
        for pid in map(int, filter(str.isdigit, os.listdir("/proc")))
        if pid != os.getpid() and str(tmp_path).encode() in _cmdline(pid) and b"nccl_checks.py" in _cmdline(pid)
    ]
    assert leftovers == [], leftovers


def hung_dir(tmp_path) -> str:
    """The out dir gpu_check.sh made under TMPDIR."""
    found = [os.path.join(root, d) for root, dirs, _ in os.walk(tmp_path) for d in dirs if d == "hang_selftest"]
    assert len(found) == 1, found
    return os.path.dirname(found[0])


def _cmdline(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read()
    except OSError:
        return b""
