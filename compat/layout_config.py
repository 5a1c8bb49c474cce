"""What deepspeed's config sees of the engine's mesh: AutoTP from ``mesh.tp``, batch sizing, AutoSP's sp.

- ``"mesh": {"tp": N}`` enables AutoTP exactly as ``"tensor_parallel": {"autotp_size": N}`` does
  (:func:`with_autotp_from_mesh`): the engine shards the model over the mesh's tp groups, with the
  same model-policy / ``partition_config`` requirements. It is not added when the config already
  sets ``tensor_parallel.autotp_size`` (a different value >1 is a disagreement the spec rejects;
  ``1`` keeps the tp dim for groups only, for a model that does its own tensor parallelism), when
  an ``mpu`` or ``mesh=`` is given (the model is then tensor-parallel already) or for a
  ``PipelineModule``.
- Batch sizing (:func:`config_call_for_mesh`): with AutoTP and no mpu, deepspeed 0.19.8 sizes
  ``train_batch_size = micro * gas * world_size`` with ``world_size = world / sequence_parallel_size``
  — the tp ranks count. The shim keeps that rule for AutoTP (it sized by the mesh's dp before,
  which broke AutoTP configs legacy accepts: ``16 != 4 * 1 * 2``, or a silently different gas);
  other meshes are sized by their dp, as deepspeed sizes its own ``mesh_device``.
- AutoSP reads ``sequence_parallel_size`` from the engine's config dict
  (``compile/custom_ops/sp_dp_registry.py``); the shim consumes that key into the mesh, so it is
  put back into the dict deepspeed's config keeps, with the mesh's sp size.
"""

from __future__ import annotations

import logging
from typing import Any, Optional

from mesh_core.runtime_hooks import autotp_off  # the one AutoTP-off rule (re-exported for compat.initialize)

logger = logging.getLogger(__name__)


def with_autotp_from_mesh(
    config: dict[str, Any], tp: int, *, mpu: Any, given_mesh: Any, pipeline: bool
) -> dict[str, Any]:
    """``config`` with ``tensor_parallel.autotp_size = tp`` when the ``"mesh"`` section's tp should
    drive AutoTP (see the module docstring); otherwise ``config`` unchanged."""
    section = config.get("mesh")
    if tp <= 1 or not isinstance(section, dict) or section.get("tp") in (None, 1, "auto"):
        return config
    tensor_parallel = config.get("tensor_parallel")
    if isinstance(tensor_parallel, dict) and tensor_parallel.get("autotp_size") is not None:
        if autotp_off(config):
            logger.info(
                "config 'mesh.tp'=%s with tensor_parallel.autotp_size=%s: tp groups only, no AutoTP",
                tp,
                tensor_parallel.get("autotp_size"),
            )
        return config
    if mpu is not None or given_mesh is not None or pipeline:
        return config
    logger.info("config 'mesh.tp'=%s enables AutoTP (as tensor_parallel.autotp_size=%s would)", tp, tp)
    return dict(config, tensor_parallel=dict(tensor_parallel or {}, autotp_size=tp))


def with_tp_model_init(config: dict[str, Any], *, mpu: Any, mesh_param: Any) -> dict[str, Any]:
    """``config`` with the tp size ``deepspeed.tp_model_init(model, tp_size=N)`` recorded, as
    deepspeed's ``merge_tp_model_init_into_config`` will set it inside ``initialize`` (so the mesh
    is built with that tp): only when it will auto-create the TP groups (no tp_group, mpu or
    mesh_param) and the config states no ``autotp_size``."""
    try:
        from deepspeed.runtime.tensor_parallel import init_utils
    except ImportError:
        return config
    recorded = getattr(init_utils, "_TP_MODEL_INIT_ARGS", None)
    if not recorded or recorded.get("tp_group") is not None or mpu is not None or mesh_param is not None:
        return config
    tp_size = int(recorded.get("tp_size") or 1)
    tensor_parallel = config.get("tensor_parallel")
    if tp_size <= 1 or (isinstance(tensor_parallel, dict) and tensor_parallel.get("autotp_size") is not None):
        return config
    return dict(config, tensor_parallel=dict(tensor_parallel or {}, autotp_size=tp_size))


def config_call_for_mesh(call: dict[str, Any], mesh: Any) -> dict[str, Any]:
    """The ``DeepSpeedConfig.__init__`` arguments (bound by name) for an engine built on ``mesh``
    inside ``deepspeed.initialize``; an mpu or mesh_device already given is left alone."""
    if call.get("mpu") is not None or call.get("mesh_device") is not None:
        return call
    call = dict(call)
    sp = _dim(mesh, "sp")
    config = call.get("config")
    if sp > 1 and isinstance(config, dict) and config.get("sequence_parallel_size") in (None, 1):
        # AutoSP (and deepspeed's own batch rule) read the sp size from the config dict
        call["config"] = dict(config, sequence_parallel_size=sp)
    if _autotp_size(call.get("config")) > 1:
        # legacy AutoTP sizes batches over world / sequence_parallel_size: tp ranks count (see docstring)
        return call
    call["mesh_device"] = mesh
    return call


def _autotp_size(config: Any) -> int:
    tensor_parallel = config.get("tensor_parallel") if isinstance(config, dict) else None
    size = tensor_parallel.get("autotp_size") if isinstance(tensor_parallel, dict) else None
    try:
        return int(size or 0)
    except (TypeError, ValueError):
        return 0


def _dim(mesh: Any, name: str) -> int:
    spec: Optional[Any] = getattr(mesh, "spec", None)
    try:
        return int(spec.dim_size(name)) if spec is not None else 1
    except (KeyError, ValueError, AttributeError):
        return 1
