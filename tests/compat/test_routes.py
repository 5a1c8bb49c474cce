"""deepspeed.comm under the shim, one process on the fake backend (rank 1 of 4):

- ``deepspeed.comm.new_group`` (every legacy group-creation line of deepspeed) is served by the
  world's registry: identical rank sets share one communicator, the world is the world group;
- ``get_all_ranks_from_group`` returns for every group the shim hands out (legacy loops forever
  on the world group, which the shim hands out where legacy cloned the world);
- strict mode (``DS_MESH_STRICT=1``) raises for a group created outside mesh_core;
- ``engine.destroy()`` releases the mesh the shim built for the engine;
- configs load through deepspeed's own loader; look-alike ``"mesh"`` values are clear errors.
"""

from __future__ import annotations

import base64
import json

import pytest
import torch
import torch.distributed as dist

import compat.install as installer
from compat import comm_routes, group_trace, use_engine
from compat.config_loading import DeepSpeedConfigFileError, load_deepspeed_config
from fakepg import FAKE_RANK, FAKE_WORLD
from mesh_core import MeshSpecError, spec_from_config
from mesh_core.runtime_hooks import registry_for_world

pytestmark = [pytest.mark.deepspeed, pytest.mark.torch_releases]
RANK, WORLD = FAKE_RANK, FAKE_WORLD  # the conftest `world` fixture


def tiny_config(**extra) -> dict:
    return {
        "train_micro_batch_size_per_gpu": 1,
        "optimizer": {"type": "Adam", "params": {"torch_adam": True}},
        "steps_per_print": 10**6,
        **extra,
    }


def test_install_routes_deepspeed_comm_and_uninstall_restores():
    import deepspeed.comm as ds_dist
    from deepspeed.comm import comm

    original_new, original_ranks = comm.new_group, comm.get_all_ranks_from_group
    installer.install()
    try:
        assert comm.new_group is comm_routes.new_group and ds_dist.new_group is comm_routes.new_group
        assert ds_dist.get_all_ranks_from_group is comm_routes.get_all_ranks_from_group
        assert group_trace.enabled()
    finally:
        installer.uninstall()
    assert comm.new_group is original_new and ds_dist.new_group is original_new
    assert ds_dist.get_all_ranks_from_group is original_ranks
    assert not group_trace.enabled()


def test_legacy_sites_share_the_registry(world, shim):
    import deepspeed.comm as ds_dist

    first = ds_dist.new_group([0, 1])
    assert ds_dist.new_group(ranks=range(0, 2)) is first  # pipe/module.py passes a range
    assert sorted(dist.get_process_group_ranks(first)) == [0, 1]
    assert registry_for_world().has([0, 1])
    assert ds_dist.new_group(range(WORLD)) is dist.GroupMember.WORLD  # the world clone of PipelineModule
    assert ds_dist.new_group([2, 3]) is dist.GroupMember.NON_GROUP_MEMBER  # like torch for a non-member
    with pytest.raises(ValueError, match=r"distinct ranks of the world"):
        ds_dist.new_group([0, 9])


def test_legacy_get_all_ranks_from_group_never_ends_on_world(world):
    # deepspeed's loop stops when get_global_rank raises; for WORLD torch answers any index
    from deepspeed.comm import comm

    assert comm.cdb.get_global_rank(dist.GroupMember.WORLD, 10**6) == 10**6


@pytest.mark.filterwarnings("ignore::compat.deprecation.LegacyAPIDeprecationWarning")
def test_get_all_ranks_from_group_on_every_group_the_shim_hands_out(world, shim):
    import deepspeed
    import deepspeed.comm as ds_dist
    from deepspeed.utils import groups

    assert ds_dist.get_all_ranks_from_group(dist.GroupMember.WORLD) == list(range(WORLD))
    engine = deepspeed.initialize(model=torch.nn.Linear(4, 4), config=tiny_config(mesh={"dp": 2, "sp": 2}))[0]
    mesh = engine.mesh_device
    handed = {
        "engine.data_parallel_group": engine.data_parallel_group,
        "engine.seq_data_parallel_group": engine.seq_data_parallel_group,
        "mesh dp": mesh.get_group("dp"),
        "mesh sp": mesh.get_group("sp"),
        "mesh (dp, sp)": mesh.get_group(("dp", "sp")),
        "world clone": ds_dist.new_group(range(WORLD)),
    }
    # the engine in scope, as inside its step: engines other tests left alive may have other layouts
    with use_engine(engine):
        for name in dir(groups):  # every legacy getter that hands out a group, called as deepspeed calls it
            getter = getattr(groups, name)
            if "group" not in name or not name.lstrip("_").startswith("get") or not callable(getter):
                continue
            try:
                value = getter()
            except Exception:  # noqa: BLE001 - getters that need arguments or a state this mesh lacks
                continue
            for key, group in value.items() if isinstance(value, dict) else [("", value)]:
                if isinstance(group, dist.ProcessGroup):
                    handed[f"groups.{name}{key and f'[{key}]'}"] = group
    assert len(handed) > 10
    for name, group in handed.items():
        if group is None:
            continue
        expected = sorted(dist.get_process_group_ranks(group))
        assert ds_dist.get_all_ranks_from_group(group) == expected, name
    # engine.py:2240 (AutoEP + ZeRO-3 check) compares two groups this way
    assert ds_dist.get_all_ranks_from_group(engine.seq_data_parallel_group) == list(range(WORLD))
    engine.destroy()


