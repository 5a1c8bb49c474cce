"""Clients that drive deepspeed themselves, plain deepspeed vs the shim, 2 gloo ranks
(tests/e2e/client_jobs.py): HF Trainer and Accelerate train bit for bit alike with ZeRO-2 and ZeRO-3,
and HF Trainer's ``log_level="info"`` (``deepspeed.utils.logger.setLevel(INFO)``) prints as many
lines under the shim as plain deepspeed prints.

The ZeRO-2 and ``log_level`` runs are in the default run (CI); the ZeRO-3 runs are marked
``clients_full`` (two more torchruns): ``python -m pytest tests/e2e/test_clients_gloo.py -m "clients_full or not clients_full"``
runs all of it.
"""

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "e2e"))
from runner import torchrun  # noqa: E402

pytestmark = [pytest.mark.multiprocess, pytest.mark.deepspeed]
FAST = ("hf_z2", "acc_z2", "hf_info")
FULL = ("hf_z3", "acc_z3")


def both_modes(tmp_path_factory, jobs) -> dict:
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    return {
        mode: torchrun("client_jobs.py", str(tmp_path_factory.mktemp(mode)), mode, *jobs, world=2, timeout=900)
        for mode in ("plain", "shim")
    }


@pytest.fixture(scope="module")
def fast(tmp_path_factory):
    return both_modes(tmp_path_factory, FAST)


@pytest.fixture(scope="module")
def full(tmp_path_factory):
    return both_modes(tmp_path_factory, FULL)


def assert_bit_for_bit(runs: dict, job: str) -> None:
    for rank in range(2):
        plain, shim = runs["plain"][rank], runs["shim"][rank]
        assert shim["installed"] and not plain["installed"]
        assert len(plain[job]["losses"]) == 3 and shim[job]["losses"] == plain[job]["losses"], (job, rank)
        assert shim[job]["params"].keys() == plain[job]["params"].keys()
        for name, value in plain[job]["params"].items():
            assert torch.equal(shim[job]["params"][name], value), f"{job} rank {rank}: {name} differs"


@pytest.mark.parametrize("job", ["hf_z2", "acc_z2"])
def test_zero2_clients_bit_for_bit(fast, job):
    assert_bit_for_bit(fast, job)


@pytest.mark.clients_full
@pytest.mark.parametrize("job", FULL)
def test_zero3_clients_bit_for_bit(full, job):
    assert_bit_for_bit(full, job)


def test_hf_log_level_info_prints_what_plain_deepspeed_prints(fast):
    assert_bit_for_bit(fast, "hf_info")
    for rank in range(2):
        plain, shim = fast["plain"][rank]["hf_info"]["output"], fast["shim"][rank]["hf_info"]["output"]
        # beside plain DeepSpeed's lines, the shim's one line naming the engine's mesh (rank 0 only)
        banner = [line for line in shim if "ds-mesh: this engine runs on the mesh" in line]
        assert len(banner) == (1 if rank == 0 else 0), (rank, banner)
        shim = [line for line in shim if line not in banner]
        assert len(shim) == len(plain), (rank, "\n".join(shim[:40]), "----", "\n".join(plain[:40]))
        # the engine's configuration dump is not among them (the shim once printed it: 65 lines)
        assert not any("DeepSpeedEngine configuration" in line for line in shim)
