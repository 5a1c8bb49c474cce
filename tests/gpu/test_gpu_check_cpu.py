"""``tools/gpu_check.sh --cpu``: the GPU acceptance run on gloo/CPU in a world of one, part by part (the
script, its version preflight, one bounded torchrun per part and its JSON line, the summary; no GPU
needed). tests/gpu/test_gpu_world.py checks a hung part's report."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import gpu_world  # noqa: E402

pytestmark = [pytest.mark.multiprocess, pytest.mark.deepspeed]
RUN_PARTS = [
    "member_only",
    "sharing",
    "zero3",
    "zero_bf16",
    "hf_trainer",
    "weight_link",
    "link_reads",
    "member_only_bound",
    "unbound_engine",
    "step_aside",
]
NEEDS_PEERS = ["subworld_engine", "pipelines", "transfer"]
NCCL_ONLY = ["probe", "not_split", "split"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    pytest.importorskip("transformers")
    env = dict(os.environ, TMPDIR=str(tmp_path_factory.mktemp("gpu_check")))
    proc = subprocess.run(
        ["bash", os.path.join(ROOT, "tools", "gpu_check.sh"), "--cpu", "--python", sys.executable],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith('{"part"')]
    return proc.stdout, {line["part"]: line for line in lines}, [line["part"] for line in lines]


def test_a_preflight_then_one_json_line_per_part_in_order(run):
    _, _, order = run
    assert order == ["preflight"] + [name for name, spec in gpu_world.SPECS.items() if not spec.selftest]


def test_the_preflight_checks_the_pinned_releases(run):
    _, lines, _ = run
    pre = lines["preflight"]
    assert pre["ok"] and pre["problems"] == [] and pre["packages"]["deepspeed"] == "0.19.8"
    assert (
        set(pre["deepspeed_binds"]) == {"world_of_many", "world_of_one"}
        and pre["deepspeed_binds"]["world_of_one"] is False
    )


@pytest.mark.parametrize("part", RUN_PARTS)
def test_every_one_rank_part_passes_on_cpu_within_its_bound(run, part):
    summary, lines, _ = run
    line = lines[part]
    assert line["ok"] is True and "skipped" not in line, line
    assert line["seconds"] < line["bound_s"] == gpu_world.SPECS[part].bound_s
    assert any(row.split()[:2] == [part, "ok"] for row in summary.splitlines()), summary


def test_link_reads_read_the_other_process_where_this_kernel_lets_it(run):
    """The line says how the two processes' weights moved: read from the sender's memory where this
    kernel allows it (so on this machine), else on gloo, bit for bit either way."""
    from mesh_core.transfer import _memory as transfer_memory
    from spawn import reads_across_processes  # tests/ is on the path (conftest)

    _, lines, _ = run
    line = lines["link_reads"]["ranks"]["0"]
    assert line["exact"] == [True, True] and line["reads_available"] is transfer_memory.available()
    assert line["reads_used"] is reads_across_processes(), line
    assert all(n == (1024 * 512 + 512) * 4 for n in line["read_bytes"]) or not line["reads_used"]


def test_the_unbound_part_ran_on_an_unbound_world(run):
    _, lines, _ = run
    line = lines["unbound_engine"]
    assert line["world_kind"] == "unbound" and line["world_bound"] is False
    assert line["ranks"]["0"]["identical_losses"] is True  # shim and plain DeepSpeed, the same losses


@pytest.mark.parametrize("part", NEEDS_PEERS)
def test_parts_needing_peers_say_so_in_a_world_of_one(run, part):
    summary, lines, _ = run
    assert lines[part]["ok"] and ">= 2" in lines[part]["skipped"]
    row = next(row for row in summary.splitlines() if row.startswith(part + " "))
    assert "skipped:" in row and ">= 2" in row, row


@pytest.mark.parametrize("part", NCCL_ONLY)
def test_nccl_only_parts_say_dry_run(run, part):
    _, lines, _ = run
    assert lines[part]["ok"] and lines[part]["skipped"].startswith("dry run")


def test_the_not_split_part_shows_its_split_source_signal(run):
    _, lines, _ = run
    signal = lines["not_split"]["ranks"]["0"]
    assert signal["member_only"] == {"split_source_found": 0}  # gloo: nothing bound, nothing to split from
    assert signal["world_new_group_control"] == {"split_source_found": 0}


def test_wheels_lists_what_to_bring():
    out = subprocess.run(
        ["bash", os.path.join(ROOT, "tools", "gpu_check.sh"), "--wheels"], capture_output=True, text=True, timeout=30
    ).stdout
    assert "pip download -d wheels" in out and "--no-index --find-links wheels" in out and "deepspeed==0.19.8" in out