def test_strict_mode_raises_outside_mesh_core(world, shim, monkeypatch):
    import deepspeed.comm as ds_dist

    monkeypatch.setenv(group_trace.STRICT_ENV, "1")
    with pytest.raises(
        group_trace.GroupOutsideMeshError, match=r"ranks \[0, 1, 2\] created outside mesh_core at .*test_routes"
    ):
        dist.new_group([0, 1, 2])
    assert ds_dist.new_group([0, 1, 2]) is not None  # the legacy site goes through the registry: allowed
    monkeypatch.delenv(group_trace.STRICT_ENV)
    dist.new_group([0, 1, 3])  # strict mode off: allowed


def test_strict_mode_only_while_the_shim_is_active(world, monkeypatch):
    monkeypatch.setenv(group_trace.STRICT_ENV, "1")
    with group_trace.trace() as events:
        dist.new_group([0, 1])
    assert [(e.ranks, e.inside_mesh_core) for e in events] == [((0, 1), False)]


def test_tracer_sees_mesh_core_creations_as_inside(world, shim):
    import deepspeed.comm as ds_dist

    with group_trace.trace() as events:
        ds_dist.new_group([1, 3])
        dist.new_group([0, 2])
    assert [(e.ranks, e.inside_mesh_core) for e in events] == [((1, 3), True), ((0, 2), False)]
    assert group_trace.outside(events)[0].site.endswith(f"test_routes.py:{_line_of('dist.new_group([0, 2])')}")


def _line_of(text: str) -> int:
    with open(__file__, encoding="utf-8") as fh:
        return next(i for i, line in enumerate(fh, 1) if line.strip() == text)


def test_engine_destroy_releases_the_engine_mesh(world, shim):
    import deepspeed

    from compat import groups as compat_groups

    engine = deepspeed.initialize(model=torch.nn.Linear(4, 4), config=tiny_config(mesh={"dp": 2, "sp": 2}))[0]
    mesh = engine.mesh_device
    assert not mesh._destroyed
    engine.destroy()
    assert mesh._destroyed
    assert compat_groups._state.mesh is not mesh  # the legacy getters no longer serve a dead mesh


def test_engine_destroy_leaves_a_given_mesh(world, shim):
    import deepspeed

    from mesh_core import DeepSpeedDeviceMesh

    given = DeepSpeedDeviceMesh.build(dp=2, sp=2)
    engine = deepspeed.initialize(model=torch.nn.Linear(4, 4), config=tiny_config(), mesh=given)[0]
    engine.destroy()
    assert not given._destroyed
    given.destroy()


# --- configs through deepspeed's own loader -------------------------------------------------------
def test_loader_accepts_what_deepspeed_accepts(tmp_path):
    hjson_file = tmp_path / "c.json"
    hjson_file.write_text('{\n  // a comment\n  train_micro_batch_size_per_gpu: 2,\n  "mesh": {"tp": 2},\n}\n')
    assert load_deepspeed_config(str(hjson_file)) == {"train_micro_batch_size_per_gpu": 2, "mesh": {"tp": 2}}
    assert load_deepspeed_config(hjson_file)["mesh"] == {"tp": 2}  # a Path too
    encoded = base64.urlsafe_b64encode(json.dumps({"mesh": {"sp": 2}}).encode()).decode()
    assert load_deepspeed_config(encoded) == {"mesh": {"sp": 2}}
    given = {"mesh": {"dp": 2}}
    loaded = load_deepspeed_config(given)
    assert loaded == given and loaded is not given


def test_loader_errors_name_the_file(tmp_path):
    dup = tmp_path / "dup.json"
    dup.write_text('{"mesh": {"tp": 2}, "mesh": {"tp": 4}}')
    with pytest.raises(DeepSpeedConfigFileError, match=r"dup\.json.*Duplicate keys in DeepSpeed config: \['mesh'\]"):
        load_deepspeed_config(str(dup))
    bad = tmp_path / "bad.json"
    bad.write_text("{ not : [ json")
    with pytest.raises(ValueError, match=r"bad\.json' does not load"):
        load_deepspeed_config(str(bad))
    with pytest.raises(ValueError, match=r"Expected a string path to an existing deepspeed config"):
        load_deepspeed_config(str(tmp_path / "missing.json"))


# --- look-alike values in "mesh" -----------------------------------------------------------------
@pytest.mark.parametrize(
    "section, message",
    [
        ({"ep": 2, "data_before_expert": "false"}, r"'mesh.data_before_expert'='false' .*true or false"),
        ({"ep": 2, "data_before_expert": 0}, r"'mesh.data_before_expert'=0 .*true or false"),
        ({"ranks": "0123"}, r"'mesh.ranks'='0123' .*list of global ranks"),
        ({"ranks": [0, "1", 2, 3]}, r"'mesh.ranks'=.*holds \['1'\]"),
        ({"tp": -1}, r"'mesh.tp'=-1 .*positive integer .*\"auto\""),
        ({"tp": 0}, r"'mesh.tp'=0 .*positive integer"),
        ({"tp": "2"}, r"'mesh.tp'='2' is a string; write the number 2"),
        ({"tp": 2.0}, r"'mesh.tp'=2.0 is not valid"),
        ({"sp": True}, r"'mesh.sp'=True .*not a boolean"),
        ({"ep": -2}, r"'mesh.ep'=-2 "),
        ({"order": "pp,dp"}, r"'mesh.order'='pp,dp' .*list of dim names"),
    ],
)
def test_look_alike_mesh_values_are_errors(section, message):
    with pytest.raises(MeshSpecError, match=message):
        spec_from_config({"mesh": section}, WORLD)


def test_look_alike_values_fail_in_initialize_before_any_group(world, shim):
    import deepspeed

    from fakepg import group_count

    before = group_count()
    with pytest.raises(MeshSpecError, match=r"'mesh.data_before_expert'='false'"):
        deepspeed.initialize(model=torch.nn.Linear(4, 4), config=tiny_config(mesh={"data_before_expert": "false"}))
    assert group_count() == before
