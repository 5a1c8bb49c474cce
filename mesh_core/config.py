"""Build a :class:`MeshSpec` from a DeepSpeed config dict.

The new ``"mesh"`` section states the layout in one place::

    {"mesh": {"pp": 2, "tp": 2, "sp": 1, "ep": 4, "dp": "auto", "order": ["pp", "dp", "sp", "tp"]}}

Without it, the layout is inferred from the keys users already set: ``sequence_parallel_size``,
``data_parallel_size``, ``tensor_parallel.autotp_size``, plus what code declares (the pipeline's
``num_stages``, the MoE ``ep_size``, and any other ``(dim, size, source)`` a caller states, such as
an mpu's sizes). Every source that states a dim must agree; a disagreement raises
:class:`MeshSpecError` naming both sources. This is the one config → spec path: the mesh API and
the shim (``compat.engine_spec``) both use it.
"""

from __future__ import annotations

import difflib
import json
import os
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Optional, Union

from .axis_names import ALIASES, EXPERT_ALIASES
from .spec import MESH_DIMS, MeshSpec, MeshSpecError, _resolve_order, _validate_ranks, auto_message, is_auto

MESH_SECTION_KEYS = set(MESH_DIMS) | {"ep", "order", "ranks", "data_before_expert"}
SECTION_SOURCE = "config 'mesh' section"
HSDP_EXAMPLE = '{"dp_replicate": R, "dp_shard": S}'


def load_config(config: Union[str, os.PathLike, Mapping[str, Any], None]) -> dict[str, Any]:
    """A config dict from a dict, a JSON file path, or None."""
    if config is None:
        return {}
    if isinstance(config, Mapping):
        return dict(config)
    with open(config, encoding="utf-8") as fh:
        loaded = json.load(fh)
    if not isinstance(loaded, dict):
        raise MeshSpecError(f"config file {os.fspath(config)!r} holds {type(loaded).__name__}, not a JSON object")
    return loaded


