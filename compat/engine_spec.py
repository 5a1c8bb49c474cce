"""The mesh spec of one engine, from every place a legacy script can state its layout.

A layout may come from the config's ``"mesh"`` section, the legacy config keys
(``data_parallel_size``, ``sequence_parallel_size``, ``tensor_parallel.autotp_size``), the model
(a ``PipelineModule``'s stages and topology, the MoE layers' ``ep_size``), an ``mpu=``, a
``mesh_param=(dp, sp)`` and a mesh passed as ``mesh=``. This module turns what code states into
``(dim, size, source)`` triples; :func:`mesh_core.config.spec_from_config` (the one config → spec
path) checks that every source agrees and builds the spec. Pure: nothing here touches ``torch.distributed``
beyond asking an existing ``mpu`` for its sizes, so errors come before any group is created.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Optional

from mesh_core import MeshSpec, MeshSpecError, spec_from_config
from mesh_core.axis_names import AXIS_TO_DIM, LEGACY_DIMS
from mesh_core.runtime_hooks import SECTION_SOURCE, layout_sources

__all__ = ["SECTION_SOURCE", "check_before_world", "code_sources", "engine_spec", "mpu_sizes", "topology_sizes"]


def check_before_world(config: Mapping[str, Any], *, mesh_param: Any = None) -> None:
    """Every layout check that needs no world size: the ``"mesh"`` section (names, types, look-alike
    values), the legacy size keys and ``mesh_param``'s shape. ``deepspeed.initialize`` runs it before
    ``init_distributed``, so a bad value is reported before any process group exists."""
    # without the model, mpu or mesh=: nothing here needs a process group
    layout_sources(config, stated=code_sources(mesh_param=mesh_param))[0].agreed()


def mpu_sizes(mpu: Any) -> dict[str, int]:
    """The sizes an existing Megatron-style mpu (or pipeline grid, or mesh-backed mpu) reports."""
    mesh = getattr(mpu, "mesh", None)
    spec = getattr(mesh, "spec", None)
    if isinstance(spec, MeshSpec):
        return {d: spec.dim_size(d) for d in LEGACY_DIMS}

    def probe(*names: str) -> Optional[int]:
        for name in names:
            if hasattr(mpu, name):
                return int(getattr(mpu, name)())
        return None

    ulysses = hasattr(mpu, "initialize_sequence_parallel")  # DeepSpeed's parallel_state_sp module
    tp_getters = ["get_tensor_model_parallel_world_size", "get_slice_parallel_world_size"]
    if not ulysses:  # parallel_state_sp aliases get_model_parallel_* to its sp getters: it has no tp
        tp_getters.append("get_model_parallel_world_size")
    found = {
        # the order of deepspeed.utils.bwc.bwc_tensor_model_parallel_world_size
        "tp": probe(*tp_getters),
        "pp": probe("get_pipeline_model_parallel_world_size", "get_pipe_parallel_world_size"),
        "sp": probe("get_sequence_parallel_world_size"),
        "dp": None if ulysses else probe("get_data_parallel_world_size"),
    }
    if found["pp"] is None and found["dp"] is not None and hasattr(mpu, "get_data_parallel_group"):
        # DeepSpeed reads pipeline size 1 from an mpu without pipe getters; the ranks its groups
        # leave out of the world are the stages of a pipeline the script runs (mesh_core's from_mpu)
        from mesh_core.runtime_hooks import mpu_spec

        pp = mpu_spec(mpu).dim_size("pp")
        found["pp"] = pp if pp > 1 else None
    return {dim: size for dim, size in found.items() if size is not None}


def topology_sizes(topology: Any) -> dict[str, int]:
    """Mesh dim sizes of a ``ProcessTopology`` (axes pipe / data / model; other axes of size 1 say nothing)."""
    axes = list(topology.get_axis_names())
    unknown = [a for a in axes if a not in AXIS_TO_DIM and int(topology.get_dim(a)) != 1]
    if unknown:
        raise MeshSpecError(f"topology axes {unknown} have no mesh dim; supported axes are {sorted(AXIS_TO_DIM)}")
    return {AXIS_TO_DIM[a]: int(topology.get_dim(a)) for a in axes if a in AXIS_TO_DIM}


def code_sources(
    *,
    topology: Any = None,
    mpu: Any = None,
    mesh_param: Any = None,
    mesh_spec: Optional[MeshSpec] = None,
) -> list[tuple[str, int, str]]:
    """The ``(dim, size, source)`` a legacy script states in code: a ``PipelineModule``'s topology,
    an ``mpu=``, ``mesh_param=(dp, sp)`` and a mesh passed as ``mesh=``."""
    stated: list[tuple[str, int, str]] = []
    if topology is not None:
        stated += [(dim, size, "PipelineModule topology") for dim, size in topology_sizes(topology).items()]
    if mpu is not None:
        stated += [(dim, size, f"mpu={type(mpu).__name__}") for dim, size in mpu_sizes(mpu).items()]
    if mesh_param:
        try:
            dp, sp = mesh_param
        except (TypeError, ValueError):
            raise MeshSpecError(f"mesh_param={mesh_param!r} must be a pair (dp, sp)") from None
        stated += [("dp", dp, f"mesh_param={tuple(mesh_param)!r}"), ("sp", sp, f"mesh_param={tuple(mesh_param)!r}")]
    if mesh_spec is not None:
        stated += [(dim, mesh_spec.dim_size(dim), "mesh=") for dim in LEGACY_DIMS]
    return stated


def engine_spec(
    config: Mapping[str, Any],
    world_size: int,
    *,
    num_stages: Optional[int] = None,
    topology: Any = None,
    ep_sizes: Iterable[int] = (),
    mpu: Any = None,
    mesh_param: Any = None,
    mesh_spec: Optional[MeshSpec] = None,
) -> MeshSpec:
    """The one spec every source agrees on (MoE layers of other ep sizes get lazy expert groups):
    :func:`mesh_core.config.spec_from_config` with what the script states in code."""
    stated = code_sources(topology=topology, mpu=mpu, mesh_param=mesh_param, mesh_spec=mesh_spec)
    return spec_from_config(
        config,
        world_size,
        num_stages=None if topology is not None else num_stages,  # a topology states pp itself
        ep_size=list(ep_sizes),
        stated=stated,
    )
