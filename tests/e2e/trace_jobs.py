"""Group-creation tracer on real jobs, legacy vs shim (strict mode), 4 gloo ranks; see common.py.

Jobs: ``pipe_tied`` (PipelineModule pp=2 x dp=2 with a tied layer), ``ulysses`` (ALST: deepspeed's
``parallel_state_sp`` sp=2 as mpu), ``zero3_hpz`` (ZeRO-3 + hpZ 2), ``moe`` (ep=2), ``autotp``
(``tensor_parallel.autotp_size`` 2), ``hybrid`` / ``hybrid_z3`` (DeepSpeedHybridEngine with
``inference_tp_size`` 2 and no mpu, ZeRO-1 / ZeRO-3; needs transformers), ``hybrid_policy`` (the
same with a GPT-2, whose inference kernels do not exist on CPU: the error is the result), ``alst`` /
``alst_z3`` (ALST: UlyssesSPAttentionHF on a tiny Llama, sp 2, ZeRO-2 / ZeRO-3). Each job runs legacy (shim uninstalled) and shimmed with
``DS_MESH_STRICT=1`` (a group created outside mesh_core raises); every torch group creation is
traced. Per rank it dumps: the rank sets legacy created, the creations under the shim (with
whether they came from mesh_core), which of legacy's rank sets (holding this rank) the shim's
registry serves, and the losses. Usage: ``torchrun --nproc_per_node 4 trace_jobs.py OUT [JOBS]``.
"""

import os
import sys

import torch
import torch.distributed as dist

import common

# isort: split

STEPS = 2


def _train(engine, seed: int, dim: int = 8) -> list[float]:
    gen = torch.Generator().manual_seed(50 + seed)
    losses = []
    for _ in range(STEPS):
        x = torch.randn(4, dim, generator=gen)
        loss = torch.nn.functional.mse_loss(engine(x), x.sum(dim=1, keepdim=True).expand(-1, engine(x).shape[-1]))
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    return losses


def _config(**extra) -> dict:
    cfg = {
        "train_micro_batch_size_per_gpu": 4,
        "gradient_accumulation_steps": 1,
        "steps_per_print": 10**6,
        "optimizer": {"type": "Adam", "params": {"lr": 1e-2, "torch_adam": True}},
    }
    cfg.update(extra)
    return cfg


def job_pipe_tied(rank: int):
    import deepspeed
    from deepspeed.pipe import LayerSpec, PipelineModule, TiedLayerSpec

    torch.manual_seed(0)
    layers = [
        TiedLayerSpec("emb", torch.nn.Linear, 8, 8),
        LayerSpec(torch.nn.ReLU),
        LayerSpec(torch.nn.Linear, 8, 8),
        LayerSpec(torch.nn.ReLU),
        TiedLayerSpec("emb", torch.nn.Linear, 8, 8),
    ]
    model = PipelineModule(layers=layers, num_stages=2, loss_fn=torch.nn.MSELoss(), partition_method="uniform")
    config = _config(train_batch_size=8, train_micro_batch_size_per_gpu=2, gradient_accumulation_steps=2)
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    gen = torch.Generator().manual_seed(100 + rank % 2)

    def data():
        while True:
            x = torch.randn(2, 8, generator=gen)
            yield x, x.flip(1)

    it = data()
    return engine, [engine.train_batch(data_iter=it).item() for _ in range(STEPS)]


def job_ulysses(rank: int):
    import deepspeed
    import deepspeed.runtime.sequence_parallel.parallel_state_sp as sp_mpu

    sp_mpu._release_sequence_parallel_groups()
    sp_mpu.initialize_sequence_parallel(2)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    engine, *_ = deepspeed.initialize(
        model=model, model_parameters=model.parameters(), mpu=sp_mpu, config=_config(zero_optimization={"stage": 1})
    )
    return engine, _train(engine, rank)


def job_zero3_hpz(rank: int):
    import deepspeed

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    config = _config(zero_optimization={"stage": 3, "zero_hpz_partition_size": 2})
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    return engine, _train(engine, rank)


def job_moe(rank: int):
    import deepspeed
    from deepspeed.moe.layer import MoE
    from deepspeed.moe.utils import split_params_into_different_moe_groups_for_optimizer

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inp = torch.nn.Linear(8, 8)
            self.moe = MoE(8, torch.nn.Linear(8, 8), num_experts=4, ep_size=2, k=1, min_capacity=0)
            self.out = torch.nn.Linear(8, 1)

        def forward(self, x):
            return self.out(self.moe(torch.relu(self.inp(x)))[0])

    torch.manual_seed(0)
    model = Model()
    groups = split_params_into_different_moe_groups_for_optimizer({"params": list(model.parameters()), "name": "p"})
    optimizer = torch.optim.Adam(groups, lr=1e-2)
    config = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1, "steps_per_print": 10**6}
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    torch.manual_seed(300 + rank)
    return engine, _train(engine, rank)


