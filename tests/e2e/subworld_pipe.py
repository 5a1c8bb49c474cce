"""Two pipeline engines on disjoint halves of a 4-rank world (run by tests/e2e/test_subworld_pipe.py).

Ranks 0-1 build a 2-stage pipeline of model A, ranks 2-3 a 2-stage pipeline of model B (with a weight
tied between its first and last stage), each half constructing its PipelineModule with
``topology=compat.mesh_topology({"ranks": half, "pp": 2})`` and calling ``deepspeed.initialize`` for
its own model only; then a whole-world ZeRO-1 engine joins, its step interleaved with the pipelines'
last step. Reference: every rank also trains the same model unpipelined in plain torch
(same per-layer seeds, same data, same SGD), so the pipeline's losses must equal it.

usage: subworld_pipe.py OUT_DIR
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist

from common import dump, init_world, ranks, shutdown

# isort: split

import compat  # noqa: E402
from mesh_core import MeshSpecError  # noqa: E402

compat.install()
import deepspeed  # noqa: E402
from deepspeed.runtime import utils as ds_utils  # noqa: E402
from deepspeed.runtime.pipe import LayerSpec, PipelineModule, TiedLayerSpec  # noqa: E402

STEPS, MICRO, GAS, WIDTH, SEED = 4, 2, 2, 8, 1234
CFG = {
    "train_micro_batch_size_per_gpu": MICRO,
    "gradient_accumulation_steps": GAS,
    "steps_per_print": 10**6,
    "optimizer": {"type": "SGD", "params": {"lr": 0.05}},
}


def specs(model: str) -> list:
    if model == "A":
        return [
            LayerSpec(torch.nn.Linear, WIDTH, 16),
            LayerSpec(torch.nn.Tanh),
            LayerSpec(torch.nn.Linear, 16, 16),
            LayerSpec(torch.nn.Tanh),
            LayerSpec(torch.nn.Linear, 16, WIDTH),
        ]
    return [
        TiedLayerSpec("tied", torch.nn.Linear, WIDTH, WIDTH),
        LayerSpec(torch.nn.Tanh),
        LayerSpec(torch.nn.Linear, WIDTH, WIDTH),
        LayerSpec(torch.nn.Tanh),
        TiedLayerSpec("tied", torch.nn.Linear, WIDTH, WIDTH),
    ]


def reference_layers(model: str) -> list:
    """The layers as PipelineModule(seed_layers=True) builds them, in one process. A tied spec on another
    stage is its own module whose tied attribute (``weight``) is the first occurrence's parameter: the
    pipeline broadcasts only ``tied_weight_attr`` from the first stage and all-reduces only its grads."""
    layers, tied = [], {}
    for idx, spec in enumerate(specs(model)):
        ds_utils.set_random_seed(SEED + idx)
        layers.append(spec.build())
        if isinstance(spec, TiedLayerSpec):
            if spec.key in tied:
                layers[-1].weight = tied[spec.key].weight
            else:
                tied[spec.key] = layers[-1]
    return layers


def batches(model: str) -> list:
    gen = torch.Generator().manual_seed(7 if model == "A" else 11)
    return [
        [(torch.randn(MICRO, WIDTH, generator=gen), torch.randn(MICRO, WIDTH, generator=gen)) for _ in range(GAS)]
        for _ in range(STEPS)
    ]


def reference_losses(model: str) -> list[float]:
    layers = reference_layers(model)
    params = list({id(p): p for layer in layers for p in layer.parameters()}.values())
    opt = torch.optim.SGD(params, lr=0.05)
    losses = []
    for step in batches(model):
        opt.zero_grad()
        total = 0.0
        for x, y in step:
            out = x
            for layer in layers:
                out = layer(out)
            loss = torch.nn.functional.mse_loss(out, y) / GAS
            loss.backward()
            total += loss.item()
        opt.step()
        losses.append(total)
    return losses


def all_group_ranks() -> list[list[int]]:
    """Every process group this rank is a member of (besides the default one)."""
    c10d = dist.distributed_c10d
    return sorted(sorted(m) for pg, m in c10d._world.pg_group_ranks.items() if pg is not c10d.GroupMember.WORLD)


def main(out_dir: str) -> None:
    rank = init_world()
    half = [0, 1] if rank < 2 else [2, 3]
    model = "A" if rank < 2 else "B"
    report: dict = {"reference": reference_losses(model)}
    other = [2, 3] if rank < 2 else [0, 1]
    before = all_group_ranks()
    try:  # the other half's pipeline: refused here, before any group
        compat.mesh_topology({"ranks": other, "pp": 2})
        report["non_member_error"] = None
    except MeshSpecError as err:
        report["non_member_error"] = str(err)
    report["groups_after_refusal"] = all_group_ranks() == before

    module = PipelineModule(
        specs(model),
        topology=compat.mesh_topology({"ranks": half, "pp": 2}),
        loss_fn=torch.nn.MSELoss(),
        seed_layers=True,
        base_seed=SEED,
        partition_method="uniform",
    )
    engine, *_ = deepspeed.initialize(model=module, model_parameters=module.parameters(), config=CFG)
    grid = engine.grid
    report.update(
        mesh=engine.mesh_device.spec.describe(),
        stage=grid.get_stage_id(),
        pp_group=ranks(grid.get_pipe_parallel_group()),
        pp_group_ranks=grid.pp_group,
        pipe_groups=grid.pipe_groups,
        dp_group=ranks(grid.get_data_parallel_group()),
        world_group=ranks(module.world_group),
        module_rank=module.global_rank,
        peer=grid.stage_to_global(1 - grid.get_stage_id()),
        tied=sorted(c["ranks"] for c in module.tied_comms.values()),
        topo_pipe_lists=module.topology().get_axis_comm_lists("pipe"),
        topo_stage1=module.topology().filter_match(pipe=1),
        topo_mapping=sorted(module.topology().mapping.values()),
    )
    losses = []
    steps = batches(model)
    for step in steps[:-1]:
        losses.append(float(engine.train_batch(data_iter=iter(step))))
    report["groups"] = all_group_ranks()  # before the whole-world engine below
    # a whole-world engine beside the two pipelines; its step and the pipeline's last one interleave
    torch.manual_seed(0)
    net = torch.nn.Linear(WIDTH, WIDTH)
    world_cfg = {
        **CFG,
        "gradient_accumulation_steps": 1,
        "zero_optimization": {"stage": 1},
        "zero_allow_untested_optimizer": True,
    }
    world, *_ = deepspeed.initialize(model=net, model_parameters=net.parameters(), config=world_cfg)
    x = torch.randn(MICRO, WIDTH, generator=torch.Generator().manual_seed(3))
    world_loss = world(x).pow(2).mean()
    world.backward(world_loss)
    losses.append(float(engine.train_batch(data_iter=iter(steps[-1]))))
    world.step()
    report["world_dp_group"] = ranks(world.mpu.get_data_parallel_group()) if world.mpu is not None else None
    report["world_zero_group"] = ranks(world.optimizer.dp_process_group)
    report["world_weight"] = net.weight.detach().clone()
    report["losses"] = losses
    if model == "B":  # the tied weight stays identical on both stages
        weight = module.tied_modules["tied"].weight.detach().clone()
        other = weight.clone()
        peer_group = module.tied_comms["tied"]["group"]
        dist.broadcast(other, src=half[0], group=peer_group)
        report["tied_identical"] = torch.equal(weight, other)
    dump(out_dir, rank, {"pipe": report})
    shutdown()


if __name__ == "__main__":
    main(sys.argv[1])
