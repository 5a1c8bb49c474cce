"""Configs deepspeed accepts work the same under the shim (4 gloo ranks, tests/e2e/config_cases.py):
AutoTP batch sizing for every train_batch_size / micro / gas combination (same sizes, same losses,
same rejection), ``"mesh": {"tp": 2}`` = ``tensor_parallel.autotp_size: 2``, HJSON / base64 /
duplicate-key / unparsable config sources, and the sp size AutoSP reads."""

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "e2e"))
from runner import WORLD, torchrun  # noqa: E402

pytestmark = [pytest.mark.multiprocess, pytest.mark.deepspeed]
COMBOS = (
    "tbs16_gas1",
    "tbs16",
    "tbs16_mbs2",
    "tbs16_mbs4_gas1",
    "tbs16_mbs2_gas2",
    "mbs2_gas2",
    "mbs4",
    "tbs8_mbs4_gas1",
)


def _outcome(result: dict) -> dict:
    return {k: v for k, v in result.items() if k != "tb"}


@pytest.fixture(scope="module")
def cases(tmp_path_factory):
    return torchrun("config_cases.py", str(tmp_path_factory.mktemp("cfg")), timeout=900)


@pytest.mark.parametrize("combo", COMBOS)
@pytest.mark.parametrize("mode", ["shim", "shim_mesh_tp"])
def test_autotp_batch_sizing_matches_legacy(cases, combo, mode):
    for rank in range(WORLD):
        legacy, shim = (_outcome(cases[rank]["autotp"][combo][m]) for m in ("legacy", mode))
        assert shim == legacy, f"rank {rank} {combo}: legacy {legacy} vs {mode} {shim}"


def test_autotp_issue_combination_trains(cases):
    # the issue's crash: train_batch_size 16, gas 1, autotp 2 on 4 ranks ("16 != 4 * 1 * 2" under the old shim)
    legacy = cases[0]["autotp"]["tbs16_gas1"]["legacy"]
    assert legacy["accepted"] and (legacy["micro"], legacy["gas"]) == (4, 1)
    assert cases[0]["autotp"]["tbs16"]["shim"]["gas"] == 1  # gas omitted: not silently 2


@pytest.mark.parametrize("source", ["hjson_file", "base64", "json_file"])
def test_config_sources_accepted_like_legacy(cases, source):
    for rank in range(WORLD):
        legacy, shim = (cases[rank]["sources"][source][m] for m in ("legacy", "shim"))
        assert legacy["accepted"], legacy
        assert shim == legacy


@pytest.mark.parametrize("source", ["duplicate_key_file", "unparsable_file", "missing_file"])
def test_config_sources_rejected_like_legacy(cases, source):
    for rank in range(WORLD):
        legacy, shim = (cases[rank]["sources"][source][m] for m in ("legacy", "shim"))
        assert not legacy["accepted"] and not shim["accepted"]
        assert legacy["is_value_error"] and shim["is_value_error"]  # same family of error
        assert legacy["message"] in shim["message"]  # legacy's words kept
        if source != "missing_file":
            assert ".json" in shim["message"]  # and the file is named


def test_autosp_sees_the_mesh_sp(cases):
    for rank in range(WORLD):
        autosp = cases[rank]["autosp"]
        legacy = _outcome(autosp["legacy_keys"]["legacy"])
        assert legacy["accepted"] and (legacy["sp"], legacy["dp"]) == (2, 2)
        assert _outcome(autosp["legacy_keys"]["shim"]) == legacy
        assert _outcome(autosp["mesh_sp"]["shim"]) == legacy
