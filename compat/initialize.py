"""``deepspeed.initialize`` on the mesh: one :class:`~compat.engine_mesh.EngineMesh` per engine.

:func:`initialize_wrapper` (installed around ``deepspeed.initialize`` by :mod:`compat.install`)
builds the engine's mesh from the config's ``"mesh"`` section plus what the model declares (a
``PipelineModule``'s stages, the MoE layers' ``ep_size``). ``mpu=`` and ``mesh_param=`` still work:
they warn ``TODOV1:`` and are translated into the same mesh; any two sources that disagree raise a
:class:`~mesh_core.MeshSpecError` naming both, before a process group is created. The real
``deepspeed.initialize`` then runs unchanged, with:

- the config without the layout keys it consumed (``"mesh"``, ``data_parallel_size``,
  ``sequence_parallel_size``) and ``mesh_param=None``, so deepspeed builds no torch mesh of its own;
- ``mpu`` replaced by a mesh-backed ``MeshMPU`` when one was given;
- :mod:`compat.groups` bound to the mesh, so every ``groups._get_*`` call is served from it (the
  ZeRO / gradient group is then ``("dp", "sp")``, whichever way the layout was stated);
- ``DeepSpeedConfig`` sized by the mesh's dp when no mpu is given.

The engine comes back with ``engine.mesh_device`` set to the mesh, for every engine type. A
keyword ``mesh=`` (a mesh built beforehand, e.g. to construct the model's layers on it) is also
accepted; it must agree with the other sources.
"""

from __future__ import annotations

import copy
import inspect
import json
import logging
import sys
from typing import Any, Optional

from mesh_core import DeepSpeedDeviceMesh, MeshLayout, MeshSpec, MeshSpecError, set_default_mesh, use_mesh
from mesh_core.axis_names import LEGACY_DIMS
from mesh_core.runtime_hooks import registry_for_world

from . import mixed_world
from .config_loading import load_deepspeed_config
from .device import default_device_type
from .engine_mesh import EngineMesh, as_engine_mesh
from .engine_release import mark_owned
from .engine_scope import ENGINE_STATE_ATTR, PENDING_MESH, GroupsState, activate, capture, pending_mesh, register  # noqa: F401 (engine_scope owns the pending mesh; re-exported)
from .engine_spec import check_before_world, engine_spec
from .engine_zero3 import check_zero3_partitions
from .hsdp import hsdp_zero_config, zero_stage  # noqa: F401 (HSDP under ZeRO)
from .layout_config import autotp_off, config_call_for_mesh, with_autotp_from_mesh, with_tp_model_init

logger = logging.getLogger(__name__)

LAYOUT_DIMS = LEGACY_DIMS  # the dims an mpu, grid or mesh_param states
CONSUMED_KEYS = ("mesh", "data_parallel_size", "sequence_parallel_size")
_pending = PENDING_MESH  # engine_scope owns it (scope_mesh reads it there)


