"""Qualified names of the legacy APIs, and how they are spelled in user code.

A legacy name is reachable under several modules (DeepSpeed's own re-exports and our compat
re-implementations); :func:`canonical` maps every spelling to one canonical qualified name so that
the codemods match one table.
"""

from __future__ import annotations

from typing import Iterable, Optional

GROUPS = "deepspeed.utils.groups"
TOPOLOGY = "deepspeed.runtime.pipe.topology"

GRID = f"{TOPOLOGY}.PipelineParallelGrid"
PROCESS_TOPOLOGY = f"{TOPOLOGY}.ProcessTopology"
PIPE_DATA_TOPOLOGY = f"{TOPOLOGY}.PipeDataParallelTopology"
PIPE_MODEL_DATA_TOPOLOGY = f"{TOPOLOGY}.PipeModelDataParallelTopology"
TOPOLOGY_CLASSES = (PROCESS_TOPOLOGY, PIPE_DATA_TOPOLOGY, PIPE_MODEL_DATA_TOPOLOGY)

INITIALIZE = "deepspeed.initialize"

# `from .groups import *` in deepspeed/utils/__init__.py copies the public functions only.
GROUPS_STAR_EXPORTS = frozenset(
    {
        "initialize",
        "get_tensor_model_parallel_group",
        "get_model_parallel_group",
        "get_data_parallel_group",
        "set_tensor_model_parallel_world_size",
        "get_tensor_model_parallel_world_size",
        "get_model_parallel_world_size",
        "set_tensor_model_parallel_rank",
        "get_tensor_model_parallel_rank",
        "get_model_parallel_rank",
        "get_tensor_model_parallel_src_rank",
        "get_data_parallel_world_size",
        "get_data_parallel_rank",
    }
)

# Other modules that bind a legacy name (prefix -> canonical prefix).
_MODULE_ALIASES = {
    "compat.groups": GROUPS,
    "compat.topology": TOPOLOGY,
}
_NAME_ALIASES = {
    "deepspeed.runtime.pipe.module.PipelineParallelGrid": GRID,
    "deepspeed.runtime.pipe.module.PipeDataParallelTopology": PIPE_DATA_TOPOLOGY,
    "deepspeed.runtime.pipe.ProcessTopology": PROCESS_TOPOLOGY,
    "compat.PipelineParallelGrid": GRID,
}

# Modules that define legacy APIs: the codemods never rewrite them.
DEFINING_MODULES = frozenset({GROUPS, TOPOLOGY, "compat.groups", "compat.topology"})

# Engine classes: `self` inside a subclass is an engine, so `self.mesh_device` is the model's mesh.
ENGINE_CLASSES = frozenset(
    {
        "deepspeed.DeepSpeedEngine",
        "deepspeed.runtime.engine.DeepSpeedEngine",
        "deepspeed.PipelineEngine",
        "deepspeed.runtime.pipe.engine.PipelineEngine",
        "deepspeed.DeepSpeedHybridEngine",
        "deepspeed.runtime.hybrid_engine.DeepSpeedHybridEngine",
    }
)

# Legacy modules whose imports are dropped once nothing uses them.
LEGACY_MODULES = (GROUPS, TOPOLOGY, "deepspeed.runtime.pipe.module", "compat.groups", "compat.topology")


def absolute(name: str, package: Optional[str]) -> Optional[str]:
    """``name`` with a leading relative-import prefix resolved against ``package``."""
    if not name.startswith("."):
        return name
    dots = len(name) - len(name.lstrip("."))
    if package is None:
        return None
    parts = package.split(".") if package else []
    if dots - 1 > len(parts):
        return None
    base = parts[: len(parts) - (dots - 1)]
    rest = name[dots:]
    return ".".join(base + ([rest] if rest else []))


def canonical(name: str) -> str:
    """The canonical qualified name of a legacy API spelled ``name`` (unchanged if not legacy)."""
    for prefix, target in _MODULE_ALIASES.items():
        if name == prefix or name.startswith(prefix + "."):
            name = target + name[len(prefix) :]
            break
    if name in _NAME_ALIASES:
        return _NAME_ALIASES[name]
    head, _, last = name.rpartition(".")
    if head == "deepspeed.utils" and last in GROUPS_STAR_EXPORTS:
        return f"{GROUPS}.{last}"
    return name


def canonical_names(names: Iterable[str], package: Optional[str]) -> set[str]:
    """Canonical forms of qualified names as reported by libcst (relative names resolved)."""
    out = set()
    for name in names:
        resolved = absolute(name, package)
        if resolved is not None:
            out.add(canonical(resolved))
    return out


def groups_function(name: str) -> Optional[str]:
    """The function name if ``name`` is a canonical ``deepspeed.utils.groups`` function."""
    prefix = GROUPS + "."
    if name.startswith(prefix) and "." not in name[len(prefix) :]:
        return name[len(prefix) :]
    return None
