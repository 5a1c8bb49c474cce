"""Real jobs on tiny HF models (transformers, built from a config), legacy vs shim, 4 gloo ranks
(tests/e2e/trace_jobs.py jobs ``hybrid``, ``hybrid_z3``, ``hybrid_policy``, ``alst``, ``alst_z3``).

Hybrid engine (``"hybrid_engine": {"enabled": true}``): on CPU it runs for a model without a
DeepSpeed inference policy (a tiny Qwen2: rollout through the model's native ``generate()``): train
steps, eval + generate, another train step, ZeRO-1 and ZeRO-3, ``inference_tp_size`` 2 without mpu,
so the engine makes its inference TP groups itself (``runtime/hybrid_engine.py:399``). A model with
a policy (GPT-2) cannot run on CPU either way: the inference kernels do not exist for the CPU
accelerator; the shim gives the same error.

ALST: ``UlyssesSPAttentionHF.register_with_transformers`` (sp 2) on a tiny Llama, the sequence
sharded by ``UlyssesSPDataLoaderAdapter``, ZeRO-2 and ZeRO-3 (dp 2 x sp 2); its groups come from
``parallel_state_sp.py:53,63``.

Shim side in strict mode: no group outside mesh_core, legacy's rank sets held by the registry,
identical losses (and eval loss / generated tokens).
"""

import math
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "e2e"))
from runner import WORLD, torchrun  # noqa: E402

pytestmark = [pytest.mark.multiprocess, pytest.mark.deepspeed]
RUNS = ("hybrid", "hybrid_z3")
ALST = ("alst", "alst_z3")
JOBS = RUNS + ("hybrid_policy",) + ALST
HYBRID_TP_SITE = "deepspeed/runtime/hybrid_engine.py:399"


@pytest.fixture(scope="module")
def traced(tmp_path_factory):
    pytest.importorskip("transformers")
    return torchrun("trace_jobs.py", str(tmp_path_factory.mktemp("hf_jobs")), *JOBS, timeout=600)


def tp_block(rank):
    return [rank - rank % 2, rank - rank % 2 + 1]


@pytest.mark.parametrize("job", RUNS)
def test_same_training_eval_and_generation(traced, job):
    for rank in range(WORLD):
        legacy, shim = traced[rank][job]["legacy"], traced[rank][job]["shim"]
        assert len(legacy["losses"]) == 3
        assert all(math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-7) for a, b in zip(legacy["losses"], shim["losses"]))
        assert math.isclose(legacy["eval_loss"], shim["eval_loss"], rel_tol=1e-6)
        assert shim["generated"] == legacy["generated"]
        assert len(legacy["generated"][0]) == 8  # 4 prompt + 4 new tokens


@pytest.mark.parametrize("job", RUNS)
def test_inference_tp_groups_from_the_mesh(traced, job):
    for rank in range(WORLD):
        legacy, shim = traced[rank][job]["legacy"], traced[rank][job]["shim"]
        assert legacy["mp_group"] == shim["mp_group"] == tp_block(rank)
        outside = [c for c in shim["created"] if not c[1]]
        assert outside == [], f"{job}: rank {rank} created groups outside mesh_core: {outside}"
        assert shim["served"] and all(shim["served"].values()), shim["served"]
        assert shim["served"].get(str(tp_block(rank))) is True
        legacy_sets = {tuple(r) for r, _, _ in legacy["created"]}
        assert {(0, 1), (2, 3)} <= legacy_sets  # every rank asks for every block, as in DeepSpeed
        assert all(site.endswith(HYBRID_TP_SITE) for r, _, site in legacy["created"] if r in ([0, 1], [2, 3]))


def test_policy_model_fails_on_cpu_the_same_way(traced):
    for rank in range(WORLD):
        legacy, shim = traced[rank]["hybrid_policy"]["legacy"], traced[rank]["hybrid_policy"]["shim"]
        assert legacy["error"] == shim["error"] == "ValueError: This op had not been implemented on CPU backend."
        assert legacy["sites"][-1] == shim["sites"][-1] == "deepspeed/ops/op_builder/cpu/no_impl.py:21"
        assert "deepspeed/runtime/hybrid_engine.py:120" in legacy["sites"]  # _container.create_module()
        assert [c for c in shim["created"] if not c[1]] == []


@pytest.mark.parametrize("job", ALST)
def test_alst_same_losses_and_groups_from_the_mesh(traced, job):
    for rank in range(WORLD):
        legacy, shim = traced[rank][job]["legacy"], traced[rank][job]["shim"]
        assert len(legacy["losses"]) == 2 and shim["losses"] == legacy["losses"], (job, rank, legacy, shim)
        assert legacy["sp_group"] == shim["sp_group"] == tp_block(rank)  # sp blocks of 2
        assert legacy["shard_len"] == shim["shard_len"] == 8  # 16 tokens over sp 2
        assert [c for c in shim["created"] if not c[1]] == []
        assert shim["served"] and all(shim["served"].values()), shim["served"]
        sites = {site.rsplit("site-packages/", 1)[-1] for _, _, site in legacy["created"]}
        assert sites == {
            "deepspeed/runtime/sequence_parallel/parallel_state_sp.py:53",
            "deepspeed/runtime/sequence_parallel/parallel_state_sp.py:63",
        }


def test_alst_zero3_equals_zero2(traced):
    # ZeRO-3 partitions over the sequence-data-parallel group like ZeRO-2 (the shim once partitioned
    # ZeRO-3 parameters over dp only and diverged from the second step on)
    for rank in range(WORLD):
        assert traced[rank]["alst_z3"]["shim"]["losses"] == traced[rank]["alst"]["shim"]["losses"]