# --- deepspeed.initialize -----------------------------------------------------------------------
def initialize_wrapper(wrapped, instance, args, kwargs):  # noqa: ARG001 (wrapt's signature)
    """wrapt wrapper around ``deepspeed.initialize``; see the module docstring."""
    import deepspeed.comm as ds_dist
    from deepspeed.accelerator import get_accelerator

    kwargs = dict(kwargs)
    given_mesh = kwargs.pop("mesh", None)
    if given_mesh is not None and not isinstance(given_mesh, DeepSpeedDeviceMesh):
        raise MeshSpecError(f"mesh= must be a DeepSpeedDeviceMesh, got {type(given_mesh).__name__}: {given_mesh!r}")
    source = getattr(given_mesh, "source_mpu", None)
    if hasattr(source, "initialize_sequence_parallel") and kwargs.get("mpu") is None and len(args) < 8:
        # mesh=from_mpu(<the Ulysses parallel_state_sp module>) is what the codemods make of mpu=<it>:
        # DeepSpeed branches on the module itself (no DP group), so the engine gets it as before
        kwargs["mpu"], given_mesh = source, None
    call = inspect.signature(wrapped).bind(*args, **kwargs).arguments
    model, mpu, mesh_param = call.get("model"), call.get("mpu"), call.get("mesh_param")
    resolved = _resolve_config(call.get("args"), call.get("config"), call.get("config_params"))
    if model is None or resolved is None:
        return wrapped(*args, **kwargs)  # deepspeed reports the missing model / config itself
    config, ds_args = resolved
    config = with_tp_model_init(config, mpu=mpu, mesh_param=mesh_param)  # tp_model_init's tp in the mesh

    if mesh_param:
        _warn_user(
            "deepspeed.initialize(mesh_param=...)",
            _mesh_param_advice(mesh_param),
            row="deepspeed.initialize(mesh_param=(dp, sp))",
        )

    check_before_world(config, mesh_param=mesh_param)  # bad values before any process group
    ds_dist.init_distributed(
        dist_backend=get_accelerator().communication_backend_name(),
        distributed_port=call.get("distributed_port", 29500),
        dist_init_required=call.get("dist_init_required"),
    )
    mixed_world.announce()  # before the imports below: a mesh check that fails waits for this rank's reading
    world_size = ds_dist.get_world_size()
    pipeline, grid, topology = _pipeline_of(model)
    if _beyond_the_mesh(pipeline, grid, given_mesh, config):
        # a topology a mesh cannot stand for (a 'sequence' axis, rank methods of its own): its grid is
        # DeepSpeed's own, and so is this engine (no engine.mesh_device); the getters serve its grid
        logger.warning(
            "ds-mesh: the PipelineModule's topology has %s, which no mesh expresses; this engine runs as "
            "plain DeepSpeed on its grid (engine.mesh_device is None)",
            ", ".join(_beyond(topology)),
        )
        return wrapped(*args, **kwargs)
    config = _with_topology_mesh(config, topology)  # a sub-world pipeline states its ranks
    spec = engine_spec(
        config,
        world_size,
        topology=topology,
        ep_sizes=_moe_ep_sizes(model),
        mpu=mpu,
        mesh_param=mesh_param,
        mesh_spec=None if given_mesh is None else given_mesh.spec,
    )
    if not pipeline and spec.dim_size("pp") > 1 and mpu is None and source is None:
        # with an mpu the pipeline is the script's own (Megatron's schedule): DeepSpeed trains one stage
        raise MeshSpecError(
            f"{spec.describe()} has pp={spec.dim_size('pp')}, but the model is not a PipelineModule; wrap it "
            "in deepspeed.pipe.PipelineModule(layers, num_stages=...), or, for a pipeline the script runs "
            "itself, pass its groups as mpu= (get_pipe_parallel_group / get_data_parallel_group / "
            'get_model_parallel_group), or drop pp from the config\'s "mesh" section'
        )
    if ds_dist.get_rank() not in spec.ranks:
        raise MeshSpecError(
            f"rank {ds_dist.get_rank()} is not one of the ranks of this engine's mesh {spec.describe()}; only "
            "those ranks call deepspeed.initialize for this model (a sub-world engine), the others skip it, "
            "e.g. `if dist.get_rank() in ranks: engine, *_ = deepspeed.initialize(...)`"
        )
    # without an order / ranks in the config, a given mesh, grid or mpu keeps its own rank order
    order = any(key in (config.get("mesh") or {}) for key in ("order", "ranks"))
    if given_mesh is not None:
        _require_same_layout(spec, given_mesh.spec, "the layout stated by config/model/mpu", "mesh=", order=order)

    config = hsdp_zero_config(config, spec)
    if zero_stage(config) == 3:  # a model zero.Init partitioned over other ranks: refused before any collective
        check_zero3_partitions(model, spec, ds_dist.get_rank())
    mesh, engine_mpu = _engine_mesh(spec, grid=grid, mpu=mpu, given=given_mesh, order=order, pipeline=pipeline)
    if mpu is not None:  # the "mesh" section equal to the mpu just adopted
        _warn_user("deepspeed.initialize(mpu=...)", mpu_advice(mesh.spec))
    if (
        engine_mpu is None
        and not pipeline
        and (_stated_tp(config) > 1 or (zero_stage(config) == 3 and _dp_is_not_world(spec)))
    ):
        # legacy code said tp through an mpu (a grid, Megatron's parallel_state); the engine reads model
        # parallelism only from an mpu, so a config "mesh" with tp > 1 that AutoTP does not own gets one
        # (what mpu=grid became). Without an mpu, ZeRO-3 partitions the parameters over the whole world
        # (zero.Init's default group) while its optimizer uses the engine's dp group: give it the mesh's.
        engine_mpu = _mesh_mpu(mesh)
    # the layout keys are consumed into the mesh; left in, deepspeed would build a torch mesh too
    config = with_autotp_from_mesh(config, spec.dim_size("tp"), mpu=mpu, given_mesh=given_mesh, pipeline=pipeline)
    call["config"] = {k: v for k, v in config.items() if k not in CONSUMED_KEYS}
    call.pop("config_params", None)
    if "args" in call:
        call["args"] = ds_args
    if not pipeline:
        call["mpu"] = engine_mpu
    call["mesh_param"] = None  # translated into the mesh

    previous = capture()
    activate(GroupsState(mesh, None, None))
    token = _pending.set(mesh)
    try:
        with use_mesh(mesh):  # current_mesh() inside the engine's construction is its mesh
            result = wrapped(**call)
    except BaseException:
        activate(previous)
        raise
    finally:
        _pending.reset(token)
    engine = result[0]
    engine.mesh_device = mesh
    mark_owned(engine, mesh, given=given_mesh, grid=grid, mpu=mpu)  # engine.destroy() releases it
    # as legacy's process-global groups.mpu: migrated code with no engine at hand (current_mesh())
    # sees the mesh of the engine built last (MIGRATION.md, "The model's mesh")
    set_default_mesh(mesh)
    setattr(engine, ENGINE_STATE_ATTR, capture())
    _track(engine)
    from .clean_exit import arm
    from .engine_banner import announce

    announce(mesh.spec, ds_dist.get_rank())  # the one line that says the shim is on, and the mesh
    arm()  # a script that never calls destroy_process_group() still exits cleanly
    return result


