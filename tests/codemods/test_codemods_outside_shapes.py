"""Shapes found in public trees that the codemods got wrong, each a small fixture (our own code)
run legacy (deepspeed 0.19.8) vs migrated, plain and under ``compat.install()``, on fake ranks of
4 and 8: getters inside ``try/except`` of the legacy exception (a sequence-parallel manager that
retries until ``deepspeed.initialize`` made the groups), the bwc helpers on an mpu without pipeline
getters, calls on a parameter named ``mpu``, pre-0.6 MoE names, a call-valued ``mpu=``."""

from __future__ import annotations

import pytest

from codemod_scripts import run_fake, run_fake_shim
from codemods import migrate_code
from codemods.rules.groups_getters import PRE_06
from todo_lines import inline

# the legacy code these tests run (before migration) warns at each legacy call: that is its input
pytestmark = [
    pytest.mark.deepspeed,
    pytest.mark.filterwarnings("ignore::compat.deprecation.LegacyAPIDeprecationWarning"),
]

WORLDS = [4, 8]

# a Megatron-style mpu with tensor (2 consecutive ranks) and data groups only: no pipeline getters
TENSOR_DATA_MPU = """
import torch.distributed as dist


class TensorDataMPU:
    def __init__(self):
        world, rank = dist.get_world_size(), dist.get_rank()
        for name, lists in (("dp", [list(range(t, world, 2)) for t in range(2)]),
                            ("tp", [[b, b + 1] for b in range(0, world, 2)])):
            for ranks in lists:
                group = dist.new_group(ranks=ranks)
                if rank in ranks:
                    setattr(self, "_" + name, group)

    def get_data_parallel_group(self):
        return self._dp

    def get_data_parallel_world_size(self):
        return dist.get_world_size(self._dp)

    def get_data_parallel_rank(self):
        return dist.get_rank(self._dp)

    def get_model_parallel_group(self):
        return self._tp

    def get_model_parallel_world_size(self):
        return dist.get_world_size(self._tp)

    def get_model_parallel_rank(self):
        return dist.get_rank(self._tp)

    def get_tensor_model_parallel_world_size(self):
        return dist.get_world_size(self._tp)

    def get_tensor_model_parallel_rank(self):
        return dist.get_rank(self._tp)
"""

# sequence-parallel getters called before deepspeed.initialize: KeyError means "not yet, retry"
SP_MANAGER = """import torch.distributed as dist
from deepspeed.utils import groups


class SequenceParallelManager:
    def __init__(self):
        self.sp_size = None

    def try_ready(self):
        try:
            group = groups._get_sequence_parallel_group()
            size = groups._get_sequence_parallel_world_size()
        except KeyError:
            return "retry later"
        self.sp_size = size
        return f"ready sp={size} group={dist.get_world_size(group)}"


print("OUT", SequenceParallelManager().try_ready())
print("OUT dp", groups._get_data_parallel_world_size())
"""

BWC_NO_PIPELINE = (
    TENSOR_DATA_MPU
    + """
from deepspeed.utils.bwc import (
    bwc_pipeline_parallel_world_size,
    bwc_tensor_model_parallel_rank,
    bwc_tensor_model_parallel_world_size,
)

mpu = TensorDataMPU()
print("OUT pp", bwc_pipeline_parallel_world_size(mpu), "tp", bwc_tensor_model_parallel_world_size(mpu),
      bwc_tensor_model_parallel_rank(mpu))
print("OUT none", bwc_pipeline_parallel_world_size(None), bwc_tensor_model_parallel_rank(None))
"""
)

MPU_PARAMETER = (
    "import deepspeed\n"
    + TENSOR_DATA_MPU
    + """

def shard_of(items, mpu):
    size = mpu.get_model_parallel_world_size()
    rank = mpu.get_model_parallel_rank()
    return items[rank::size], mpu.get_data_parallel_world_size(), mpu.get_data_parallel_rank()


print("OUT", shard_of(list(range(8)), TensorDataMPU()))
"""
)


