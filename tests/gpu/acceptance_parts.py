"""The acceptance parts of tests/gpu/nccl_checks.py beyond group creation: training plain vs shim,
an HF Trainer step, pipelines, a weight transfer and member-only creation on a bound world.

Each part is ``part(rank, world, env) -> dict`` with ``ok`` (and ``skipped`` when the world is too
small); ``env`` carries the backend and device of the run (NCCL on GPUs, gloo on CPU in the dry run).

- zero_bf16: ZeRO 0, 1, 2, 3 in bf16 (fp32 on CPU in the dry run), ``STEPS`` steps, plain
  DeepSpeed (shim uninstalled) then the shim, same seed and data: losses and every parameter
  bit-identical (the driver pins NCCL to the ring algorithm without NVLS for this part, so the two
  runs' communicators reduce alike); skipped with the reason on a GPU without bf16 (before Ampere),
  as is hf_trainer;
- hf_trainer: an HF ``Trainer`` step (tiny Llama built from a config, ZeRO-2) with ``DS_MESH=1``:
  the shim is installed the way the start-up hook does it (``install_from_env``), the engine the
  Trainer built has a mesh and the losses are finite;
- pipelines: a PipelineModule with pp=2 (world >= 2) and pp=4 (world >= 4), plain vs shim losses
  equal, and a mesh with ``p2p_groups=True``: an all_reduce over each p2p pair of this rank;
- transfer: actor (first half of the world, tp) -> rollout (second half, dp) weights with
  ``mesh_core.transfer``, bit for bit; then one rank passes a tensor its world cannot move (a CPU
  tensor on NCCL, a meta tensor on gloo): the same error on every rank, before any message;
- weight_link: each rank runs a one-rank sending job and a one-rank receiving job (threads) joined
  by a ``mesh_core.transfer.WeightLink``: bf16 weights on this rank's GPU travel through the
  link's page-locked host buffers into GPU shards, bit for bit, twice (the second sync cached);
  fp32 on the host in the dry run, where boxes travel from and into the tensors themselves;
- link_reads: each rank receives host weights from a one-rank sending job it starts as another
  process, through a ``WeightLink`` left to choose (``transport="auto"``): bit for bit, twice; the
  line says whether the kernel let the receiver read the sender's memory (Yama's ptrace_scope is
  reported: Ubuntu's default, 1, is where the sending link lets its user in) or the pair fell back
  to gloo;
- member_only_bound: every rank builds a mesh over itself alone, then ranks 0..world/2-1 a
  sub-world mesh, by their members only, on the (bound, on GPUs) world: all_reduces over them.
"""

from __future__ import annotations

import math
import os
import sys
from typing import Any, Callable

import torch
import torch.distributed as dist

STEPS = int(os.environ.get("MESH_GPU_STEPS", "12"))
SECRET = "gpu-check"  # the weight links' shared secret (both ends are this run's processes)


class Env:
    """The run's backend and device (``dry``: gloo on CPU)."""

    def __init__(self, dry: bool) -> None:
        self.dry = dry
        self.backend, self.device = ("gloo", "cpu") if dry else ("nccl", "cuda")

    def tensor_device(self) -> torch.device:
        return torch.device("cpu") if self.dry else torch.device("cuda", torch.cuda.current_device())

    def no_bf16(self) -> "str | None":
        """Why this GPU cannot run the bf16 parts (None when it can; the dry run computes in fp32)."""
        if self.dry:
            return None
        major, minor = torch.cuda.get_device_capability()
        if (major, minor) >= (8, 0):
            return None
        return (
            f"{torch.cuda.get_device_name()} (compute capability {major}.{minor}) has no bf16: the bf16 parts "
            "need Ampere (8.0) or newer"
        )


def set_shim(on: bool) -> None:
    import compat.install as installer

    (installer.install if on else installer.uninstall)()


def _model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)
    )