def _track(engine: Any) -> None:
    """Count ``engine`` for the wrong-grid protection until its ``destroy()`` (see compat.engine_scope;
    the ``DeepSpeedEngine.destroy`` wrapper of compat.engine_release forgets it)."""
    register(engine)


def _dp_is_not_world(spec: MeshSpec) -> bool:
    return spec.dim_size("dp") * spec.dim_size("sp") != spec.world_size


def _resolve_config(args: Any, config: Any, config_params: Any) -> Optional[tuple[dict, Any]]:
    """The config as a dict (from ``config``, ``config_params`` or ``args.deepspeed_config``)."""
    if config is None:
        config = config_params
    if config is None:
        path = getattr(args, "deepspeed_config", None) or getattr(args, "deepscale_config", None)
        if path is None:
            return None
        config, args = path, copy.copy(args)
        for name in ("deepspeed_config", "deepscale_config"):
            if hasattr(args, name):
                setattr(args, name, None)
    return load_deepspeed_config(config), args  # deepspeed's own loader (HJSON, base64, duplicate keys)


def _pipeline_of(model: Any) -> tuple[bool, Any, Any]:
    from deepspeed.runtime.pipe.module import PipelineModule

    if not isinstance(model, PipelineModule):
        return False, None, None
    return True, model.mpu(), model.topology()


def _beyond(topology: Any) -> list[str]:
    from .topology import beyond_the_mesh

    return beyond_the_mesh(topology) if topology is not None else []


def _beyond_the_mesh(pipeline: bool, grid: Any, given_mesh: Any, config: dict) -> bool:
    """A pipeline whose mesh-less grid stands on a topology no mesh can stand for (a 'sequence' axis,
    rank methods of its own: compat.topology.beyond_the_mesh), with no mesh stated."""
    from .topology import grid_mesh

    if not pipeline or grid is None or grid_mesh(grid) is not None or given_mesh is not None or "mesh" in config:
        return False
    topology = grid.topology() if callable(getattr(grid, "topology", None)) else None
    return bool(_beyond(topology))


def _with_topology_mesh(config: dict, topology: Any) -> dict:
    """``config`` whose ``"mesh"`` section gets the ranks (and order) of a :class:`MeshTopology`'s mesh
    when it names none (``PipelineModule(topology=compat.mesh_topology(mesh))``)."""
    from .subworld_pipe import MeshTopology

    if not isinstance(topology, MeshTopology):
        return config
    section = config.get("mesh")
    section = dict(section) if isinstance(section, dict) else {}
    if "ranks" in section:
        return config
    spec = topology.mesh.spec
    section["ranks"] = list(spec.ranks)
    section.setdefault("order", list(spec.names))
    return {**config, "mesh": section}


