"""Opt-in codemod (``--comm-to-torch``): ``deepspeed.comm`` thin wrappers → ``torch.distributed``.

Each classification was read off deepspeed 0.19.8 (``deepspeed/comm/comm.py`` and the torch backend
``deepspeed/comm/torch.py``):

- THIN: the wrapper forwards to the torch function of the same name with the same arguments (its
  ``prof`` / ``log_name`` / ``debug`` only feed DeepSpeed's comms logger). ``all_reduce`` /
  ``reduce_scatter_tensor`` translate DeepSpeed's own ``ReduceOp`` enum; they are rewritten when
  ``op`` is absent (SUM in both) or a literal ``ReduceOp.X``, which becomes ``torch.distributed.ReduceOp.X``.
  ``all_to_all_single`` names its input ``tensor`` where torch says ``input``.
- KILL SWITCH: ``broadcast``, ``reduce``, ``reduce_scatter``, ``all_gather`` return early when
  their ``DS_COMM_*_OFF`` flag is set (``*_comm_off(True)``).
- BACKEND: ``all_gather_into_tensor`` (ROCm SDMA fast path, and an all_gather fallback),
  ``inference_all_reduce`` (a shared-memory CPU kernel), ``allgather_fn`` / ``reduce_scatter_fn``
  (fallbacks), ``all_reduce_coalesced`` / ``all_gather_coalesced`` (coalescing managers).
- DIFFERENT: functions whose meaning is not torch's (see ``DIFFERENT``).

Every site that is not THIN is left with a ``# TODOV1:`` naming the difference.
"""

from __future__ import annotations

from typing import Optional

import libcst as cst
from libcst.codemod.visitors import AddImportsVisitor

from .._engine.base import MigrationCommand, arg_by, has_star_args

KIND = "deepspeed.comm call"
COMM = "deepspeed.comm"
TORCH = "torch.distributed"
LOGGING_ARGS = ("log_name", "debug")