def assert_same(legacy: str, migrated: str, world: int) -> None:
    for rank in sorted({0, 1, world // 2, world - 1}):
        before = run_fake(legacy, rank, world, legacy=True)
        assert before, "the legacy fixture printed nothing"
        for shim in (False, True):
            after = run_fake_shim(migrated, rank, world, shim=shim)
            assert after == before, f"rank {rank} of {world}, shim={shim}"


@pytest.fixture(autouse=True)
def _local_rank(monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "0")


@pytest.mark.parametrize("world", WORLDS)
def test_getters_inside_try_except_of_the_legacy_exception_are_kept_and_flagged(world):
    m = migrate_code(SP_MANAGER)
    assert m.todos["groups getter"] == 2 and m.sites["groups getter"] == 1  # the dp getter outside the try
    assert "groups._get_sequence_parallel_world_size()  # TODOV1:" in inline(m.code)
    assert "groups._get_sequence_parallel_group()  # TODOV1:" in inline(m.code)
    assert "inside try/except KeyError" in m.spelled_out()
    assert_same(SP_MANAGER, m.code, world)
    assert run_fake(SP_MANAGER, 0, world, legacy=True)[0] == "OUT retry later"


def test_a_handler_that_does_not_catch_the_legacy_exception_does_not_keep_the_getter():
    source = SP_MANAGER.replace("except KeyError:", "except ImportError:")
    m = migrate_code(source)
    assert not m.todos and m.sites["groups getter"] == 3


def test_expert_sites_move_together_when_one_is_inside_such_a_try():
    source = (
        "from deepspeed.utils import groups\n\n"
        "def build():\n    groups._create_expert_and_data_parallel(2)\n\n"
        "def size():\n    try:\n        return groups._get_expert_parallel_world_size('ep_size_2')\n"
        "    except AssertionError:\n        return None\n"
    )
    m = migrate_code(source)
    assert not m.sites and m.todos["groups getter"] == 2
    assert "groups._create_expert_and_data_parallel(2)" in m.code


@pytest.mark.parametrize("world", WORLDS)
def test_bwc_helpers_on_an_mpu_without_pipeline_getters_answer_no_pipeline(world):
    m = migrate_code(BWC_NO_PIPELINE)
    assert m.sites["mpu/bwc call"] == 5 and not m.todos
    assert 'mesh_of(mpu).size("pp") if mpu is not None else 1' in m.code
    assert_same(BWC_NO_PIPELINE, m.code, world)
    assert run_fake(BWC_NO_PIPELINE, 1, world, legacy=True) == ["OUT pp 1 tp 2 1", "OUT none 1 0"]


@pytest.mark.parametrize("world", WORLDS)
def test_calls_on_a_parameter_named_mpu_are_rewritten_exactly(world):
    m = migrate_code(MPU_PARAMETER)
    assert m.sites["mpu call"] == 4 and not m.todos
    assert "mpu.get_" not in m.code.split("def shard_of")[1]
    assert_same(MPU_PARAMETER, m.code, world)


def test_a_parameter_named_mpu_in_a_file_without_deepspeed_is_left_alone():
    source = MPU_PARAMETER.replace("import deepspeed\n", "", 1)
    assert migrate_code(source).code == source


def test_a_rebound_parameter_named_mpu_is_left_alone():
    source = "import deepspeed\n\ndef f(mpu):\n    mpu = mpu.inner\n    return mpu.get_data_parallel_world_size()\n"
    assert migrate_code(source).code == source


def test_pre_0_6_moe_names_are_flagged_with_their_0_19_8_form():
    import deepspeed.utils.groups as groups

    for old, new in PRE_06.items():  # the real 0.19.8 package: the old name gone, the new one there
        assert not hasattr(groups, old), old
        assert hasattr(groups, new.split("groups.", 1)[1].split("(", 1)[0]), new
    source = (
        "from deepspeed.utils import groups\n\n"
        "def moe_groups():\n"
        "    if groups.expert_parallel_is_initialized():\n"
        "        return groups.get_expert_parallel_group(), groups.get_expert_data_parallel_group()\n"
        "    return groups.get_max_expert_size()\n"
    )
    m = migrate_code(source)
    assert m.todos["groups getter"] == 4 and not m.sites
    advice = m.spelled_out()
    for old in (
        "expert_parallel_is_initialized",
        "get_expert_parallel_group",
        "get_expert_data_parallel_group",
        "get_max_expert_size",
    ):
        assert f"groups.{old}() is a pre-0.6 name" in advice and PRE_06[old] in advice


def test_a_call_valued_mpu_gets_advice_that_says_what_to_write():
    source = (
        "import deepspeed\n\nclass Trainer:\n    def setup(self, model, config):\n"
        "        return deepspeed.initialize(model=model, config=config, mpu=self.sp_manager.get_mpu())\n"
    )
    m = migrate_code(source)
    assert m.todos["initialize mpu"] == 1
    advice = m.spelled_out()
    assert "bind it to a name first (mpu = self.sp_manager.get_mpu())" in advice and "from_mpu(mpu)" in advice
    bound = source.replace(
        "        return deepspeed.initialize(",
        "        mpu = self.sp_manager.get_mpu()\n        return deepspeed.initialize(",
    ).replace("mpu=self.sp_manager.get_mpu()", "mpu=mpu")
    again = migrate_code(bound)
    assert not again.todos and "DeepSpeedDeviceMesh.from_mpu(mpu)" in again.code


def test_an_added_import_keeps_its_place_inside_the_users_try():
    source = (
        "import torch\n\n\n"
        "def dp_group():\n    try:\n        from deepspeed.utils import groups\n"
        "        return groups.get_data_parallel_group()\n    except ImportError:\n        return None\n\n\n"
        "def dp_size():\n    try:\n        import deepspeed.utils.groups as g\n    except ImportError:\n"
        "        return None\n    return g._get_data_parallel_world_size()\n"
    )
    m = migrate_code(source)
    assert m.code == (
        "import torch\n\n\n"
        "def dp_group():\n    try:\n        from mesh_core import current_mesh\n"
        '        return current_mesh().get_group("dp")\n    except ImportError:\n        return None\n\n\n'
        "def dp_size():\n    try:\n        from mesh_core import current_mesh\n    except ImportError:\n"
        '        return None\n    return current_mesh().size("dp")\n'
    )


# a pipeline topology written across lines, stored on self and returned (its TODOV1 quoted the
# call's line breaks: the codemod raised and the whole file was left unmigrated)
MULTI_LINE_TOPOLOGY = """import torch.distributed as dist
from deepspeed.utils import groups
from deepspeed.runtime.pipe.topology import PipeModelDataParallelTopology


class PipelineModel:
    def __init__(self, pp_size, tp_size):
        dp_size = dist.get_world_size() // (pp_size * tp_size)
        self._topo = PipeModelDataParallelTopology(
            num_pp=pp_size,  # stages
            num_dp=dp_size,
            num_mp=tp_size)
        self.stage = self._topo.get_coord(dist.get_rank()).pipe


def build(pp_size):
    return PipeModelDataParallelTopology(
        num_pp=pp_size, num_mp=1,
        num_dp=dist.get_world_size() // pp_size,
    )


model = PipelineModel(2, 2)
print("OUT", model.stage, model._topo.get_dim("data"), build(2).get_axis_comm_lists("pipe"))
print("OUT dp", groups._get_data_parallel_world_size())
"""


@pytest.mark.parametrize("world", WORLDS)
def test_a_multi_line_topology_is_flagged_and_the_file_migrates(world):
    m = migrate_code(MULTI_LINE_TOPOLOGY)
    assert not m.failures and m.todos["grid construction"] == 2 and m.sites["groups getter"] == 1
    # a long line: the comment stands above the statement
    assert (
        "        # TODOV1: use pipeline_topology(pp=pp_size, dp=dp_size, tp=tp_size);\n"
        "        #   ds-migrate --explain grid\n        self._topo = " in m.code
    )
    # a statement across lines: the comment stands above it (not after its closing bracket), with the
    # call's own arguments (a long one elided: the listing has it whole)
    assert (
        "    # TODOV1: use pipeline_topology(pp=pp_size, tp=1, dp=...); ds-migrate --explain grid\n"
        "    return PipeModelDataParallelTopology(\n" in m.code
    )
    assert "pp=P" not in m.code and ")  # TODOV1" not in m.code
    assert "topology kept: use mesh_core.pipeline_topology(" in m.spelled_out()
    assert all(len(line.lstrip()) <= 100 for line in m.code.splitlines() if "# TODOV1:" in line)
    assert_same(MULTI_LINE_TOPOLOGY, m.code, world)


def test_the_runtime_lines_before_the_users_guard_add_no_blank_line():
    source = (
        "# Copyright\n# Arguments for training\ntry:\n    import deepspeed.utils\n    import deepspeed\nexcept:\n"
        "    pass\n\n\ndef build(model, mpu, config):\n    return deepspeed.initialize(model=model, mpu=mpu, config=config)\n"
    )
    code = migrate_code(source).code
    assert code.startswith("# Copyright\n# Arguments for training\nimport compat\ncompat.install()  #"), code
    assert "\ntry:\n    import deepspeed.utils\n" in code


def test_a_reader_of_autotp_groups_built_in_this_file_moves_with_its_builder():
    # the builder moves to the mesh, so its reader cannot stay legacy alone (it would read nothing)
    source = (
        "from deepspeed.utils import groups\n\n"
        "def setup():\n    groups._init_tp_mesh_device(2)\n    try:\n"
        "        return groups.get_tensor_model_parallel_world_size()\n    except AssertionError:\n        return 1\n"
    )
    m = migrate_code(source)
    assert m.sites["groups getter"] == 2 and not m.todos
    assert "set_default_mesh(DeepSpeedDeviceMesh.build(tp=2))" in m.code and 'current_mesh().size("tp")' in m.code


def test_only_getters_are_kept_under_such_a_try():
    source = (
        "import deepspeed\n\ndef build(model, mpu, config):\n    try:\n"
        "        return deepspeed.initialize(model=model, mpu=mpu, config=config)\n    except RuntimeError:\n"
        "        return None\n"
    )
    m = migrate_code(source)
    assert m.sites["initialize mpu"] == 1 and not m.todos


def test_the_runtime_goes_before_a_contextlib_suppress_guard():
    source = (
        "import contextlib\n\nwith contextlib.suppress(Exception):\n    import deepspeed\n\n\n"
        "def build(model, mpu, config):\n    return deepspeed.initialize(model=model, mpu=mpu, config=config)\n"
    )
    code = migrate_code(source).code
    assert "import contextlib\n\nimport compat\ncompat.install()  #" in code, code
    assert "with contextlib.suppress(Exception):\n    import deepspeed\n" in code
