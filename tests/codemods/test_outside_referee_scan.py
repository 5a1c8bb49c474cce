"""tools/outside_referee.py's independent scan: legacy DeepSpeed sites by import resolution, not by
look-alike names (a project's own ``initialize`` next to Megatron ``parallel_state`` calls)."""

from __future__ import annotations

import importlib.util
import sys
from collections import Counter
from pathlib import Path

import pytest

pytestmark = pytest.mark.deepspeed

TOOL = Path(__file__).resolve().parents[2] / "tools" / "outside_referee.py"


@pytest.fixture(scope="module")
def referee():
    spec = importlib.util.spec_from_file_location("outside_referee", TOOL)
    module = importlib.util.module_from_spec(spec)
    sys.modules["outside_referee"] = module  # its dataclasses look their module up
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules["outside_referee"]
    return module


@pytest.fixture(scope="module")
def names(referee):
    return referee.LegacyNames.installed()


def families(referee, names, source: str) -> Counter:
    return Counter(site.family for site in referee.scan_source(source, names))


LOOK_ALIKE = """import deepspeed
from megatron.core import parallel_state
from .setup import initialize

engine = initialize(model, mpu=parallel_state)
rank = parallel_state.get_tensor_model_parallel_rank()
"""


def test_a_projects_own_initialize_and_the_megatron_calls_are_not_legacy_sites(referee, names):
    assert families(referee, names, LOOK_ALIKE) == Counter()


@pytest.mark.parametrize("call", ["deepspeed.initialize", "ds.initialize", "ds_init"])
def test_deepspeed_initialize_is_found_through_the_imports(referee, names, call):
    source = (
        "import deepspeed\nimport deepspeed as ds\nfrom deepspeed import initialize as ds_init\n"
        "from megatron.core import parallel_state\n"
        f"engine = {call}(model=model, mpu=parallel_state)\n"
        "rank = parallel_state.get_tensor_model_parallel_rank()\n"
    )
    assert families(referee, names, source) == Counter({"initialize": 1, "mpu": 1})


def test_a_grid_behind_a_subscript_a_pre_0_6_name_and_an_mpu_parameter_are_sites(referee, names):
    source = (
        "import deepspeed\nfrom deepspeed.utils import groups\n\n"
        "class M:\n    def f(self):\n        return self.engines[-1].grid.stage_to_global(0)\n\n"
        "def g(mpu):\n    return mpu.get_data_parallel_rank(), groups.expert_parallel_is_initialized()\n"
    )
    assert families(referee, names, source) == Counter({"grid": 1, "mpu": 1, "groups": 1})


def test_a_todo_standing_above_its_statement_flags_it(referee, names):
    source = (
        "from deepspeed.runtime.pipe.topology import PipeModelDataParallelTopology\n\n"
        "def topo(pp, mp, dp):\n    x = 1\n    return PipeModelDataParallelTopology(num_pp=pp, num_mp=mp, num_dp=dp)\n"
    )
    site = referee.scan_source(source, names)[0]
    lines = source.splitlines()
    assert not referee.flagged(site, lines)
    above = (
        lines[:4]
        + [
            "    # TODOV1: hand it mesh_core.pipeline_topology(pp=pp, tp=mp, dp=dp);",
            "    #   ds-migrate --explain topology",
        ]
        + lines[4:]
    )
    moved = referee.scan_source("\n".join(above) + "\n", names)[0]
    assert referee.flagged(moved, above)
    assert not referee.flagged(moved, above[:4] + ["    # a comment"] + above[5:])


def test_a_reader_kept_with_its_builder_is_flagged_through_the_builders_full_advice(referee, names):
    source = (
        "from deepspeed.utils import groups\n\n"
        "def layer(name):\n"
        '    # TODOV1: use "mesh": {"ep": N} and <mesh>.expert_groups(N); ds-migrate --explain groups\n'
        "    groups._create_expert_and_data_parallel(2)\n"
        "    return groups._get_expert_parallel_group(name)\n"
    )
    lines = source.splitlines()
    reader = [s for s in referee.scan_source(source, names) if "_get_expert" in s.text][0]
    assert not referee.flagged(reader, lines)  # the short comment does not name its readers
    advice = ["groups._create_expert_and_data_parallel kept with _get_expert_parallel_group:6: its readers ..."]
    assert referee.flagged(reader, lines, advice)
