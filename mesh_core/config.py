"""Build a :class:`MeshSpec` from a DeepSpeed config dict.

The new ``"mesh"`` section states the layout in one place::

    {"mesh": {"pp": 2, "tp": 2, "sp": 1, "ep": 4, "dp": "auto", "order": ["pp", "dp", "sp", "tp"]}}

Without it, the layout is inferred from the keys users already set: ``sequence_parallel_size``,
``data_parallel_size``, ``tensor_parallel.autotp_size``, plus what code declares (the pipeline's
``num_stages`` and the MoE ``ep_size``). When both are present they must agree; a disagreement
raises :class:`MeshSpecError` naming both sources.
"""
from __future__ import annotations

import difflib
import json
import os
from typing import Any, Mapping, Optional, Union

from .spec import MESH_DIMS, MeshSpec, MeshSpecError, _resolve_order, _validate_ranks

MESH_SECTION_KEYS = set(MESH_DIMS) | {"ep", "order", "ranks", "data_before_expert"}


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


def check_section(section: Any) -> dict[str, Any]:
    """The ``"mesh"`` section as a dict after every check that needs no world size (its type, key
    names, look-alike values, the ``order`` names, the ``ranks`` list); a :class:`MeshSpecError`
    naming the key otherwise. Pure: run before any process group exists."""
    if not isinstance(section, Mapping):
        raise MeshSpecError(f"config 'mesh' section must be a dict, got {type(section).__name__}: {section!r}")
    unknown = sorted(set(section) - MESH_SECTION_KEYS, key=str)
    if unknown:
        hints = [f"{k!r} (did you mean {close[0]!r}?)" for k in unknown
                 for close in [difflib.get_close_matches(str(k).lower(), MESH_SECTION_KEYS, n=1)] if close]
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
            if value is None or (isinstance(value, str) and value.strip().lower() == "auto"):
                continue
            if isinstance(value, bool):
                raise MeshSpecError(f"{where} is not valid; a size is a positive integer (or \"auto\"), not a boolean")
            if isinstance(value, float):
                raise MeshSpecError(f"{where} is not valid; a size is a positive integer (or \"auto\")")
            if isinstance(value, int) and value < 1:
                raise MeshSpecError(
                    f"{where} is not valid; a size is a positive integer — write \"auto\" to infer this dim"
                )
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
                raise MeshSpecError(f"{where} is not valid; write a list of dim names, e.g. [\"pp\", \"dp\", \"tp\"]")
            bad = [d for d in value if not isinstance(d, str)]
            if bad:
                raise MeshSpecError(f"{where} holds {bad[:4]}; every entry is a dim name such as \"dp\"")


def legacy_sizes(
    config: Mapping[str, Any], *, num_stages: Optional[int] = None, ep_size: Optional[int] = None
) -> dict[str, tuple[int, str]]:
    """Dim sizes implied by legacy keys and code, each with the source that set it."""
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
    if autotp not in (None, 0, 1):
        source = "config key 'tensor_parallel.autotp_size'"
        found["tp"] = (_size(autotp, source), source)
    if num_stages not in (None, 1):
        found["pp"] = (_size(num_stages, "PipelineModule num_stages"), "PipelineModule num_stages")
    if ep_size not in (None, 1):
        found["ep"] = (_size(ep_size, "MoE ep_size"), "MoE ep_size")
    return found


def spec_from_config(
    config: Union[str, os.PathLike, Mapping[str, Any], None],
    world_size: int,
    *,
    num_stages: Optional[int] = None,
    ep_size: Optional[int] = None,
    ranks: Optional[list[int]] = None,
) -> MeshSpec:
    """The mesh spec a DeepSpeed config (plus model-declared sizes) describes."""
    cfg = load_config(config)
    section = cfg.get("mesh")
    inferred = legacy_sizes(cfg, num_stages=num_stages, ep_size=ep_size)
    if section is None:
        sizes: dict[str, Any] = {k: v for k, (v, _) in inferred.items()}
        ep = sizes.pop("ep", 1)
        return MeshSpec.build(world_size, ranks=ranks, ep=ep, **sizes)
    section = check_section(section)
    sizes = {k: v for k, v in section.items() if k in MESH_DIMS}
    for dim, (value, source) in inferred.items():
        declared = section.get(dim)
        if declared is None or (isinstance(declared, str) and declared.lower() == "auto"):
            if dim != "ep":
                sizes.setdefault(dim, value)
            continue
        if _size(declared, f"config 'mesh.{dim}'") != value:
            raise MeshSpecError(f"config 'mesh.{dim}'={declared} disagrees with {source}={value}; set them equal or drop one")
    ep = section.get("ep")
    if ep is None or (isinstance(ep, str) and ep.lower() == "auto"):
        ep = inferred.get("ep", (1, ""))[0]
    return MeshSpec.build(
        world_size,
        order=section.get("order"),
        ranks=section.get("ranks", ranks),
        ep=_size(ep, "config 'mesh.ep'"),
        data_before_expert=section.get("data_before_expert", False),
        **sizes,
    )
