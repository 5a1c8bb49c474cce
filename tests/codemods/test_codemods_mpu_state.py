"""Migrated getters compute what legacy computed whatever way the mpu reached DeepSpeed, with the
mesh runtime installed or not: DeepSpeed's own Ulysses module (``parallel_state_sp``) passed to
``deepspeed.initialize`` by keyword (``mesh=DeepSpeedDeviceMesh.from_mpu(mpu)`` after migration),
through ``**kwargs``, positionally, built in another function, or assigned to ``groups.mpu`` by
another (unmigrated) module. Legacy: the real deepspeed 0.19.8; each migrated program is run on the
fake backend without and with ``compat.install()`` and compared with the legacy program run the same
way. A migrated program that installs the mesh runtime itself (the codemods add ``compat.install()``
where the engine's mesh is used) is compared with the legacy one under the shim: there the mesh
runtime's documented answers hold (the Ulysses module's DP group is the mesh's, where plain DeepSpeed
has none)."""

from __future__ import annotations

import pytest

from codemod_scripts import run_fake
from codemods import migrate_code

# the legacy code these tests run (before migration) warns at each legacy call: that is its input
pytestmark = [
    pytest.mark.deepspeed,
    pytest.mark.filterwarnings("ignore::compat.deprecation.LegacyAPIDeprecationWarning"),
]

SCRIPT = """
import torch
import torch.distributed as tdist
import deepspeed
from deepspeed.utils import groups
from deepspeed.runtime.sequence_parallel import parallel_state_sp


def ranks(group):
    return None if group is None else sorted(tdist.get_process_group_ranks(group))


def make_mpu():
    parallel_state_sp._release_sequence_parallel_groups()
    parallel_state_sp.initialize_sequence_parallel(2)
    return parallel_state_sp


config = {"train_micro_batch_size_per_gpu": 1, "steps_per_print": 10**6,
          "optimizer": {"type": "Adam", "params": {"torch_adam": True}}}
model = torch.nn.Linear(4, 4)
"""
HOW = {
    "keyword": "mpu = make_mpu()\nengine, *_ = deepspeed.initialize(model=model, config=config, mpu=mpu)\n",
    "kwargs": "kwargs = {'model': model, 'config': config}\nkwargs['mpu'] = make_mpu()\n"
    "engine, *_ = deepspeed.initialize(**kwargs)\n",
    "positional": "engine, *_ = deepspeed.initialize(None, model, None, None, None, None, 29500, make_mpu(), config=config)\n",
    "elsewhere": "def build(m, c):\n    return deepspeed.initialize(model=m, config=c, mpu=make_mpu())\n\n\n"
    "engine, *_ = build(model, config)\n",
    "helper_module": "exec('from deepspeed.utils import groups as g\\ng.mpu = mpu', {'mpu': make_mpu()})\n"
    "engine, *_ = deepspeed.initialize(model=model, config=config)\n",
}
GETTERS = """
print("OUT sp", groups._get_sequence_parallel_world_size(), ranks(groups._get_sequence_parallel_group()),
      groups._get_sequence_parallel_rank())
print("OUT sdp", groups._get_sequence_data_parallel_world_size(), ranks(groups._get_sequence_data_parallel_group()),
      groups._get_sequence_data_parallel_rank())
print("OUT dp", groups._get_data_parallel_world_size(), ranks(groups._get_data_parallel_group()))
"""
ENGINE = (
    "print('OUT engine', engine.dp_world_size, engine.seq_dp_world_size, engine.sequence_parallel_size, "
    "ranks(engine.seq_data_parallel_group))\n"
)
# a model module (no deepspeed.initialize of its own: current_mesh() after migration), run after the
# training script in the same process
MODEL = (
    "from deepspeed.utils import groups as model_groups\n\n\ndef model_probe():\n"
    + "".join("    " + line.replace("groups.", "model_groups.") + "\n" for line in GETTERS.strip().splitlines())
    + "\n\nmodel_probe()\n"
)
WHERE = {
    "engine_in_scope": (GETTERS + ENGINE, ""),  # <engine>.mesh_device after migration
    "model_module": (ENGINE, MODEL),
}


@pytest.mark.parametrize("shim", [False, True], ids=["no-shim", "shim"])
@pytest.mark.parametrize("where", sorted(WHERE))
@pytest.mark.parametrize("how", sorted(HOW))
def test_getters_after_any_mpu_route_compute_the_legacy_groups(how, where, shim, monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "0")
    probe, model = WHERE[where]
    train = SCRIPT + HOW[how] + probe
    legacy = train + model
    migrated = migrate_code(train).code + migrate_code(model).code
    assert "groups._get" not in migrated or "TODOV1" in migrated
    reference_shim = shim or "compat.install()" in migrated
    for rank in (0, 3):
        before = run_fake(legacy, rank, 4, legacy=True, shim=reference_shim)
        assert len(before) == 4 and not any("raised" in line for line in before), before
        after = run_fake(migrated, rank, 4, legacy=True, shim=shim)
        assert after == before, (rank, migrated)


@pytest.mark.parametrize("world,sp", [(4, 2), (8, 2), (8, 4), (8, 8)])
def test_from_mpu_of_the_ulysses_module_has_its_groups(world, sp):
    import torch.distributed as tdist
    from deepspeed.runtime.sequence_parallel import parallel_state_sp

    from fakepg import fake_world, probe_ranks
    from mesh_core import DeepSpeedDeviceMesh

    for rank in probe_ranks(world):
        with fake_world(rank, world, deepspeed_comm=True):
            parallel_state_sp._release_sequence_parallel_groups()
            try:
                parallel_state_sp.initialize_sequence_parallel(sp)
                mesh = DeepSpeedDeviceMesh.from_mpu(parallel_state_sp, check_agreement=False)
                legacy_sp = sorted(tdist.get_process_group_ranks(parallel_state_sp.get_sequence_parallel_group()))
                legacy_sdp = sorted(tdist.get_process_group_ranks(parallel_state_sp.get_sequence_data_parallel_group()))
                assert mesh.get_group_ranks("sp") == legacy_sp
                assert mesh.get_group_ranks(("dp", "sp")) == legacy_sdp
                assert mesh.size("dp") * mesh.size("sp") == world and mesh.source_mpu is parallel_state_sp
            finally:
                parallel_state_sp._release_sequence_parallel_groups()
