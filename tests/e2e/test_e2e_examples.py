"""The examples not already covered by test_e2e_shim.py run on 4 gloo processes and self-check
(replicas bit-identical where they must be; the reference model adds no communicator)."""

import os
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.multiprocess, pytest.mark.deepspeed]
EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "examples")


def run_example(name: str) -> str:
    env = dict(
        os.environ,
        DS_ACCELERATOR="cpu",
        OMP_NUM_THREADS="1",
    )
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=4",
        os.path.join(EXAMPLES, name),
        "--steps",
        "2",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    return out


def test_ulysses_example_keeps_sp_and_dp_replicas_identical():
    out = run_example("ulysses_sp2.py")
    assert "MeshSpec(dp=2, sp=2;" in out
    assert out.count("parameters identical across ranks all") == 4
    assert "[rank 1] sp group [0, 1], dp group [1, 3], gradient group [0, 1, 2, 3]" in out


def test_rl_example_two_meshes_share_communicators():
    out = run_example("rl_actor_reference.py")
    assert "actor mesh: DeepSpeedDeviceMesh(MeshSpec(dp=2, tp=2;" in out
    assert "reference mesh: DeepSpeedDeviceMesh(MeshSpec(dp=4;" in out
    assert "communicators created for the reference model: 0" in out
    assert "[rank 3] actor tp [2, 3] dp [1, 3]; reference dp [0, 1, 2, 3]" in out
    assert out.count("parameters identical across ranks [") == 4


def test_rl_three_layouts_transfer_weights_bit_for_bit():
    """Actor tp=2 on ranks 0-1 and rollout dp=2 on ranks 2-3 (sub-world engines each half builds
    alone) plus a dp=4 reference: every iteration the actor's weights reach the rollout exactly."""
    out = run_example("rl_actor_rollout.py")
    assert "[rank 0] actor MeshSpec(dp=1, tp=2; ranks 0..1 of world 4); rollout None;" in out
    assert "[rank 3] actor None; rollout MeshSpec(dp=2; ranks 2..3 of world 4); reference MeshSpec(dp=4;" in out
    for step in range(2):
        for rank in (2, 3):
            assert (
                f"[rank {rank}] step {step}: received 420 elements in 2 messages; weights changed; "
                "rollout weights identical to the actor's (bit for bit)"
            ) in out
        assert f"step {step}: actor trained on 16 rollouts" in out
