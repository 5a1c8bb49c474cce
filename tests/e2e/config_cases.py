"""Configs deepspeed accepts, legacy vs shim, 4 gloo ranks; see common.py.

Cases:
- AutoTP (``tensor_parallel.autotp_size`` 2, and ``"mesh": {"tp": 2}`` under the shim) with each
  train_batch_size / micro batch / gas combination: accepted or not (error type), the batch sizes
  the engine settled on, and the losses of a few steps;
- config sources: an HJSON file with ``//`` comments, a base64 string, a file with a duplicate key,
  a file that does not parse, a JSON file path: accepted or not (error type and message);
- AutoSP: the (sp, dp) that ``sp_dp_registry.extract_mesh_size`` reads from the engine's config.

Usage: ``torchrun --nproc_per_node 4 config_cases.py OUT``.
"""

import base64
import json
import os
import sys
import tempfile

import torch
import torch.distributed as dist

import common

# isort: split

BATCH_COMBOS = {
    "tbs16_gas1": {"train_batch_size": 16, "gradient_accumulation_steps": 1},
    "tbs16": {"train_batch_size": 16},
    "tbs16_mbs2": {"train_batch_size": 16, "train_micro_batch_size_per_gpu": 2},
    "tbs16_mbs4_gas1": {"train_batch_size": 16, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1},
    "tbs16_mbs2_gas2": {"train_batch_size": 16, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2},
    "mbs2_gas2": {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2},
    "mbs4": {"train_micro_batch_size_per_gpu": 4},
    "tbs8_mbs4_gas1": {"train_batch_size": 8, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1},
}
SPECS = [
    {"patterns": [r".*0\.(weight|bias)$"], "partition_type": "column"},
    {"patterns": [r".*2\.weight$"], "partition_type": "row"},
]
STEPS = 2


def _reset_autotp() -> None:
    """AutoTP's process-wide mode outlives an engine (as in deepspeed's own tests, reset it)."""
    import deepspeed
    from deepspeed.module_inject.layers import set_autotp_mode

    deepspeed._TP_MODEL_INIT_ARGS = None
    set_autotp_mode(training=False)
    import compat.install as installer

    if not installer.is_installed():  # legacy's module-wide groups outlive an engine too
        from deepspeed.utils import groups

        for name in (
            "_TENSOR_MODEL_PARALLEL_GROUP",
            "_MODEL_PARALLEL_GROUP",
            "_DATA_PARALLEL_GROUP",
            "mpu",
            "mesh_device",
        ):
            if hasattr(groups, name):
                setattr(groups, name, None)


def _error(exc: BaseException) -> dict:
    import traceback

    return {
        "accepted": False,
        "type": type(exc).__name__,
        "message": str(exc)[:500],
        "tb": traceback.format_exc()[-1500:],
        "is_value_error": isinstance(exc, ValueError),
    }


