"""Validation of mesh specs and configs: clear errors, raised before any process group exists."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fakepg import fake_world, group_count
from mesh_core import DeepSpeedDeviceMesh, MeshSpec, MeshSpecError, spec_from_config

pytestmark = pytest.mark.torch_releases


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(tp=3), r"tp=3 does not divide world_size=8"),
        (dict(tp=2, pp=2, dp=3), r"dp=3 does not divide world_size=8"),
        (dict(tp=2, pp=2, dp=1), r"tp=2 x pp=2 x dp=1 = 4 ranks|pp=2 x dp=1 x tp=2 = 4 ranks"),
        (dict(xp=2), r"unknown mesh dim\(s\) \['xp'\]; valid dims are"),
        (dict(order=["pp", "tp", "pp"], tp=2), r"repeats dim\(s\) \['pp'\]"),
        (dict(order=["pp", "zz"]), r"order has unknown dim\(s\) \['zz'\]"),
        (dict(tp=2, ep=3), r"ep=3 does not divide the data-parallel size 4 \(dp=4\); valid ep values are \[1, 2, 4\]"),
        (dict(ranks=[0, 1, 1, 2]), r"duplicates \[1\]"),
        (dict(ranks=[0, 9]), r"ranks \[9\] are out of range; valid ranks are 0..7"),
        (dict(ranks=[]), r"empty"),
        (dict(tp="auto", pp="auto"), r"only one dim may be inferred"),
        (dict(tp=0), r"tp=0 is not valid; it must be a positive integer"),
        (dict(dp=2, dp_shard=2), r"dp=2 cannot be combined with \['dp_shard'\]"),
        (dict(order=["pp", "dp"], tp=2), r"leaves out dim\(s\) \['tp'\]"),
        (dict(ranks=range(4, 10)), r"out of range"),
    ],
)
def test_invalid_specs_name_the_offending_value(kwargs, message):
    with pytest.raises(MeshSpecError, match=message):
        MeshSpec.build(8, **kwargs)


def test_errors_are_value_errors():
    assert issubclass(MeshSpecError, ValueError)


@st.composite
def invalid_specs(draw):
    """Specs that are invalid in one drawn way, with the expected message fragment."""
    world = draw(st.sampled_from([8, 12, 16, 64, 96, 1024]))
    kind = draw(st.sampled_from(["nondivisor", "product", "ep", "unknown", "dup_rank", "range"]))
    if kind == "nondivisor":
        bad = draw(st.integers(2, 50).filter(lambda t: world % t))
        return world, dict(tp=bad), f"tp={bad} does not divide world_size={world}"
    if kind == "product":
        return world, dict(tp=world, pp=2), "does not divide|ranks"
    if kind == "ep":
        ep = draw(st.integers(2, 50).filter(lambda e: (world // 2) % e))
        return world, dict(tp=2, ep=ep), f"ep={ep} does not divide the data-parallel size {world // 2}"
    if kind == "unknown":
        name = draw(st.sampled_from(["mp", "cp", "zero", "data"]))
        return world, {name: 2}, f"unknown mesh dim\\(s\\) \\['{name}'\\]"
    if kind == "dup_rank":
        r = draw(st.integers(0, world - 1))
        return world, dict(ranks=[r, r]), f"duplicates \\[{r}\\]"
    r = draw(st.integers(world, world + 100))
    return world, dict(ranks=[0, r]), f"ranks \\[{r}\\] are out of range"


@settings(max_examples=60, deadline=None)
@given(invalid_specs())
def test_random_invalid_specs_raise_and_create_no_group(case):
    world, kwargs, message = case
    with pytest.raises(MeshSpecError, match=message):
        MeshSpec.build(world, **kwargs)
    with fake_world(world - 1, world):
        before = group_count()
        with pytest.raises(MeshSpecError, match=message):
            DeepSpeedDeviceMesh.build(**kwargs)
        assert group_count() == before


def test_mesh_requires_initialised_distributed():
    spec = MeshSpec.build(4, tp=2)
    with pytest.raises(MeshSpecError, match="torch.distributed is not initialised"):
        DeepSpeedDeviceMesh(spec)
    with pytest.raises(MeshSpecError, match="not initialised"):
        DeepSpeedDeviceMesh.build(tp=2)


def test_spec_world_must_match_the_process_group_world():
    with fake_world(0, 8):
        with pytest.raises(MeshSpecError, match="world_size=4, but torch.distributed has world_size=8"):
            DeepSpeedDeviceMesh(MeshSpec.build(4, tp=2))


def test_bad_flatten_dims_fail_before_any_group():
    with fake_world(1, 8):
        before = group_count()
        with pytest.raises(MeshSpecError, match="unknown mesh dim 'zz'"):
            DeepSpeedDeviceMesh.build(tp=2, flatten=[("dp", "zz")])
        assert group_count() == before


# --- config ----------------------------------------------------------------------------------
def test_config_mesh_section():
    spec = spec_from_config({"mesh": {"tp": 2, "pp": 2, "sp": 1, "ep": 4, "dp": "auto"}}, 32)
    assert spec.shape == {"pp": 2, "dp": 8, "sp": 1, "tp": 2} and spec.ep == 4


def test_config_mesh_section_with_order_and_json_file(tmp_path):
    path = tmp_path / "ds.json"
    path.write_text('{"train_batch_size": 8, "mesh": {"tp": 2, "order": ["tp", "dp"]}}')
    spec = spec_from_config(str(path), 8)
    assert spec.names == ("tp", "dp") and spec.shape == {"tp": 2, "dp": 4}


def test_config_file_must_hold_an_object(tmp_path):
    path = tmp_path / "ds.json"
    path.write_text("[1, 2]")
    with pytest.raises(MeshSpecError, match="holds list, not a JSON object"):
        spec_from_config(str(path), 8)


def test_config_infers_from_legacy_keys_and_model_declarations():
    cfg = {"sequence_parallel_size": 2, "tensor_parallel": {"autotp_size": 2}}
    spec = spec_from_config(cfg, 16, num_stages=2, ep_size=2)
    assert spec.shape == {"pp": 2, "dp": 2, "sp": 2, "tp": 2} and spec.ep == 2
    spec = spec_from_config({"data_parallel_size": 2, "sequence_parallel_size": 2}, 4)
    assert spec.shape == {"dp": 2, "sp": 2}


@pytest.mark.parametrize(
    "cfg, kwargs, message",
    [
        (
            {"mesh": {"tp": 4}, "tensor_parallel": {"autotp_size": 2}},
            {},
            r"config 'mesh' section sets tp=4 but config key 'tensor_parallel.autotp_size' sets tp=2; make them equal",
        ),
        (
            {"mesh": {"sp": 2}, "sequence_parallel_size": 4},
            {},
            r"config 'mesh' section sets sp=2 but config key 'sequence_parallel_size' sets sp=4",
        ),
        (
            {"mesh": {"pp": 4}},
            {"num_stages": 2},
            r"config 'mesh' section sets pp=4 but PipelineModule num_stages sets pp=2",
        ),
        (
            {"mesh": {"ep": 2}},
            {"ep_size": 4},
            r"config 'mesh' section sets ep=2 but the model's MoE layers use ep_size \[4\]",
        ),
        ({"mesh": {"tp": 2, "zz": 1}}, {}, r"unknown key\(s\) \['zz'\] in config 'mesh'"),
        ({"mesh": [2, 2]}, {}, r"must be a dict"),
        ({"mesh": {"tp": 3}}, {}, r"tp=3 does not divide world_size=16"),
        ({"sequence_parallel_size": "abc"}, {}, r"config key 'sequence_parallel_size'='abc' is not valid"),
        ({"tensor_parallel": 5}, {}, r"config key 'tensor_parallel' must be a dict, got 5"),
        ({"tensor_parallel": {"autotp_size": [2]}}, {}, r"'tensor_parallel.autotp_size'=\[2\] is not valid"),
        ({"mesh": {"ep": "x"}}, {}, r"config 'mesh.ep'='x' is not valid"),
        ({"mesh": {"tp": "x"}}, {}, r"config 'mesh.tp'='x' is not valid"),
        ({"mesh": {"sp": "two"}, "sequence_parallel_size": 2}, {}, r"config 'mesh.sp'='two' is not valid"),
    ],
)
def test_config_errors_name_both_sources(cfg, kwargs, message):
    with pytest.raises(MeshSpecError, match=message):
        spec_from_config(cfg, 16, **kwargs)


@pytest.mark.parametrize(
    "key,hint",
    [
        ("fsdp", "'fsdp' (did you mean 'dp_shard'? HSDP is {\"dp_replicate\": R, \"dp_shard\": S})"),
        ("ddp", "'ddp' (did you mean 'dp_replicate'?"),
        ("hsdp", '\'hsdp\' (HSDP is two dims: {"dp_replicate": R, "dp_shard": S}'),
        ("tensor_parallel", "'tensor_parallel' (did you mean 'tp'?)"),
        ("context_parallel", "'context_parallel' (did you mean 'sp'?)"),
        ("moe", "'moe' (did you mean 'ep'?)"),
        ("dp_shards", "'dp_shards' (did you mean 'dp_shard'?)"),  # a spelling: the closest key
    ],
)
def test_unknown_dim_names_get_the_dim_they_mean(key, hint):
    """Other frameworks' names for a dim (FSDP/HSDP/DDP, Megatron's) point at the dim here, not at a
    look-alike spelling (``fsdp`` is not ``sp``)."""
    with pytest.raises(MeshSpecError) as err:
        spec_from_config({"mesh": {key: 2}}, 4)
    assert hint in str(err.value)