THIN = frozenset(
    {
        "get_rank",
        "get_world_size",
        "barrier",
        "monitored_barrier",
        "all_to_all_single",
        "all_to_all",
        "send",
        "recv",
        "isend",
        "irecv",
        "gather",
        "scatter",
        "all_gather_object",
        "broadcast_object_list",
        "new_group",
        "is_available",
        "all_reduce",
        "reduce_scatter_tensor",
    }
)
WITH_OP = {"all_reduce": 1, "reduce_scatter_tensor": 2}  # position of ``op``
REDUCE_OPS = frozenset({"SUM", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR", "AVG"})

KILL_SWITCH = {
    "broadcast": "DS_COMM_BROADCAST_OFF (broadcast_comm_off) makes it a no-op",
    "reduce": "DS_COMM_REDUCE_OFF (reduce_comm_off) makes it a no-op",
    "reduce_scatter": "DS_COMM_REDUCE_SCATTER_OFF (reduce_scatter_comm_off) makes it a no-op",
    "all_gather": "DS_COMM_ALL_GATHER_OFF (all_gather_comm_off) makes it a no-op",
}
BACKEND = {
    "all_gather_into_tensor": "DeepSpeed takes a ROCm SDMA fast path on the world group and falls back to all_gather",
    "inference_all_reduce": "DeepSpeed uses its shared-memory CPU all-reduce kernel when built",
    "allgather_fn": "falls back to all_gather when all_gather_into_tensor is missing",
    "reduce_scatter_fn": "falls back to reduce_scatter when reduce_scatter_tensor is missing",
    "all_reduce_coalesced": "uses the backend's coalescing manager",
    "all_gather_coalesced": "uses the backend's coalescing manager",
}
DIFFERENT = {
    "is_initialized": "DeepSpeed's is True only once its own backend is set up (init_distributed), torch's once any process group is",
    "destroy_process_group": "DeepSpeed's also resets deepspeed.utils.groups state",
    "init_distributed": "also discovers MPI/AML/SageMaker env, picks the accelerator's backend and is idempotent; torch.distributed.init_process_group is not",
    "get_local_rank": "reads the launcher's LOCAL_RANK env; torch has no equivalent; use int(os.environ['LOCAL_RANK'])",
    "get_all_ranks_from_group": "torch.distributed.get_process_group_ranks(group) needs a group (DeepSpeed's accepts None for the world)",
    "batch_isend_irecv": "takes deepspeed.comm.P2POp with op names; build torch.distributed.P2POp(torch.distributed.isend, ...) instead",
    "get_global_rank": "DeepSpeed defaults group=None, group_rank=0; torch.distributed.get_global_rank needs both",
    "configure": "configures DeepSpeed's comms logger; no torch equivalent",
    "log_summary": "DeepSpeed's comms logger; no torch equivalent",
    "initialize_mesh_device": "use torch.distributed.device_mesh.init_device_mesh",
}
ALL = THIN | frozenset(KILL_SWITCH) | frozenset(BACKEND) | frozenset(DIFFERENT) | {"get_world_group"}


def _comm_function(names: set[str]) -> Optional[str]:
    for name in names:
        for prefix in (COMM + ".comm.", COMM + "."):
            if name.startswith(prefix) and "." not in name[len(prefix) :]:
                return name[len(prefix) :]
    return None


class CommToTorchCommand(MigrationCommand):
    DESCRIPTION = "deepspeed.comm thin wrappers -> torch.distributed (opt-in: --comm-to-torch)"
    MARKERS = (("comm",),)
    IDENTIFIERS = (ALL | {"ReduceOp"},)

    def _function(self, node: cst.CSTNode) -> Optional[str]:
        if not self.could_be(node, ALL):
            return None
        fname = _comm_function(self.legacy_names(node))
        return fname if fname in ALL else None

    def _reduce_op(self, node: cst.BaseExpression) -> Optional[str]:
        """X of ``ReduceOp.X`` (deepspeed.comm's or torch's), else None."""
        if not (isinstance(node, cst.Attribute) and node.attr.value in REDUCE_OPS):
            return None
        names = self.legacy_names(node)
        for name in names:
            if name in (
                f"{COMM}.ReduceOp.{node.attr.value}",
                f"{COMM}.reduce_op.ReduceOp.{node.attr.value}",
                f"{COMM}.comm.ReduceOp.{node.attr.value}",
                f"{TORCH}.ReduceOp.{node.attr.value}",
            ):
                return node.attr.value
        return None

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        fname = self._function(original_node.func)
        if fname is None:
            return updated_node
        if fname in KILL_SWITCH:
            return self._todo(
                updated_node,
                f"deepspeed.comm.{fname} kept: {KILL_SWITCH[fname]}; torch.distributed.{fname} has no kill "
                f"switch; use torch.distributed.{fname} if you never set it",
            )
        if fname in BACKEND:
            return self._todo(
                updated_node, f"deepspeed.comm.{fname} kept: {BACKEND[fname]}; keep deepspeed.comm.{fname} for it"
            )
        if fname in DIFFERENT:
            return self._todo(
                updated_node,
                f"deepspeed.comm.{fname} kept: {DIFFERENT[fname]}; keep deepspeed.comm.{fname} where that matters",
            )
        if has_star_args(original_node):
            return self._todo(
                updated_node, f"deepspeed.comm.{fname}(*args): write torch.distributed.{fname}(...) by hand"
            )
        if arg_by(original_node, None, "prof") is not None:
            return self._todo(
                updated_node,
                f"deepspeed.comm.{fname}(prof=...) feeds DeepSpeed's comms logger; torch.distributed has "
                f"none; drop prof= and use torch.distributed.{fname}",
            )
        if fname == "get_world_group":
            if original_node.args:
                return updated_node
            return self._done(cst.parse_expression(f"{TORCH}.group.WORLD"), original_node)
        args = [a for a in updated_node.args if not (a.keyword is not None and a.keyword.value in LOGGING_ARGS)]
        if fname in WITH_OP:
            op = arg_by(original_node, WITH_OP[fname], "op")
            if op is not None:
                name = self._reduce_op(op.value)
                if name is None:
                    return self._todo(
                        updated_node,
                        f"deepspeed.comm.{fname}: op is not a literal ReduceOp.X; torch needs torch.distributed.ReduceOp (DeepSpeed translates its own enum); pass op=torch.distributed.ReduceOp.X",
                    )
                index = original_node.args.index(op)
                args = [
                    a.with_changes(value=cst.parse_expression(f"{TORCH}.ReduceOp.{name}"))
                    if a is updated_node.args[index]
                    else a
                    for a in args
                ]
        if fname == "all_to_all_single":
            args = [
                a.with_changes(keyword=cst.Name("input"))
                if a.keyword is not None and a.keyword.value == "tensor"
                else a
                for a in args
            ]
        if args and args[-1].comma is not cst.MaybeSentinel.DEFAULT:
            args[-1] = args[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
        call = updated_node.with_changes(func=cst.parse_expression(f"{TORCH}.{fname}"), args=args)
        return self._done(call, original_node)

    def _done(self, new: cst.BaseExpression, original: cst.Call) -> cst.BaseExpression:
        AddImportsVisitor.add_needed_import(self.context, TORCH)
        self.record(KIND)
        return new

    def _todo(self, node: cst.Call, message: str) -> cst.Call:
        self.flag(KIND, message)
        return node
