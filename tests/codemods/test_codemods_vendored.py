"""A tree that ships its own modified DeepSpeed (``<tree>/deepspeed/moe/layer.py``) is migrated with
the user-code rules, not as DeepSpeed itself (codemods._engine.vendored).

DeepSpeed's own package is migrated with internal rules (its expert readers move to
``expert_groups_named(current_mesh(), name)``, its builders stay), which hold only under
``compat.install()``; a vendored copy gets no runtime, so those rules would leave every MoE layer
raising where the legacy tree ran. The fixture (our own code, in the shape of such a tree): a
vendored MoE layer that builds its expert groups when missing and reads them by name, and user code
that builds expert groups and uses it; legacy (deepspeed 0.19.8) vs migrated, plain and under
``compat.install()``, on fake ranks of 4 and 8.
"""

from __future__ import annotations

import contextlib
import sys
import types
from pathlib import Path

import pytest

from codemod_scripts import run_fake, run_fake_shim
from codemods import migrate as cli
from codemods._engine.cache import content_hash
from codemods._engine.runner import run
from codemods._engine.vendored import vendored_copy

pytestmark = [
    pytest.mark.deepspeed,
    pytest.mark.filterwarnings("ignore::compat.deprecation.LegacyAPIDeprecationWarning"),
]

VENDORED_LAYER = '''"""This tree's own MoE layer (a modified copy of DeepSpeed's)."""
import torch.distributed as dist
from deepspeed.utils import groups


class MoE:
    def __init__(self, ep_size, expert_tp=False):
        self.ep_size = ep_size
        self.expert_group_name = f"ep_size_{ep_size}"
        self.expert_tp = expert_tp

    def set_deepspeed_parallelism(self, use_data_before_expert_parallel_=False):
        self._create_process_groups(use_data_before_expert_parallel_=use_data_before_expert_parallel_)

    def _create_process_groups(self, use_data_before_expert_parallel_=False):
        if self.expert_group_name not in groups._get_expert_parallel_group_dict():
            if groups.mpu is None or not self.expert_tp:
                groups._create_expert_and_data_parallel(
                    self.ep_size, use_data_before_expert_parallel_=use_data_before_expert_parallel_)
            else:
                groups._create_expert_data_and_model_parallel(
                    self.ep_size, mpu=groups.mpu, use_data_before_expert_parallel_=use_data_before_expert_parallel_)
        self.ep_group = groups._get_expert_parallel_group(self.expert_group_name)
        self.edp_group = groups._get_expert_data_parallel_group(self.expert_group_name)

    def describe(self):
        return (dist.get_process_group_ranks(self.ep_group), dist.get_process_group_ranks(self.edp_group),
                groups._get_expert_parallel_rank(self.expert_group_name),
                groups._get_expert_data_parallel_world_size(self.expert_group_name))
'''

USER_CODE = """from deepspeed.utils import groups
from deepspeed.moe.layer import MoE

groups._create_expert_and_data_parallel(2)  # the user's own expert groups, before the layers
layers = [MoE(2), MoE(4)]
for layer in layers:
    layer.set_deepspeed_parallelism()
    print("OUT", layer.expert_group_name, layer.describe())
print("OUT names", sorted(groups._get_expert_parallel_group_dict()))
print("OUT ep2", groups._get_expert_parallel_world_size("ep_size_2"), groups._get_expert_parallel_rank("ep_size_2"))
"""


def _tree(root: Path) -> Path:
    tree = root / "moe_research"
    layer = tree / "deepspeed" / "moe" / "layer.py"
    layer.parent.mkdir(parents=True)
    (tree / "deepspeed" / "__init__.py").write_text("")
    (tree / "deepspeed" / "moe" / "__init__.py").write_text("")
    layer.write_text(VENDORED_LAYER)
    (tree / "train.py").write_text(USER_CODE)
    return tree


