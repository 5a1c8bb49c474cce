"""The mpus plain DeepSpeed accepts on a pp=2 x tp=2 x dp=2 world (8 ranks), plain vs the shim.

Megatron's layout (tp fastest, then dp, pp outermost); the script runs its own pipeline, so each
stage is an ordinary module and DeepSpeed sees one stage. Shapes: ``dp_mp`` — only the data- and
model-parallel getters (the protocol DeepSpeed reads; model parallel = tp); ``pipe`` — plus the
pipe getters. Each shape trains plain (shim uninstalled), under the shim with ``mpu=``, under the shim
with ``mesh=DeepSpeedDeviceMesh.from_mpu(mpu)`` (what the codemods write), and under the shim with
the layout also in the config's ``"mesh"`` section. Usage: ``torchrun --nproc_per_node 8 train_mpu_shapes.py OUT``.
"""

import sys
import warnings

import torch
import torch.distributed as dist

import common

# isort: split
from megatron_mpu import DEEPSPEED_TEST, MegatronMPU

STEPS = 3
PP, DP, TP = 2, 2, 2


# shape -> the getter families of its mpu (each answers group, world_size and rank)
SHAPES = {
    "dp_mp": DEEPSPEED_TEST,  # only the getters DeepSpeed reads: data parallel and model (= tensor) parallel
    "pipe": {**DEEPSPEED_TEST, "pipe_parallel": "pp"},  # plus the pipeline getters DeepSpeed's grid has
}


def make_mpu(shape: str) -> MegatronMPU:
    """``shape``'s mpu over Megatron's layout (tp fastest, then dp, pp outermost): every rank
    creates every group of tp, dp and pp, in that order."""
    world = dist.get_world_size()
    assert world == PP * DP * TP
    lists = {
        "tp": [list(range(s, s + TP)) for s in range(0, world, TP)],
        "dp": [[p * DP * TP + d * TP + t for d in range(DP)] for p in range(PP) for t in range(TP)],
        "pp": [[p * DP * TP + i for p in range(PP)] for i in range(DP * TP)],
    }
    return MegatronMPU.of_rank_lists(lists, names=SHAPES[shape], getters=("group", "world_size", "rank"))


WAYS = ("plain", "mpu", "mesh", "config")


def config(way: str) -> dict:
    out = {
        "train_batch_size": 4 * DP,
        "train_micro_batch_size_per_gpu": 4,
        "optimizer": {"type": "Adam", "params": {"lr": 1e-2, "torch_adam": True}},
        "gradient_clipping": 0.5,
        "steps_per_print": 10**6,
        "zero_optimization": {"stage": 1},
    }
    if way == "config":
        out["mesh"] = {"pp": PP, "dp": DP, "tp": TP}
    return out


def run(shape: str, way: str, rank: int) -> dict:
    import deepspeed

    from mesh_core import DeepSpeedDeviceMesh

    common.set_mode(way != "plain")
    mpu = make_mpu(shape)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    kwargs = {"mesh": DeepSpeedDeviceMesh.from_mpu(mpu)} if way == "mesh" else {"mpu": mpu}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        engine, *_ = deepspeed.initialize(
            model=model, model_parameters=model.parameters(), config=config(way), **kwargs
        )
    pp_rank = rank // (DP * TP)
    gen = torch.Generator().manual_seed(100 + 10 * pp_rank + mpu.get_data_parallel_rank())
    losses = common.train_steps(engine, gen, STEPS, 4)
    mesh = getattr(engine, "mesh_device", None)
    out = {
        "losses": losses,
        "params": common.params_of(engine.module),
        "dp": engine.dp_world_size,
        "mp": engine.mp_world_size,
        "mp_rank": engine.mpu.get_model_parallel_rank(),
        "mesh": None if way == "plain" else {d: mesh.size(d) for d in ("pp", "dp", "tp", "sp")},
        "mesh_pp": None if way == "plain" else mesh.get_group_ranks("pp"),
    }
    engine.destroy()
    common.set_mode(False)
    return out


def main() -> None:
    out_dir = sys.argv[1]
    rank = common.init_world()
    results = {}
    for shape in SHAPES:
        for way in WAYS:
            try:
                results[(shape, way)] = run(shape, way, rank)
            except Exception as err:  # every rank fails alike (the checks run before any collective)
                results[(shape, way)] = {"error": f"{type(err).__name__}: {err}"}
                common.set_mode(False)
            dist.barrier()
    common.dump(out_dir, rank, results)


if __name__ == "__main__":
    main()
    common.shutdown()