def _moe_ep_sizes(model: Any) -> list[int]:
    from deepspeed.moe.layer import MoE

    return sorted({int(m.ep_size) for m in model.modules() if isinstance(m, MoE)})


def _engine_mesh(
    spec: MeshSpec,
    *,
    grid: Any,
    mpu: Any,
    given: Optional[DeepSpeedDeviceMesh],
    order: bool = True,
    pipeline: bool = False,
) -> tuple[EngineMesh, Any]:
    """The engine's mesh (reusing the grid's, the mpu's or the given one) and the mpu to pass on."""
    if given is not None:
        mesh = as_engine_mesh(given)
        source = getattr(given, "source_mpu", None)
        if source is not None and mpu is None and mesh.spec.dim_size("pp") > 1 and not pipeline:
            return mesh, source  # mesh=from_mpu(mpu) of the script's own pipeline: as mpu=mpu (below)
        # a tensor-parallel mesh still needs an mpu: the engine reads model parallelism only from one
        # (mesh=DeepSpeedDeviceMesh.from_mpu(mpu) is what the codemods make of mpu=mpu)
        return mesh, (
            _mesh_mpu(mesh, like=mpu if mpu is not None else source)
            if mpu is not None or mesh.spec.dim_size("tp") > 1
            else None
        )
    if grid is not None:
        from .topology import grid_mesh

        own = grid_mesh(grid)
        if own is not None:
            _require_same_layout(spec, own.spec, "the config", "the PipelineModule's grid", order=order)
            return as_engine_mesh(own), None
        if pipeline:
            # a grid that made its own groups (a subclass that skipped the base __init__, e.g. on
            # Megatron's groups): the engine uses those very groups, as DeepSpeed's did through mpu=grid
            from .mpu import mesh_from_mpu

            mesh = as_engine_mesh(mesh_from_mpu(grid))
            _require_same_layout(
                spec, mesh.spec, "the config", f"the PipelineModule's grid ({type(grid).__name__})", order=order
            )
            return mesh, None
    if mpu is not None:
        if isinstance(getattr(mpu, "mesh", None), DeepSpeedDeviceMesh):  # already mesh-backed
            _require_same_layout(spec, mpu.mesh.spec, "the config", f"mpu={type(mpu).__name__}", order=order)
            return as_engine_mesh(mpu.mesh), mpu
        if hasattr(mpu, "initialize_sequence_parallel"):  # DeepSpeed's Ulysses parallel_state_sp module
            # the engine keeps the module: DeepSpeed branches on its shape (no DP group: ZeRO-3
            # partitions over the world, parameter_offload.py:267), and its groups are the mesh's now
            return _sequence_parallel_mesh(spec, mpu), mpu
        from .mpu import mesh_from_mpu

        mesh = as_engine_mesh(mesh_from_mpu(mpu))
        _require_same_layout(spec, mesh.spec, "the config", f"mpu={type(mpu).__name__}", order=order)
        if mesh.spec.dim_size("pp") > 1 and not pipeline:
            # one stage of the script's own pipeline: DeepSpeed reads the mpu as plain DeepSpeed does
            # (its model-parallel rank names the checkpoint files); the mesh holds its communicators
            return mesh, mpu
        return mesh, _mesh_mpu(mesh, like=mpu)
    return EngineMesh(spec, device_type=default_device_type()), None


def _stated_tp(config: dict) -> int:
    """The tp of the config's "mesh" section when AutoTP does not own it (else 1): the config says
    ``"tensor_parallel": {"autotp_size": 0}`` (or 1) beside it, the model does its own TP (what the
    codemods write for ``mpu=grid``); without it, ``with_autotp_from_mesh`` hands tp to AutoTP."""
    section = config.get("mesh") or {}
    if not isinstance(section, dict) or not autotp_off(config):
        return 1
    tp = section.get("tp", 1)
    return tp if isinstance(tp, int) else 1


