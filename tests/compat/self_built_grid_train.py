"""A CoLLiE-shaped pipeline (pp=2 x dp=2) trained on 4 gloo ranks: run by torchrun from
``test_self_built_grid_gloo.py``.

The model is a ``PipelineModule`` subclass that replaces its grid with a ``PipelineParallelGrid``
subclass that skips ``super().__init__`` and builds its attributes and process groups itself
(CoLLiE's ``MultiParallelGrid`` takes Megatron's groups; this one makes them with torch). Usage:
``DS_MESH=1 torchrun --nproc_per_node 4 self_built_grid_train.py OUT ds_mesh,legacy,install``: with
``DS_MESH=1`` the start-up hook (what the ``ds_mesh.pth`` line runs) installs the shim before
anything else, so mode ``ds_mesh`` runs the unchanged program on the mesh; ``legacy`` then runs it
with the shim uninstalled and ``install`` after ``compat.install()``. A mode ending in ``_direct``
builds the engine as CoLLiE's own ``initialize`` does: a ``PipelineEngine`` subclass (overriding
``train_batch``) constructed directly with ``mpu=`` the grid, not through ``deepspeed.initialize``;
one ending in ``_seq`` trains a plain ``PipelineModule`` on a topology subclass with a fourth,
``'sequence'`` axis (pp=2 x sequence=2), which no mesh dim expresses. Each rank saves losses,
parameters and groups to ``OUT/<mode>.rank<r>.pt``.
"""

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.setdefault("OMP_NUM_THREADS", "1")
if os.environ.get("DS_MESH"):
    import _ds_mesh_startup  # what the ds_mesh.pth line runs at interpreter start

    _ds_mesh_startup.main()

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

STEPS = 3


def grid_class(base):
    class SelfBuiltGrid(base):
        """Sets the legacy attributes itself; every rank makes every group (as Megatron does)."""

        def __init__(self, topology):
            self.global_rank = dist.get_rank()
            self.world_size = dist.get_world_size()
            self._topo = topology
            self.data_parallel_size = max(topology.get_dim("data"), 1)
            self.pipe_parallel_size = max(topology.get_dim("pipe"), 1)
            self.model_parallel_size = max(topology.get_dim("model"), 1)
            self.slice_parallel_size = self.model_parallel_size
            assert self._is_grid_valid(), "Invalid Grid"
            self.stage_id = self.get_stage_id()
            self.data_parallel_id = self.get_data_parallel_id()
            model_lists = [sorted(topology.get_axis_list("data", d)) for d in range(self.data_parallel_size)]
            self.ds_model_proc_group, model_ranks = _make_groups(model_lists)
            self.ds_model_world_size = len(model_ranks)
            self.ds_model_rank = model_ranks.index(self.global_rank)
            self.dp_proc_group, self.dp_group = _make_groups(topology.get_axis_comm_lists("data"))
            self.is_first_stage = self.stage_id == 0
            self.is_last_stage = self.stage_id == self.pipe_parallel_size - 1
            self.p2p_groups = self._build_p2p_groups()
            self.pp_proc_group, self.pp_group = _make_groups(topology.get_axis_comm_lists("pipe"))
            slices = topology.get_axis_comm_lists("model") or [[r] for r in range(self.world_size)]
            self.slice_proc_group, self.slice_group = _make_groups(slices)

    return SelfBuiltGrid


def _make_groups(rank_lists):
    mine = None
    for ranks in rank_lists:
        group = dist.new_group(ranks=ranks)
        if dist.get_rank() in ranks:
            mine = (group, list(ranks))
    return mine


