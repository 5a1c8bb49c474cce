"""The mesh spec of one engine, from every place a legacy script can state its layout.

A layout may come from the config's ``"mesh"`` section, the legacy config keys
(``data_parallel_size``, ``sequence_parallel_size``, ``tensor_parallel.autotp_size``), the model
(a ``PipelineModule``'s stages and topology, the MoE layers' ``ep_size``), an ``mpu=``, a
``mesh_param=(dp, sp)`` and a mesh passed as ``mesh=``. Every source that states a dim must agree; a disagreement raises a
:class:`MeshSpecError` naming both sources. Pure: nothing here touches ``torch.distributed``
beyond asking an existing ``mpu`` for its sizes, so errors come before any group is created.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Optional

from mesh_core import MESH_DIMS, MeshSpec, MeshSpecError
from mesh_core.config import check_section, legacy_sizes

SECTION_SOURCE = "config 'mesh' section"
AUTO = "auto"
# ProcessTopology axis → mesh dim
TOPOLOGY_AXES = {"pipe": "pp", "data": "dp", "model": "tp"}


@dataclass
class LayoutSources:
    """Dim sizes each source states: ``{dim: [(size, source), ...]}``; ``ep`` from the section."""

    sizes: dict[str, list[tuple[int, str]]] = field(default_factory=dict)
    ep_sizes: list[tuple[int, str]] = field(default_factory=list)

    def add(self, dim: str, size: Any, source: str) -> None:
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise MeshSpecError(f"{source} gives {dim}={size!r}; it must be a positive integer")
        if dim == "ep":
            self.ep_sizes.append((size, source))
        else:
            self.sizes.setdefault(dim, []).append((size, source))

    def agreed(self) -> dict[str, int]:
        """One size per dim; raises naming the first two sources that disagree."""
        out = {}
        for dim, stated in self.sizes.items():
            first_size, first_source = stated[0]
            for size, source in stated[1:]:
                if size != first_size:
                    raise MeshSpecError(
                        f"{first_source} sets {dim}={first_size} but {source} sets {dim}={size}; "
                        "make them equal or drop one"
                    )
            out[dim] = first_size
        return out


def section_of(config: Mapping[str, Any]) -> Optional[dict[str, Any]]:
    """The validated ``"mesh"`` section of a config dict, or None."""
    section = config.get("mesh")
    # look-alike values ("false", "0123", -1) are errors, not silent readings
    return None if section is None else check_section(section)


def check_before_world(config: Mapping[str, Any], *, mesh_param: Any = None) -> None:
    """Every layout check that needs no world size: the ``"mesh"`` section (names, types, look-alike
    values), the legacy size keys and ``mesh_param``'s shape. ``deepspeed.initialize`` runs it before
    ``init_distributed``, so a bad value is reported before any process group exists."""
    # without the model, mpu or mesh=: nothing here needs a process group
    collect_sources(config, mesh_param=mesh_param)[0].agreed()


def mpu_sizes(mpu: Any) -> dict[str, int]:
    """The sizes an existing Megatron-style mpu (or pipeline grid, or mesh-backed mpu) reports."""
    mesh = getattr(mpu, "mesh", None)
    spec = getattr(mesh, "spec", None)
    if isinstance(spec, MeshSpec):
        return {d: spec.dim_size(d) for d in ("pp", "dp", "sp", "tp")}

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
        from mesh_core.roles.from_groups import mpu_spec

        pp = mpu_spec(mpu).dim_size("pp")
        found["pp"] = pp if pp > 1 else None
    return {dim: size for dim, size in found.items() if size is not None}


def topology_sizes(topology: Any) -> dict[str, int]:
    """Mesh dim sizes of a ``ProcessTopology`` (axes pipe / data / model)."""
    axes = list(topology.get_axis_names())
    unknown = [a for a in axes if a not in TOPOLOGY_AXES]
    if unknown:
        raise MeshSpecError(f"topology axes {unknown} have no mesh dim; supported axes are {sorted(TOPOLOGY_AXES)}")
    return {TOPOLOGY_AXES[a]: int(topology.get_dim(a)) for a in axes}


def collect_sources(
    config: Mapping[str, Any],
    *,
    num_stages: Optional[int] = None,
    topology: Any = None,
    mpu: Any = None,
    mesh_param: Any = None,
    mesh_spec: Optional[MeshSpec] = None,
) -> tuple[LayoutSources, Optional[dict[str, Any]]]:
    """Every stated dim size, by source; also the config's ``"mesh"`` section."""
    section = section_of(config)
    sources = LayoutSources()
    for dim, value in (section or {}).items():
        if dim in MESH_DIMS or dim == "ep":
            if not (isinstance(value, str) and value.lower() == AUTO) and value not in (None, -1):
                sources.add(dim, value, SECTION_SOURCE)
    for dim, (size, source) in legacy_sizes(config).items():
        sources.add(dim, size, source)
    if topology is not None:
        for dim, size in topology_sizes(topology).items():
            sources.add(dim, size, "PipelineModule topology")
    elif num_stages is not None:
        sources.add("pp", num_stages, "PipelineModule num_stages")
    if mpu is not None:
        for dim, size in mpu_sizes(mpu).items():
            sources.add(dim, size, f"mpu={type(mpu).__name__}")
    if mesh_param:
        try:
            dp, sp = mesh_param
        except (TypeError, ValueError):
            raise MeshSpecError(f"mesh_param={mesh_param!r} must be a pair (dp, sp)") from None
        sources.add("dp", dp, f"mesh_param={tuple(mesh_param)!r}")
        sources.add("sp", sp, f"mesh_param={tuple(mesh_param)!r}")
    if mesh_spec is not None:
        for dim in ("pp", "dp", "sp", "tp"):
            sources.add(dim, mesh_spec.dim_size(dim), "mesh=")
    return sources, section


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
    """The one spec every source agrees on (MoE layers of other ep sizes get lazy expert groups)."""
    ep_sizes = list(ep_sizes)
    sources, section = collect_sources(
        config, num_stages=num_stages, topology=topology, mpu=mpu, mesh_param=mesh_param, mesh_spec=mesh_spec
    )
    sizes: dict[str, Any] = dict(sources.agreed())
    for dim, value in (section or {}).items():
        if dim in MESH_DIMS and dim not in sizes:
            sizes[dim] = value  # "auto"
    moe_sizes = sorted(set(ep_sizes))
    ep = max(moe_sizes, default=1)
    if sources.ep_sizes:
        ep, ep_source = sources.ep_sizes[0]
        if moe_sizes and ep not in moe_sizes:
            raise MeshSpecError(
                f"{ep_source} sets ep={ep} but the model's MoE layers use ep_size {moe_sizes}; "
                "make them equal or drop one"
            )
    section = section or {}
    try:
        return MeshSpec.build(
            world_size,
            order=section.get("order"),
            ranks=section.get("ranks"),
            ep=ep,
            data_before_expert=bool(section.get("data_before_expert", False)),
            **sizes,
        )
    except MeshSpecError as err:
        stated = "; ".join(f"{d}={s[0][0]} from {s[0][1]}" for d, s in sorted(sources.sizes.items())) or "nothing stated"
        raise MeshSpecError(f"{err} (layout stated: {stated})") from None