def job_autotp(rank: int):
    import deepspeed

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 8))
    specs = [
        {"patterns": [r".*0\.(weight|bias)$"], "partition_type": "column"},
        {"patterns": [r".*2\.weight$"], "partition_type": "row"},
    ]
    config = _config(
        tensor_parallel={"autotp_size": 2, "partition_config": {"use_default_specs": False, "layer_specs": specs}},
        zero_optimization={"stage": 1},
    )
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    return engine, _train(engine, rank // 2)  # the tp group [2k, 2k+1] sees the same data


def _tiny_qwen2():
    import transformers

    return transformers.Qwen2ForCausalLM(
        transformers.Qwen2Config(
            vocab_size=64,
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=2,
            max_position_embeddings=32,
        )
    )


def _hybrid_config(zero_stage: int, inference_tp_size: int) -> dict:
    return _config(
        train_micro_batch_size_per_gpu=2,
        zero_optimization={"stage": zero_stage},
        hybrid_engine={"enabled": True, "inference_tp_size": inference_tp_size, "max_out_tokens": 32},
    )


def _hybrid(rank: int, zero_stage: int, inference_tp_size: int = 2):
    """DeepSpeedHybridEngine on a tiny Qwen2 (transformers, built from a config): train, eval +
    generate (rollout), train again. Qwen2 has no DeepSpeed inference policy, so the engine takes
    the native generate() path, the only one that runs on CPU (the policy path loads inference
    kernels that do not exist for the CPU accelerator). Without mpu, inference_tp_size > 1 makes
    the engine create its inference TP groups (runtime/hybrid_engine.py:399)."""
    import deepspeed

    torch.manual_seed(0)
    model = _tiny_qwen2()
    config = _hybrid_config(zero_stage, inference_tp_size)
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    assert type(engine).__name__ == "DeepSpeedHybridEngine", type(engine)
    gen = torch.Generator().manual_seed(400 + rank)
    batches = [torch.randint(0, 64, (2, 8), generator=gen) for _ in range(STEPS + 1)]
    losses = []

    def train_step(ids):
        engine.train()
        loss = engine(input_ids=ids, labels=ids).loss
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())

    for ids in batches[:STEPS]:
        train_step(ids)
    engine.eval()
    with torch.no_grad():
        eval_loss = engine(input_ids=batches[0], labels=batches[0]).loss.item()
        generated = engine.module.generate(batches[0][:, :4], max_new_tokens=4, do_sample=False)
    train_step(batches[STEPS])
    mp_group = None if engine.mp_group is None else common.ranks(engine.mp_group)
    return engine, losses, {"eval_loss": eval_loss, "generated": generated.tolist(), "mp_group": mp_group}


def job_hybrid(rank: int):
    return _hybrid(rank, zero_stage=1)


def job_hybrid_z3(rank: int):
    return _hybrid(rank, zero_stage=3)


def job_hybrid_policy(rank: int):
    """A model with a DeepSpeed inference policy (GPT-2): the hybrid engine builds inference
    containers, whose kernels the CPU accelerator lacks. Records the error and where it is raised."""
    import traceback

    import deepspeed
    import transformers

    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(
        transformers.GPT2Config(vocab_size=64, n_positions=32, n_embd=16, n_layer=2, n_head=2)
    )
    try:
        deepspeed.initialize(model=model, model_parameters=model.parameters(), config=_hybrid_config(1, 2))
    except Exception as err:  # noqa: BLE001 - the error is the result
        frames = traceback.extract_tb(err.__traceback__)
        sites = [f"{f.filename.rsplit('site-packages/', 1)[-1]}:{f.lineno}" for f in frames]
        return None, [], {"error": f"{type(err).__name__}: {err}", "sites": sites}
    return None, [], {"error": None, "sites": []}