def run(mode: str, rank: int) -> dict:
    import deepspeed
    from deepspeed.pipe import PipelineModule
    from deepspeed.runtime.pipe import topology as topology_module

    import compat.install as installer

    sequence_axis, mode = mode.endswith("_seq"), mode.removesuffix("_seq")
    shim_mode, direct = mode.removesuffix("_direct"), mode.endswith("_direct")
    if shim_mode == "install":
        installer.install()
    elif shim_mode == "legacy":
        installer.uninstall()
    assert installer.is_installed() == (shim_mode != "legacy")
    Grid = grid_class(topology_module.PipelineParallelGrid)  # the name as the program sees it now

    class SelfGridPipe(PipelineModule):
        def __init__(self, layers, topology, **kwargs):
            super().__init__(layers=layers, topology=topology, **kwargs)
            self._grid = Grid(self._topo)  # "replace with our grid"

    torch.manual_seed(0)
    layers = [torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)]
    if sequence_axis:  # a plain PipelineModule on a topology with a 'sequence' axis (its grid is the base one)

        class SequenceTopology(topology_module.ProcessTopology):
            def __init__(self, num_pp, num_mp, num_dp, num_sp=1):
                super().__init__(axes=["pipe", "data", "model", "sequence"], dims=[num_pp, num_dp, num_mp, num_sp])

        model = PipelineModule(
            layers=layers, topology=SequenceTopology(2, 1, 1, 2), loss_fn=torch.nn.MSELoss(), partition_method="uniform"
        )
    else:
        topo = topology_module.PipeDataParallelTopology(num_pp=2, num_dp=2)
        model = SelfGridPipe(layers, topo, loss_fn=torch.nn.MSELoss(), partition_method="uniform")
    config = {
        "train_batch_size": 8 if sequence_axis else 16,  # 4 x 2 x dp
        "train_micro_batch_size_per_gpu": 4,
        "gradient_accumulation_steps": 2,
        "optimizer": {"type": "Adam", "params": {"lr": 1e-2, "torch_adam": True}},
        "steps_per_print": 10**6,
    }
    if direct:  # CoLLiE's own initialize: its PipelineEngine subclass, built directly with mpu=grid
        from deepspeed.runtime.config import DeepSpeedConfig
        from deepspeed.runtime.pipe.engine import PipelineEngine

        class TrainBatchEngine(PipelineEngine):
            def train_batch(self, data_iter=None):
                self.batches_seen = getattr(self, "batches_seen", 0) + 1
                return super().train_batch(data_iter=data_iter)

        engine = TrainBatchEngine(
            args=None,
            model=model,
            model_parameters=model.parameters(),
            mpu=model.mpu(),
            config=config,
            config_class=DeepSpeedConfig(config, model.mpu()),
        )
    else:
        engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    gen = torch.Generator().manual_seed(100 + rank % 2)  # the dp index picks the data

    def batches():
        while True:
            x = torch.randn(4, 8, generator=gen)
            yield x, x.sum(dim=1, keepdim=True)

    data = batches()
    losses = [engine.train_batch(data_iter=data).item() for _ in range(STEPS)]
    grid = engine.grid
    from deepspeed.utils import groups

    def ranks(group):
        return sorted(dist.get_process_group_ranks(group))

    grid_groups = [grid.get_data_parallel_group(), grid.get_pipe_parallel_group(), grid.get_model_parallel_group()]
    return {
        "engine_mesh": type(getattr(engine, "mesh_device", None)).__name__,
        "grid_groups_unique": len({id(g) for g in grid_groups}),
        "losses": losses,
        "params": {n: p.detach().clone() for n, p in engine.module.named_parameters()},
        "grid_type": type(grid).__name__,
        "grid": {
            "stage_id": grid.stage_id,
            "data_parallel_id": grid.data_parallel_id,
            "p2p": grid.p2p_groups,
            "dp": ranks(grid.get_data_parallel_group()),
            "pp": ranks(grid.get_pipe_parallel_group()),
            "model": ranks(grid.get_model_parallel_group()),
            "slice": ranks(grid.get_slice_parallel_group()),
        },
        "engine": {
            "dp": ranks(engine.data_parallel_group),
            "seq_dp": ranks(engine.seq_data_parallel_group),
            "groups_dp": ranks(groups._get_data_parallel_group()),
            "mp_world_size": groups._get_model_parallel_world_size(),
        },
        # legacy: the engine's data-parallel group is the very group the grid made
        "engine_dp_is_grids": engine.data_parallel_group is grid.get_data_parallel_group(),
        "shim": installer.is_installed(),
    }


def main() -> None:
    out_dir, modes = sys.argv[1], sys.argv[2].split(",")
    import deepspeed

    sys.modules["deepspeed.comm.torch"].build_shm_op = lambda: None
    deepspeed.init_distributed(dist_backend="gloo")
    rank = dist.get_rank()
    for mode in modes:
        torch.save(run(mode, rank), os.path.join(out_dir, f"{mode}.rank{rank}.pt"))
        dist.barrier()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