@contextlib.contextmanager
def _vendored_layer(source: str):
    """``deepspeed.moe.layer`` is the tree's copy (``source``) while the block runs, as on a tree
    whose own ``deepspeed/`` comes first on the path."""
    import deepspeed.moe  # noqa: F401  (the package the copy's module sits in)

    module = types.ModuleType("deepspeed.moe.layer")
    module.__file__ = "<vendored deepspeed/moe/layer.py>"
    exec(compile(source, module.__file__, "exec"), module.__dict__)
    saved = sys.modules.get("deepspeed.moe.layer")
    sys.modules["deepspeed.moe.layer"] = module
    try:
        yield
    finally:
        if saved is not None:
            sys.modules["deepspeed.moe.layer"] = saved
        else:
            sys.modules.pop("deepspeed.moe.layer", None)


@pytest.fixture(autouse=True)
def _local_rank(monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "0")


@pytest.fixture
def migrated(tmp_path):
    tree = _tree(tmp_path)
    assert cli.main([str(tree), "--no-cache", "--no-progress"]) == 0
    return tree


def test_a_vendored_copy_is_told_apart_from_deepspeed_itself(tmp_path):
    tree = _tree(tmp_path)
    layer = tree / "deepspeed" / "moe" / "layer.py"
    assert vendored_copy(layer, [tree])  # found below the directory given
    assert not vendored_copy(layer, [tree / "deepspeed"])  # the run points at the package
    assert not vendored_copy(layer, [layer])
    assert not vendored_copy(tree / "train.py", [tree])  # not in a deepspeed package
    assert vendored_copy(layer, [tree / "deepspeed"], "user") and not vendored_copy(layer, [tree], "internal")
    import importlib.util

    installed = Path(importlib.util.find_spec("deepspeed").submodule_search_locations[0])
    assert not vendored_copy(installed / "moe" / "layer.py", [installed.parent])  # the installed package
    with pytest.raises(ValueError, match="'vendor' are not valid"):
        vendored_copy(layer, [tree], "vendor")


def test_the_vendored_layer_keeps_builders_and_readers_together(migrated):
    layer = (migrated / "deepspeed" / "moe" / "layer.py").read_text()
    assert "expert_groups_named" not in layer and "current_mesh" not in layer, layer
    assert "groups._create_expert_and_data_parallel(" in layer and "groups._get_expert_parallel_group(" in layer
    assert "TODOV1" in layer and "compat.install()" not in layer
    assert "compat.install()" not in (migrated / "train.py").read_text()


def test_the_internal_rules_stay_for_deepspeed_itself_and_on_request(tmp_path):
    tree = _tree(tmp_path)
    layer = tree / "deepspeed" / "moe" / "layer.py"
    run([layer])  # a file given: DeepSpeed's own package, as before
    assert "expert_groups_named(current_mesh(), self.expert_group_name).ep_group" in layer.read_text()
    layer.write_text(VENDORED_LAYER)
    assert cli.main([str(tree), "--no-cache", "--no-progress", "--deepspeed-rules", "internal"]) == 0
    assert "expert_groups_named" in layer.read_text()


def test_the_cache_keeps_a_vendored_copy_apart(tmp_path):
    assert content_hash("x", "deepspeed.moe.layer", "deepspeed.moe", True) != content_hash(
        "x", "deepspeed.moe.layer", "deepspeed.moe"
    )


def test_a_second_run_changes_nothing(migrated):
    assert cli.main([str(migrated), "--no-cache", "--no-progress", "--check"]) == 0


@pytest.mark.parametrize("world", [4, 8])
def test_the_migrated_tree_runs_as_the_legacy_tree(migrated, world):
    layer = (migrated / "deepspeed" / "moe" / "layer.py").read_text()
    user = (migrated / "train.py").read_text()
    for rank in sorted({0, 1, world // 2, world - 1}):
        with _vendored_layer(VENDORED_LAYER):
            before = run_fake(USER_CODE, rank, world, legacy=True)
        assert len(before) == 4 and not any("raised" in line for line in before), before
        for shim in (False, True):
            with _vendored_layer(layer):
                after = run_fake_shim(user, rank, world, shim=shim)
            assert after == before, f"rank {rank} of {world}, shim={shim}"