def _alst(rank: int, zero_stage: int):
    """ALST: ``UlyssesSPAttentionHF.register_with_transformers`` (sp 2, sdpa) on a tiny Llama built
    from a config, ``UlyssesSPDataLoaderAdapter`` sharding the sequence, the per-shard losses
    aggregated over the sp group as DeepSpeed's own ALST test does; 4 ranks = dp 2 x sp 2."""
    import deepspeed
    import transformers
    from deepspeed.runtime.sequence_parallel import parallel_state_sp as sp_mpu
    from deepspeed.runtime.sequence_parallel.ulysses_sp import UlyssesSPAttentionHF, UlyssesSPDataLoaderAdapter
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    sp_size, steps = 2, STEPS
    sp_mpu._release_sequence_parallel_groups()
    sdpa = ALL_ATTENTION_FUNCTIONS["sdpa"]  # register_with_transformers replaces it with its wrapper
    try:
        torch.manual_seed(0)
        config = transformers.LlamaConfig(
            vocab_size=64,
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=64,
        )
        config._attn_implementation = "sdpa"
        model = transformers.LlamaForCausalLM(config)
        mpu = UlyssesSPAttentionHF.register_with_transformers(
            model_name_or_path=model,
            core_attn_implementation="sdpa",
            sequence_parallel_size=sp_size,
            micro_batch_size=1,
            seq_length_is_variable=True,
        )
        ds_config = _config(
            train_micro_batch_size_per_gpu=1, zero_optimization={"stage": zero_stage}, sequence_parallel_size=sp_size
        )
        engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=ds_config, mpu=mpu)
        sp_group, sp_rank = mpu.get_sequence_parallel_group(), mpu.get_sequence_parallel_rank()
        gen = torch.Generator().manual_seed(500 + rank)  # each rank's own samples: the adapter shares them
        samples = [torch.randint(0, 64, (16,), generator=gen) for _ in range(steps)]
        data = [
            {"input_ids": s.unsqueeze(0), "position_ids": torch.arange(16).unsqueeze(0), "labels": s.unsqueeze(0)}
            for s in samples
        ]
        loader = UlyssesSPDataLoaderAdapter(
            data, sp_rank=sp_rank, sp_group=sp_group, sp_world_size=sp_size, device=torch.device("cpu")
        )
        losses = []
        for _, batch in zip(range(steps), loader):
            shift_labels = batch.pop("shift_labels")
            batch.pop("labels", None)
            logits = engine(**batch).logits
            loss = engine.module.loss_function(
                logits=logits, labels=None, shift_labels=shift_labels, vocab_size=config.vocab_size
            )
            # the sample's loss: token-weighted over the shards (torch.distributed.nn's differentiable
            # all_gather, which DeepSpeed's test uses, fails in backward for an sp group without rank 0)
            good = (shift_labels != -100).sum().to(loss.dtype)
            totals = torch.stack([loss.detach() * good, good])
            dist.all_reduce(totals, group=sp_group)
            engine.backward(loss * good / totals[1])
            engine.step()
            losses.append((totals[0] / totals[1]).item())
        extra = {"sp_group": common.ranks(sp_group), "shard_len": int(batch["input_ids"].shape[1])}
        return engine, losses, extra
    finally:
        ALL_ATTENTION_FUNCTIONS["sdpa"] = sdpa
        sp_mpu._release_sequence_parallel_groups()


def job_alst(rank: int):
    return _alst(rank, zero_stage=2)


def job_alst_z3(rank: int):
    return _alst(rank, zero_stage=3)


JOBS = {
    "pipe_tied": job_pipe_tied,
    "ulysses": job_ulysses,
    "zero3_hpz": job_zero3_hpz,
    "moe": job_moe,
    "autotp": job_autotp,
    "hybrid": job_hybrid,
    "hybrid_z3": job_hybrid_z3,
    "hybrid_policy": job_hybrid_policy,
    "alst": job_alst,
    "alst_z3": job_alst_z3,
}


def run(job: str, shim: bool, rank: int) -> dict:
    from compat import group_trace
    from mesh_core.runtime_hooks import registry_for_world

    common.set_mode(shim)
    import deepspeed.utils.groups as legacy_groups

    # a real job is one engine per process; here jobs share one, and legacy's engine leaves its mpu in
    # the process-global groups.mpu (engine.py:2122): the Ulysses job's parallel_state_sp would make
    # the next MoE job drop tokens over its sp size as "tensor parallel"
    legacy_groups.mpu = None
    if shim:
        os.environ[group_trace.STRICT_ENV] = "1"
    try:
        with group_trace.trace() as events:
            engine, losses, *extra = JOBS[job](rank)
    finally:
        os.environ.pop(group_trace.STRICT_ENV, None)
    result = {
        "losses": losses,
        "created": [(list(e.ranks), e.inside_mesh_core, e.site) for e in events],
        **(extra[0] if extra else {}),
    }
    if shim:
        registry = registry_for_world()
        result["registry_has"] = registry.has
    if engine is not None:
        engine.destroy()
    dist.barrier()
    return result


def main() -> None:
    out_dir, jobs = sys.argv[1], sys.argv[2:] or list(JOBS)
    rank = common.init_world()
    results = {}
    for job in jobs:
        legacy = run(job, False, rank)
        shim = run(job, True, rank)
        has = shim.pop("registry_has")
        world = dist.get_world_size()
        mine = sorted({tuple(r) for r, _, _ in legacy["created"] if rank in r})
        shim["served"] = {str(list(r)): (len(r) == world or has(list(r))) for r in mine}
        results[job] = {"legacy": legacy, "shim": shim}
    common.dump(out_dir, rank, results)


if __name__ == "__main__":
    main()
    common.shutdown()