def _train(stage: int, shim: bool, env: Env, steps: int) -> tuple[list[float], list[torch.Tensor]]:
    import deepspeed

    set_shim(shim)
    net = _model(11)
    config = {
        "train_micro_batch_size_per_gpu": 4,
        "steps_per_print": 10**9,
        "optimizer": {"type": "Adam", "params": {"lr": 1e-2, "torch_adam": True}},
        "zero_optimization": {"stage": stage, "stage3_param_persistence_threshold": 0},
    }
    if not env.dry:
        config["bf16"] = {"enabled": True}
    engine, *_ = deepspeed.initialize(model=net, model_parameters=net.parameters(), config=config)
    gen = torch.Generator().manual_seed(7 + dist.get_rank())
    dtype = torch.bfloat16 if not env.dry else torch.float32
    losses = []
    for _ in range(steps):
        x = torch.randn(4, 16, generator=gen).to(engine.device, dtype)
        loss = engine(x).float().pow(2).mean()
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    params = list(engine.module.parameters())
    with deepspeed.zero.GatheredParameters(params, enabled=hasattr(params[0], "ds_id")):
        got = [p.detach().float().cpu().clone() for p in params]
    engine.destroy()
    return losses, got


def part_zero_bf16(rank: int, world: int, env: Env) -> dict:
    if env.no_bf16():
        return {"ok": True, "skipped": env.no_bf16()}
    steps = STEPS if not env.dry else min(STEPS, 3)
    out: dict[str, Any] = {"ok": True, "steps": steps, "dtype": "fp32 (dry run)" if env.dry else "bf16"}
    try:
        for stage in range(4):
            plain = _train(stage, False, env, steps)
            shim = _train(stage, True, env, steps)
            same_losses = plain[0] == shim[0]
            same_params = all(torch.equal(a, b) for a, b in zip(plain[1], shim[1]))
            out[f"zero{stage}"] = {
                "identical_losses": same_losses,
                "identical_params": same_params,
                "last_loss": shim[0][-1],
            }
            out["ok"] = out["ok"] and same_losses and same_params and math.isfinite(shim[0][-1])
    finally:
        set_shim(True)
    return out


def part_hf_trainer(rank: int, world: int, env: Env) -> dict:
    try:
        import accelerate  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as err:
        return {
            "ok": False,
            "error": f"{err}: bring the transformers and accelerate wheels (tools/gpu_check.sh --wheels)",
        }
    if env.no_bf16():
        return {"ok": True, "skipped": env.no_bf16()}
    import compat.install as installer

    installer.uninstall()
    os.environ["DS_MESH"] = "1"
    installed = installer.install_from_env()  # what the start-up hook does with DS_MESH=1
    if env.dry:
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "e2e"))
        from client_jobs import tell_accelerate_about_gloo

        tell_accelerate_about_gloo()
    import transformers as tf

    torch.manual_seed(0)
    model = tf.LlamaForCausalLM(
        tf.LlamaConfig(
            vocab_size=64,
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=2,
            max_position_embeddings=32,
        )
    )
    gen = torch.Generator().manual_seed(3)
    ids = torch.randint(0, 64, (4 * world, 8), generator=gen)
    data = [{"input_ids": row, "labels": row.clone()} for row in ids]
    config = {
        "train_micro_batch_size_per_gpu": "auto",
        "gradient_accumulation_steps": "auto",
        "train_batch_size": "auto",
        "zero_optimization": {"stage": 2},
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 10**9,
    }
    if not env.dry:
        config["bf16"] = {"enabled": "auto"}
    args = tf.TrainingArguments(
        output_dir=os.path.join(os.environ.get("MESH_GPU_OUT", "/tmp"), "hf_trainer"),
        per_device_train_batch_size=2,
        max_steps=2,
        learning_rate=1e-3,
        logging_steps=1,
        report_to=[],
        save_strategy="no",
        deepspeed=config,
        seed=0,
        disable_tqdm=True,
        dataloader_num_workers=0,
        bf16=not env.dry,
        use_cpu=env.dry,
        accelerator_config={"use_configured_state": True} if env.dry else None,
    )
    trainer = tf.Trainer(model=model, args=args, train_dataset=data)
    result = trainer.train()
    engine = trainer.model_wrapped
    mesh = getattr(engine, "mesh_device", None)
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    ok = bool(installed) and mesh is not None and bool(losses) and all(math.isfinite(v) for v in losses)
    out = {
        "ok": ok,
        "shim_installed": bool(installed),
        "mesh": None if mesh is None else mesh.spec.describe(),
        "losses": losses,
        "train_loss": result.training_loss,
    }
    if hasattr(engine, "destroy"):
        engine.destroy()
    del trainer, engine
    os.environ.pop("DS_MESH", None)
    set_shim(True)
    return out