def _sequence_parallel_mesh(spec: MeshSpec, sp_module: Any) -> EngineMesh:
    """The mesh of the Ulysses module's layout (consecutive sp blocks, dp across them, the
    sequence-data group the whole world); its sp communicators become the mesh's."""
    own = MeshSpec.build(spec.world_size, sp=sp_module.get_sequence_parallel_world_size())
    name = getattr(sp_module, "__name__", type(sp_module).__name__)
    _require_same_layout(spec, own, "the config", f"mpu={name}")
    registry_for_world().adopt(MeshLayout(own).groups("sp"), sp_module.get_sequence_parallel_group())
    return EngineMesh(spec, device_type=default_device_type())


def _mesh_mpu(mesh: EngineMesh, like: Any = None) -> Any:
    """The engine's mesh-backed mpu; standing for a user's mpu ``like`` that had no pipeline getters
    (pp = 1), it has none either (DeepSpeed's bwc helpers answer as they did on that mpu)."""
    from .mpu import MeshMPU, has_pipeline_getters

    keep = like is None or has_pipeline_getters(like) or mesh.spec.dim_size("pp") != 1
    return MeshMPU(mesh, pipeline_getters=keep)


def _require_same_layout(a: MeshSpec, b: MeshSpec, a_name: str, b_name: str, *, order: bool = True) -> None:
    """Raise unless both specs give every rank the same pp/dp/sp/tp groups (``order=False``: the
    same pp/dp/sp/tp sizes, ``b``'s rank order standing)."""
    same = a.world_size == b.world_size and sorted(a.ranks) == sorted(b.ranks)
    if order:
        la, lb = MeshLayout(a), MeshLayout(b)
        same = same and all(sorted(map(tuple, la.groups(d))) == sorted(map(tuple, lb.groups(d))) for d in LAYOUT_DIMS)
    else:
        same = same and all(a.dim_size(d) == b.dim_size(d) for d in LAYOUT_DIMS)
    if not same:
        raise MeshSpecError(f"{a_name} describes {a.describe()} but {b_name} is {b.describe()}; make them equal")


def mpu_advice(spec: MeshSpec) -> str:
    """What to write instead of ``mpu=``: the config's ``"mesh"`` section equal to the layout adopted."""
    section: dict[str, Any] = {dim: spec.dim_size(dim) for dim in LAYOUT_DIMS if spec.dim_size(dim) > 1 or dim == "dp"}
    outer_first = [dim for dim in spec.names if dim in section and spec.dim_size(dim) > 1]
    if outer_first != [dim for dim in LAYOUT_DIMS if dim in outer_first]:  # the mpu's own rank order
        section["order"] = outer_first
    text = f'put "mesh": {json.dumps(section)} in the config (this mpu\'s layout) and drop mpu='
    if spec.dim_size("tp") > 1:
        text += ', with "tensor_parallel": {"autotp_size": 0} (a "mesh" tp alone turns on AutoTP)'
    return text


def _mesh_param_advice(mesh_param: Any) -> str:
    try:
        dp, sp = mesh_param
    except (TypeError, ValueError):
        dp, sp = "D", "S"
    return f'put "mesh": {{"dp": {dp}, "sp": {sp}}} in the config and drop mesh_param='


def _warn_user(legacy_name: str, replacement: str, row: Optional[str] = None) -> None:
    """Warn ``TODOV1:`` once, at the user's call site (the first frame outside compat and wrapt)."""
    from .call_sites import SHIM, first_outside
    from .deprecation import legacy_entry

    frame, hops = first_outside(sys._getframe(1), SHIM)
    legacy_entry(legacy_name, replacement, row, key=f"{legacy_name}: {replacement}").warn(
        depth=1 + hops if frame is not None else 1
    )


# --- in-place wrappers of deepspeed internals (installed by compat.install) ----------------------
def config_init_wrapper(wrapped, instance, args, kwargs):  # noqa: ARG001
    """``DeepSpeedConfig.__init__``: inside initialize with no mpu, size batches by the mesh's dp
    (as deepspeed does for its own ``mesh_device``)."""
    mesh = _pending.get()
    if mesh is None:
        return wrapped(*args, **kwargs)
    call = inspect.signature(wrapped).bind(*args, **kwargs).arguments
    return wrapped(**config_call_for_mesh(call, mesh))  # legacy batch sizing, AutoSP's sp (layout_config)
