"""Ulysses sequence parallelism (sp=2) x data parallelism (dp=2) on the mesh.

    torchrun --nproc-per-node 4 examples/ulysses_sp2.py

The mesh is built first, from the same config, because the attention layer needs its sequence
group at construction; ``deepspeed.initialize(..., mesh=mesh)`` then uses that very mesh. Each
rank of an sp group holds one half of the sequence; ``DistributedAttention`` swaps sequence and
head sharding around the local attention. Gradients are averaged over dp x sp.
"""

import argparse

import torch
import torch.nn.functional as F

import compat

compat.install()  # or leave this out and run with DS_MESH=1

import deepspeed  # noqa: E402
from deepspeed.sequence.layer import DistributedAttention  # noqa: E402

from common import check_replicas, init_gloo, ranks, say, say0, shutdown  # noqa: E402

# isort: split
from mesh_core import DeepSpeedDeviceMesh  # noqa: E402

CONFIG = {
    "mesh": {"sp": 2},  # dp = 4 / sp = 2
    "train_micro_batch_size_per_gpu": 2,
    "optimizer": {"type": "Adam", "params": {"lr": 1e-2, "torch_adam": True}},
    "steps_per_print": 10**6,
}
SEQ, HIDDEN, HEADS = 16, 32, 4


class LocalAttention(torch.nn.Module):
    """Attention over the whole sequence for this rank's heads: [s, b, h, d] in and out."""

    def forward(self, q, k, v, *args, **kwargs):
        out = F.scaled_dot_product_attention(*(t.permute(1, 2, 0, 3) for t in (q, k, v)))
        return out.permute(2, 0, 1, 3).contiguous()


class SequenceParallelBlock(torch.nn.Module):
    def __init__(self, sp_group) -> None:
        super().__init__()
        self.qkv = torch.nn.Linear(HIDDEN, 3 * HIDDEN)
        self.attn = DistributedAttention(LocalAttention(), sp_group, scatter_idx=2, gather_idx=0)
        self.out = torch.nn.Linear(HIDDEN, 1)

    def forward(self, x):  # x: [s/sp, b, hidden]
        s, b, _ = x.shape
        q, k, v = (t.reshape(s, b, HEADS, HIDDEN // HEADS) for t in self.qkv(x).chunk(3, dim=-1))
        context = self.attn(q, k, v, batch_dim_idx=1)
        return self.out(context.reshape(s, b, HIDDEN))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=5)
    steps = parser.parse_args().steps
    init_gloo()
    mesh = DeepSpeedDeviceMesh.from_config(CONFIG)
    torch.manual_seed(0)
    model = SequenceParallelBlock(mesh.get_group("sp"))
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=CONFIG, mesh=mesh)
    assert engine.mesh_device is mesh
    say0(f"mesh: {mesh}")
    say(
        f"sp group {ranks(engine.seq_parallel_group)}, dp group {ranks(engine.data_parallel_group)},"
        f" gradient group {ranks(engine.seq_data_parallel_group)}"
    )
    gen = torch.Generator().manual_seed(mesh.get_local_rank("dp"))  # sp peers see the same samples
    shard = slice(mesh.get_local_rank("sp") * SEQ // 2, (mesh.get_local_rank("sp") + 1) * SEQ // 2)
    for step in range(steps):
        x = torch.randn(SEQ, 2, HIDDEN, generator=gen)
        target = x.mean(dim=-1, keepdim=True)
        loss = F.mse_loss(engine(x[shard]), target[shard])
        engine.backward(loss)
        engine.step()
        say0(f"step {step}: loss {loss.item():.4f}")
    check_replicas(engine.module)  # sp and dp replicas stay in sync (gradients averaged over dp x sp)


if __name__ == "__main__":
    main()
    shutdown()