def _pipe_losses(pp: int, world: int, shim: bool, env: Env) -> list[float]:
    import deepspeed
    from deepspeed.pipe import PipelineModule

    set_shim(shim)
    deepspeed.init_distributed(dist_backend=env.backend)  # PipelineModule asks deepspeed.comm for ranks
    torch.manual_seed(0)
    layers = (
        [torch.nn.Linear(8, 32), torch.nn.ReLU()]
        + [torch.nn.Linear(32, 32), torch.nn.ReLU()] * (pp - 1)
        + [torch.nn.Linear(32, 1)]
    )
    model = PipelineModule(layers=layers, num_stages=pp, loss_fn=torch.nn.MSELoss(), partition_method="uniform")
    config = {
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": pp,
        "steps_per_print": 10**9,
        "optimizer": {"type": "Adam", "params": {"lr": 1e-2, "torch_adam": True}},
    }
    if shim:
        config["mesh"] = {"pp": pp, "dp": world // pp}
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    dp_rank = engine.grid.get_data_parallel_id()
    gen = torch.Generator().manual_seed(dp_rank)

    def batches():
        while True:
            x = torch.randn(2, 8, generator=gen)
            yield x.to(engine.device), x.sum(dim=1, keepdim=True).to(engine.device)

    data = batches()
    losses = [float(engine.train_batch(data_iter=data)) for _ in range(2)]
    engine.destroy()
    return losses


def part_pipelines(rank: int, world: int, env: Env) -> dict:
    from mesh_core import DeepSpeedDeviceMesh

    if world < 2:
        return {"ok": True, "skipped": "pipelines need a world of >= 2"}
    out: dict[str, Any] = {"ok": True}
    try:
        for pp in (2, 4):
            if world % pp:
                out[f"pp{pp}"] = {"skipped": f"world {world} is not a multiple of {pp}"}
                continue
            plain, shim = _pipe_losses(pp, world, False, env), _pipe_losses(pp, world, True, env)
            mesh = DeepSpeedDeviceMesh.build(
                pp=pp, dp=world // pp, p2p_groups=True, backend=env.backend, device_type=env.device
            )
            sums = {}
            for pair in sorted({tuple(sorted(p)) for p in mesh.layout.p2p_pairs()}):  # one global order
                if rank in pair:
                    peer = pair[1] if pair[0] == rank else pair[0]
                    value = torch.tensor([float(rank + 1)], device=env.tensor_device())
                    dist.all_reduce(value, group=mesh.p2p_group(peer))
                    sums[f"{pair[0]}-{pair[1]}"] = value.item() == float(pair[0] + pair[1] + 2)
            mesh.destroy()
            same = plain == shim
            out[f"pp{pp}"] = {"identical_losses": same, "losses": shim, "p2p_pairs_ok": sums}
            out["ok"] = out["ok"] and same and bool(sums) and all(sums.values())
    finally:
        set_shim(True)
    return out


def part_transfer(rank: int, world: int, env: Env) -> dict:
    from mesh_core import MeshSpec, MeshSpecError
    from mesh_core.transfer import ParamLayout, transfer

    if world < 2:
        return {"ok": True, "skipped": "a transfer between two meshes needs a world of >= 2"}
    half = world // 2
    actor_ranks, rollout_ranks = list(range(half)), list(range(half, 2 * half))
    actor = MeshSpec.build(world, tp=half, ranks=actor_ranks)
    rollout = MeshSpec.build(world, dp=half, ranks=rollout_ranks)
    shapes = {"up": (8 * half, 16), "down": (16, 8 * half), "bias": (16,)}
    layouts = {
        "up": ParamLayout(shapes["up"], shard_dim=0),
        "down": ParamLayout(shapes["down"], shard_dim=1),
        "bias": ParamLayout(shapes["bias"]),
    }
    gen = torch.Generator().manual_seed(5)
    full = {
        n: torch.randn(s, generator=gen).to(torch.bfloat16 if not env.dry else torch.float32) for n, s in shapes.items()
    }
    device = env.tensor_device()
    src = None
    if rank in actor_ranks:
        i = actor_ranks.index(rank)
        src = {"up": full["up"][8 * i : 8 * i + 8], "down": full["down"][:, 8 * i : 8 * i + 8], "bias": full["bias"]}
        src = {n: t.contiguous().to(device) for n, t in src.items()}
    dst = (
        {n: torch.zeros(s, dtype=full[n].dtype, device=device) for n, s in shapes.items()}
        if rank in rollout_ranks
        else None
    )
    dst_layouts = {n: ParamLayout(s) for n, s in shapes.items()}
    stats = transfer(actor, rollout, src, dst, layouts, dst_layouts)
    exact = dst is None or all(torch.equal(dst[n].cpu(), full[n]) for n in shapes)
    # a tensor the world cannot move: refused on every rank before any message
    bad_src = src
    if rank == 0 and src is not None:
        bad_src = dict(src, bias=src["bias"].to("meta" if env.dry else "cpu"))
    try:
        transfer(actor, rollout, bad_src, dst, layouts, dst_layouts)
        refused = "not refused"
    except MeshSpecError as err:
        refused = str(err)
    expected = "is on meta" if env.dry else "is on cpu, but the world's backend"
    return {"ok": exact and expected in refused, "exact": exact, "messages": stats.messages, "refused": refused[:300]}


def part_weight_link(rank: int, world: int, env: Env) -> dict:
    import socket
    import threading
    from datetime import timedelta

    from mesh_core.transfer import WeightLink

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{s.getsockname()[1]}"
    device, dtype = env.tensor_device(), torch.float32 if env.dry else torch.bfloat16
    gen = torch.Generator().manual_seed(11 + rank)
    weights = {
        "up": torch.randn(1024, 512, generator=gen).to(dtype).to(device),  # 1 MiB in bf16: travels alone
        "norm": torch.randn(512, generator=gen).to(dtype).to(device),
    }  # small: packed
    shards = {n: torch.zeros_like(t) for n, t in weights.items()}
    links: dict = {}
    errors: list = []
    sent: list = []
    received: list = []

    def run(role: str) -> None:
        try:
            link = links[role] = WeightLink(
                address, role, rank=0, world_size=1, secret=SECRET, timeout=timedelta(seconds=60)
            )
            for step in range(2):
                if role == "sender":
                    for t in weights.values():
                        t.add_(1)  # a training step, in place
                    sent.append({n: t.cpu().clone() for n, t in weights.items()})
                    link.send(weights)
                else:
                    link.receive(shards)
                    received.append({n: t.cpu().clone() for n, t in shards.items()})
        except Exception as err:  # noqa: BLE001 (reported in the part's line)
            errors.append(f"{role}: {type(err).__name__}: {err}"[:300])

    threads = [threading.Thread(target=run, args=(role,)) for role in ("sender", "receiver")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=75)
    exact = [all(torch.equal(got[n], want[n]) for n in weights) for got, want in zip(received, sent)]
    pools = {role: link._cache["pool"] for role, link in links.items() if link._cache is not None}
    staged = {role: pool.nbytes for role, pool in pools.items()}
    pinned = (
        None
        if env.dry
        else {role: bool(pool._free) and all(b.is_pinned() for b in pool._free) for role, pool in pools.items()}
    )
    ok = not errors and exact == [True, True] and len(pools) == 2
    if not env.dry:  # every region off the host went through a page-locked host buffer
        ok = (
            ok
            and all(staged[r] >= weights["up"].numel() * weights["up"].element_size() for r in staged)
            and all(pinned.values())
        )
    return {"ok": ok, "exact": exact, "errors": errors, "host_buffer_bytes": staged, "pinned": pinned}


_LINK_READS_SENDER = """
import sys
from datetime import timedelta
import torch
from mesh_core.transfer import WeightLink
link = WeightLink(sys.argv[1], "sender", rank=0, world_size=1, secret=sys.argv[2], timeout=timedelta(seconds=60),
                  transport="reads")
weights = {"up": torch.arange(1024 * 512, dtype=torch.float32).view(1024, 512), "norm": torch.ones(512)}
for _ in range(2):
    for t in weights.values():
        t.add_(1)  # a training step, in place
    link.send(weights)
"""


def part_link_reads(rank: int, world: int, env: Env) -> dict:
    import socket
    import subprocess
    from datetime import timedelta

    from mesh_core.transfer import WeightLink
    from mesh_core.transfer import _memory as transfer_memory

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{s.getsockname()[1]}"
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    sender = subprocess.Popen(
        [sys.executable, "-c", _LINK_READS_SENDER, address, SECRET],
        cwd=root,
        env=dict(os.environ, PYTHONPATH=root),
        stderr=subprocess.PIPE,
        text=True,
    )
    errors, exact, read, received = [], [], [], []
    try:
        link = WeightLink(
            address, "receiver", rank=0, world_size=1, secret=SECRET, timeout=timedelta(seconds=60), transport="reads"
        )
        shards = {"up": torch.zeros(1024, 512), "norm": torch.zeros(512)}
        for step in range(2):
            stats = link.receive(shards)
            want = torch.arange(1024 * 512, dtype=torch.float32).view(1024, 512) + step + 1
            exact.append(torch.equal(shards["up"], want) and torch.equal(shards["norm"], torch.ones(512) + step + 1))
            read.append(stats.read_bytes)
            received.append(stats.received_bytes)
    except Exception as err:  # noqa: BLE001 (reported in the part's line)
        errors.append(f"receiver: {type(err).__name__}: {err}"[:300])
    try:
        _, err_text = sender.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        sender.kill()
        _, err_text = sender.communicate()
    if sender.returncode:
        errors.append(f"sender exited {sender.returncode}: {err_text[-300:]}")
    return {
        "ok": not errors and exact == [True, True],
        "exact": exact,
        "errors": errors,
        "reads_used": bool(read) and read == received,
        "read_bytes": read,
        "yama_ptrace_scope": transfer_memory._yama_scope(),
        "reads_available": transfer_memory.available(),
    }


def part_member_only_bound(rank: int, world: int, env: Env) -> dict:
    from mesh_core import DeepSpeedDeviceMesh

    world_group = dist.distributed_c10d._get_default_group()
    out: dict[str, Any] = {"bound_device": str(getattr(world_group, "bound_device_id", None))}
    # a one-rank group, created by its one member while every other rank creates its own
    alone = DeepSpeedDeviceMesh.build(ranks=[rank], dp=1, backend=env.backend, device_type=env.device)
    value = torch.tensor([float(rank + 1)], device=env.tensor_device())
    dist.all_reduce(value, group=alone.get_group("dp"))
    out["alone"] = {"sum": value.item(), "path": alone.creation_path.name}
    ok = value.item() == float(rank + 1)
    alone.destroy()
    members = list(range(max(1, world // 2)))  # a sub-world mesh: the other ranks never call
    if rank in members:
        sub = DeepSpeedDeviceMesh.build(ranks=members, tp=len(members), backend=env.backend, device_type=env.device)
        value = torch.tensor([float(rank + 1)], device=env.tensor_device())
        dist.all_reduce(value, group=sub.get_group("tp"))
        out["sub_world"] = {"members": members, "sum": value.item(), "path": sub.creation_path.name}
        ok = ok and value.item() == float(sum(r + 1 for r in members))
        sub.destroy()
    out["ok"] = ok
    return out


PARTS: dict[str, Callable[[int, int, Env], dict]] = {
    "zero_bf16": part_zero_bf16,
    "hf_trainer": part_hf_trainer,
    "pipelines": part_pipelines,
    "transfer": part_transfer,
    "weight_link": part_weight_link,
    "link_reads": part_link_reads,
    "member_only_bound": part_member_only_bound,
}