def _size(value: Any, source: str) -> int:
    """A positive int size from a config value, or a MeshSpecError naming its source."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise MeshSpecError(f"{source}={value!r} is not valid; it must be a positive integer")
    try:
        size = int(value)
    except ValueError:
        raise MeshSpecError(f"{source}={value!r} is not valid; it must be a positive integer") from None
    if size < 1:
        raise MeshSpecError(f"{source}={value!r} is not valid; it must be a positive integer")
    return size


def suggest_key(name: Any) -> str:
    """``'fsdp' (did you mean 'dp_shard'? ...)`` for a key the ``"mesh"`` section does not know, or ``""``.

    Knows the names other frameworks give a dim (``fsdp`` is ``dp_shard``, ``ddp`` ``dp_replicate``,
    ``hsdp`` both) before falling back to the closest spelling."""
    key = str(name).strip().lower().replace("-", "_")
    if key in ("hsdp", "hybrid_shard", "hybrid"):
        return f"{name!r} (HSDP is two dims: {HSDP_EXAMPLE}, replicas x shards per replica)"
    if key in ALIASES or key in EXPERT_ALIASES:
        dim = ALIASES.get(key) or EXPERT_ALIASES[key]
        extra = f" HSDP is {HSDP_EXAMPLE}" if dim.startswith("dp_") else ""
        return f"{name!r} (did you mean {dim!r}?{extra})"
    close = difflib.get_close_matches(key, MESH_SECTION_KEYS, n=1)
    return f"{name!r} (did you mean {close[0]!r}?)" if close else ""


def check_section(section: Any) -> dict[str, Any]:
    """The ``"mesh"`` section as a dict after every check that needs no world size (its type, key
    names, look-alike values, the ``order`` names, the ``ranks`` list); a :class:`MeshSpecError`
    naming the key otherwise. Pure: run before any process group exists."""
    if not isinstance(section, Mapping):
        raise MeshSpecError(f"config 'mesh' section must be a dict, got {type(section).__name__}: {section!r}")
    unknown = sorted(set(section) - MESH_SECTION_KEYS, key=str)
    if unknown:
        hints = [hint for hint in map(suggest_key, unknown) if hint]
        raise MeshSpecError(
            f"unknown key(s) {unknown} in config 'mesh'{'; ' + ', '.join(hints) if hints else ''}; "
            f"valid keys are {sorted(MESH_SECTION_KEYS)}"
        )
    check_section_values(section)
    try:
        if section.get("order") is not None:
            _resolve_order(section["order"], {})
        if section.get("ranks") is not None:
            _validate_ranks(section["ranks"], None)
    except MeshSpecError as err:
        raise MeshSpecError(f"config 'mesh': {err}") from None
    return dict(section)


def check_section_values(section: Mapping[str, Any]) -> None:
    """Reject values in the ``"mesh"`` section that only look right (a JSON string where a boolean
    or list belongs, a negative or fractional size), naming the key and what to write instead."""
    for key, value in section.items():
        where = f"config 'mesh.{key}'={value!r}"
        if key in MESH_DIMS or key == "ep":
            if isinstance(value, int) and not isinstance(value, bool) and value < 1:
                raise MeshSpecError(
                    f'{where} is not valid; a size is a positive integer — write "auto" to infer this dim'
                )
            if is_auto(value):
                continue
            if isinstance(value, str) and value.strip().lower() == "auto":
                raise MeshSpecError(auto_message(where))
            if isinstance(value, bool):
                raise MeshSpecError(f'{where} is not valid; a size is a positive integer (or "auto"), not a boolean')
            if isinstance(value, float):
                raise MeshSpecError(f'{where} is not valid; a size is a positive integer (or "auto")')
            if isinstance(value, str) and value.strip().lstrip("+-").isdigit():
                raise MeshSpecError(f"{where} is a string; write the number {value.strip()} without quotes")
        elif key == "data_before_expert":
            if not isinstance(value, bool):
                raise MeshSpecError(f"{where} is not valid; write true or false (a JSON boolean, no quotes)")
        elif key == "ranks":
            if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
                raise MeshSpecError(f"{where} is not valid; write a list of global ranks, e.g. [0, 1, 2, 3]")
            bad = [r for r in value if isinstance(r, bool) or not isinstance(r, int)]
            if bad:
                raise MeshSpecError(f"{where} holds {bad[:4]}; every rank is an integer, e.g. [0, 1, 2, 3]")
        elif key == "order":
            if isinstance(value, str) or not isinstance(value, (list, tuple)):
                raise MeshSpecError(f'{where} is not valid; write a list of dim names, e.g. ["pp", "dp", "tp"]')
            bad = [d for d in value if not isinstance(d, str)]
            if bad:
                raise MeshSpecError(f'{where} holds {bad[:4]}; every entry is a dim name such as "dp"')


AUTOTP_OFF = (0, 1)  # tensor_parallel.autotp_size values that leave AutoTP off


def autotp_off(config: Mapping[str, Any]) -> bool:
    """Whether the config turns AutoTP off explicitly (``"tensor_parallel": {"autotp_size": 0}`` or 1):
    a ``"mesh"`` tp beside it is the model's own TP, not AutoTP's. The one home of that rule."""
    tensor_parallel = config.get("tensor_parallel")
    return isinstance(tensor_parallel, Mapping) and tensor_parallel.get("autotp_size") in AUTOTP_OFF


def legacy_sizes(config: Mapping[str, Any]) -> dict[str, tuple[int, str]]:
    """Dim sizes implied by the legacy config keys, each with the key that set it."""
    found: dict[str, tuple[int, str]] = {}
    if config.get("sequence_parallel_size") not in (None, 1):
        source = "config key 'sequence_parallel_size'"
        found["sp"] = (_size(config["sequence_parallel_size"], source), source)
    if config.get("data_parallel_size") is not None:
        source = "config key 'data_parallel_size'"
        found["dp"] = (_size(config["data_parallel_size"], source), source)
    tensor_parallel = config.get("tensor_parallel") or {}
    if not isinstance(tensor_parallel, Mapping):
        raise MeshSpecError(f"config key 'tensor_parallel' must be a dict, got {tensor_parallel!r}")
    autotp = tensor_parallel.get("autotp_size")
    if autotp is not None and not autotp_off(config):
        source = "config key 'tensor_parallel.autotp_size'"
        found["tp"] = (_size(autotp, source), source)
    return found


@dataclass
class LayoutSources:
    """Dim sizes each source states: ``{dim: [(size, source), ...]}``; ``ep`` apart (see
    :func:`spec_from_config`)."""

    sizes: dict[str, list[tuple[int, str]]] = field(default_factory=dict)
    ep_sizes: list[tuple[int, str]] = field(default_factory=list)

    def add(self, dim: str, size: Any, source: str) -> None:
        """Record that ``source`` states ``dim=size``; a size that is not a positive int raises."""
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


def layout_sources(
    config: Mapping[str, Any],
    *,
    num_stages: Optional[int] = None,
    stated: Iterable[tuple[str, int, str]] = (),
) -> tuple[LayoutSources, Optional[dict[str, Any]]]:
    """Every dim size the config (its ``"mesh"`` section, then its legacy keys), the pipeline's
    ``num_stages`` and ``stated`` (``(dim, size, source)`` from code) give, by source; also the
    checked ``"mesh"`` section. Needs no world size: run it before any process group exists."""
    section = config.get("mesh")
    section = None if section is None else check_section(section)
    sources = LayoutSources()
    for dim, value in (section or {}).items():
        if (dim in MESH_DIMS or dim == "ep") and not is_auto(value):
            sources.add(dim, _size(value, f"config 'mesh.{dim}'"), SECTION_SOURCE)
    for dim, (size, source) in legacy_sizes(config).items():
        sources.add(dim, size, source)
    if num_stages not in (None, 1):
        sources.add("pp", _size(num_stages, "PipelineModule num_stages"), "PipelineModule num_stages")
    for dim, size, source in stated:
        sources.add(dim, size, source)
    return sources, section


def spec_from_config(
    config: Union[str, os.PathLike, Mapping[str, Any], None],
    world_size: int,
    *,
    num_stages: Optional[int] = None,
    ep_size: Union[int, Iterable[int], None] = None,
    ranks: Optional[list[int]] = None,
    stated: Iterable[tuple[str, int, str]] = (),
) -> MeshSpec:
    """The mesh spec a DeepSpeed config describes, with what code declares: the pipeline's
    ``num_stages``, the MoE layers' ``ep_size`` (one, or every size the model's layers use: the
    mesh's ep is the config's, which must be one of them, else the largest) and ``stated``
    (``(dim, size, source)`` triples, e.g. from an mpu). Every source that states a dim must agree;
    a disagreement raises :class:`MeshSpecError` naming both."""
    cfg = load_config(config)
    sources, section = layout_sources(cfg, num_stages=num_stages, stated=stated)
    sizes: dict[str, Any] = dict(sources.agreed())
    section = section or {}
    for dim, value in section.items():
        if dim in MESH_DIMS and dim not in sizes:
            sizes[dim] = value  # "auto"
    if ep_size is None or isinstance(ep_size, int):
        ep_size = [] if ep_size is None else [ep_size]
    moe_sizes = sorted({_size(size, "MoE ep_size") for size in ep_size})
    ep = max(moe_sizes, default=1)
    if sources.ep_sizes:
        ep, ep_source = sources.ep_sizes[0]
        if moe_sizes and ep not in moe_sizes:
            raise MeshSpecError(
                f"{ep_source} sets ep={ep} but the model's MoE layers use ep_size {moe_sizes}; "
                "make them equal or drop one"
            )
    try:
        return MeshSpec.build(
            world_size,
            order=section.get("order"),
            ranks=section.get("ranks", ranks),
            ep=ep,
            data_before_expert=bool(section.get("data_before_expert", False)),
            **sizes,
        )
    except MeshSpecError as err:
        if not sources.sizes:
            raise
        stated_text = "; ".join(f"{d}={s[0][0]} from {s[0][1]}" for d, s in sorted(sources.sizes.items()))
        raise MeshSpecError(f"{err} (layout stated: {stated_text})") from None