def autotp_case(combo: dict, shim: bool, via_mesh: bool, rank: int) -> dict:
    import deepspeed

    common.set_mode(shim)
    _reset_autotp()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 8))
    config = dict(combo, steps_per_print=10**6, optimizer={"type": "Adam", "params": {"lr": 1e-2, "torch_adam": True}})
    tensor_parallel = {"partition_config": {"use_default_specs": False, "layer_specs": SPECS}}
    if via_mesh:
        config["mesh"] = {"tp": 2}
    else:
        tensor_parallel["autotp_size"] = 2
    config["tensor_parallel"] = tensor_parallel
    try:
        engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    except Exception as exc:  # noqa: BLE001 - the error itself is the result
        dist.barrier()
        return _error(exc)
    micro, gas = engine.train_micro_batch_size_per_gpu(), engine.gradient_accumulation_steps()
    gen = torch.Generator().manual_seed(7 + rank // 2)  # a tp pair sees the same data
    losses = []
    for _ in range(STEPS * gas):
        x = torch.randn(micro, 8, generator=gen)
        loss = torch.nn.functional.mse_loss(engine(x), x)
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    result = {
        "accepted": True,
        "micro": micro,
        "gas": gas,
        "train_batch_size": engine.train_batch_size(),
        "losses": losses,
        "tp_world": engine.autotp_size(),
    }
    engine.destroy()
    dist.barrier()
    return result


def source_cases(tmp: str) -> dict:
    body = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1, "steps_per_print": 10**6}
    hjson_path = os.path.join(tmp, "hjson.json")
    with open(hjson_path, "w") as fh:
        fh.write(
            '{\n  // micro batch\n  train_micro_batch_size_per_gpu: 2,\n  "gradient_accumulation_steps": 1,\n'
            '  "steps_per_print": 1000000,\n}\n'
        )
    dup_path = os.path.join(tmp, "dup.json")
    with open(dup_path, "w") as fh:
        fh.write('{"train_micro_batch_size_per_gpu": 2, "train_micro_batch_size_per_gpu": 4}')
    bad_path = os.path.join(tmp, "bad.json")
    with open(bad_path, "w") as fh:
        fh.write("{ this is : not [ json")
    json_path = os.path.join(tmp, "plain.json")
    with open(json_path, "w") as fh:
        json.dump(body, fh)
    return {
        "hjson_file": hjson_path,
        "base64": base64.urlsafe_b64encode(json.dumps(body).encode()).decode(),
        "duplicate_key_file": dup_path,
        "unparsable_file": bad_path,
        "json_file": json_path,
        "missing_file": os.path.join(tmp, "missing.json"),
    }


def source_case(config, shim: bool) -> dict:
    import deepspeed

    common.set_mode(shim)
    _reset_autotp()
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 4)
    try:
        engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    except Exception as exc:  # noqa: BLE001
        dist.barrier()
        return _error(exc)
    result = {
        "accepted": True,
        "micro": engine.train_micro_batch_size_per_gpu(),
        "gas": engine.gradient_accumulation_steps(),
    }
    engine.destroy()
    dist.barrier()
    return result


def autosp_case(config: dict, shim: bool) -> dict:
    import deepspeed
    from deepspeed.compile.custom_ops.sp_dp_registry import extract_mesh_size

    common.set_mode(shim)
    _reset_autotp()
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 4)
    config = dict(config, train_micro_batch_size_per_gpu=2, steps_per_print=10**6)
    try:
        engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    except Exception as exc:  # noqa: BLE001
        dist.barrier()
        return _error(exc)
    sp, dp = extract_mesh_size(engine._config._param_dict)
    result = {"accepted": True, "sp": sp, "dp": dp, "train_batch_size": engine.train_batch_size()}
    engine.destroy()
    dist.barrier()
    return result


def main() -> None:
    out_dir = sys.argv[1]
    rank = common.init_world()
    results = {"autotp": {}, "sources": {}, "autosp": {}}
    for name, combo in BATCH_COMBOS.items():
        results["autotp"][name] = {
            "legacy": autotp_case(combo, False, False, rank),
            "shim": autotp_case(combo, True, False, rank),
            "shim_mesh_tp": autotp_case(combo, True, True, rank),
        }
    with tempfile.TemporaryDirectory() as tmp:
        tmp_dir = tmp if rank == 0 else None
        shared = [tmp_dir]
        dist.broadcast_object_list(shared, src=0)  # one set of files (rank 0's tmp dir, same machine)
        cases = source_cases(shared[0]) if rank == 0 else None
        box = [cases]
        dist.broadcast_object_list(box, src=0)
        for name, config in box[0].items():
            results["sources"][name] = {"legacy": source_case(config, False), "shim": source_case(config, True)}
        dist.barrier()
    for name, config in {"legacy_keys": {"sequence_parallel_size": 2, "data_parallel_size": 2}}.items():
        results["autosp"][name] = {"legacy": autosp_case(config, False), "shim": autosp_case(config, True)}
    results["autosp"]["mesh_sp"] = {"shim": autosp_case({"mesh": {"sp": 2}}, True)}
    common.dump(out_dir, rank, results)


if __name__ == "__main__":
    main()
    common.shutdown()
