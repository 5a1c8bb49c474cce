"""Clients that drive deepspeed themselves: HF Trainer and Accelerate, ZeRO-2 / ZeRO-3, 2 gloo ranks.

``torchrun --nproc_per_node 2 client_jobs.py OUT MODE JOB...``: MODE ``plain`` (deepspeed as
installed) or ``shim`` (``compat.install()`` first, as ``DS_MESH=1`` does); JOBs ``hf_z2``,
``hf_z3``, ``acc_z2``, ``acc_z3`` and ``hf_info`` (HF Trainer ZeRO-2 with ``log_level="info"``,
which calls ``deepspeed.utils.logger.setLevel(INFO)``). Each rank dumps its losses and its local
parameters (ZeRO-3: the rank's partitions) per job, and the lines the job printed (stdout and
stderr).

On CPU, accelerate's distributed state does not see the gloo world deepspeed.comm made:
:func:`tell_accelerate_about_gloo` sets it, and HF Trainer reuses it (``use_configured_state``).
"""

import os
import sys

import torch

import common

# isort: split

STEPS = 3
SEQ = 8


def tell_accelerate_about_gloo() -> None:
    """accelerate's PartialState for the gloo world deepspeed.comm already initialised."""
    import torch.distributed as dist
    from accelerate.state import AcceleratorState, PartialState

    AcceleratorState._reset_state(reset_partial_state=True)
    os.environ["ACCELERATE_USE_DEEPSPEED"] = "true"
    state = PartialState()
    state.backend = "gloo"
    state.num_processes = dist.get_world_size()
    state.process_index = state.local_process_index = dist.get_rank()


def tiny_model():
    import transformers

    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(
        transformers.LlamaConfig(
            vocab_size=64,
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=2,
            max_position_embeddings=32,
        )
    )


def samples(count: int, seed: int) -> list[dict]:
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 64, (count, SEQ), generator=gen)
    return [{"input_ids": row, "labels": row.clone()} for row in ids]


def local_params(module: torch.nn.Module) -> dict:
    return {name: getattr(p, "ds_tensor", p).detach().clone() for name, p in module.named_parameters()}


def ds_config(stage: int) -> dict:
    return {
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 1,
        "zero_optimization": {"stage": stage},
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 10**6,
    }


def hf_trainer(out_dir: str, stage: int, log_level: str = "passive") -> dict:
    import transformers

    tell_accelerate_about_gloo()
    config = {
        **ds_config(stage),
        "train_micro_batch_size_per_gpu": "auto",
        "gradient_accumulation_steps": "auto",
        "train_batch_size": "auto",
    }
    args = transformers.TrainingArguments(
        output_dir=os.path.join(out_dir, f"hf_z{stage}_{log_level}"),
        per_device_train_batch_size=2,
        max_steps=STEPS,
        learning_rate=1e-2,
        logging_steps=1,
        report_to=[],
        save_strategy="no",
        deepspeed=config,
        seed=0,
        disable_tqdm=True,
        log_level=log_level,
        dataloader_num_workers=0,
        accelerator_config={"use_configured_state": True},
    )
    trainer = transformers.Trainer(model=tiny_model(), args=args, train_dataset=samples(2 * 2 * STEPS, 7))
    trainer.train()
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    engine = trainer.model_wrapped
    return {"losses": losses, "params": local_params(engine.module)}


def accelerate_loop(stage: int) -> dict:
    from accelerate import Accelerator
    from accelerate.utils import DeepSpeedPlugin

    tell_accelerate_about_gloo()
    accelerator = Accelerator(deepspeed_plugin=DeepSpeedPlugin(hf_ds_config=ds_config(stage)))
    model = tiny_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    loader = torch.utils.data.DataLoader(samples(2 * 2 * STEPS, 11), batch_size=2)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    losses = []
    for batch in loader:
        loss = model(**batch).loss
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return {"losses": losses, "params": local_params(model.module)}


JOBS = {
    "hf_z2": lambda out: hf_trainer(out, 2),
    "hf_z3": lambda out: hf_trainer(out, 3),
    "hf_info": lambda out: hf_trainer(out, 2, "info"),
    "acc_z2": lambda out: accelerate_loop(2),
    "acc_z3": lambda out: accelerate_loop(3),
}


def captured(path: str, job, *args):
    """Run ``job(*args)`` with this process's stdout and stderr (fds 1, 2) going to ``path``."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with open(path, "w") as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        try:
            return job(*args)
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])


def main(out_dir: str, mode: str, jobs: list[str]) -> None:
    import compat.install as installer

    if mode == "shim":
        installer.install()
    rank = common.init_world()
    results = {job: captured(os.path.join(out_dir, f"{job}.rank{rank}.log"), JOBS[job], out_dir) for job in jobs}
    for job in jobs:
        with open(os.path.join(out_dir, f"{job}.rank{rank}.log")) as log:
            results[job]["output"] = log.read().splitlines()
    results["installed"] = installer.is_installed()
    common.dump(out_dir, rank, results)
    common.shutdown()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3:])
