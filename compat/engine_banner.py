"""The one line an engine built under the shim prints: the mesh it runs on (on the engine's first rank).

It goes to ``deepspeed.mesh``, a logger of the shim's ``deepspeed`` logging tree, at WARNING so it
shows at the default level; the config's ``"logging"`` section or ``DS_LOG_LEVELS`` quiet it like
every other line (``"logging": {"modules": {"deepspeed.mesh": "error"}}``).
"""

from __future__ import annotations

import logging
from typing import Sequence

from mesh_core import MeshSpec
from mesh_core.runtime_hooks import is_hsdp

logger = logging.getLogger("deepspeed.mesh")


def describe(spec: MeshSpec) -> str:
    """``ds-mesh: ...`` saying the mesh's dims and sizes, HSDP, and the ranks it spans."""
    dims = " x ".join(f"{name}={size}" for name, size in zip(spec.names, spec.sizes))
    if spec.ep > 1:
        dims += f" (experts: ep={spec.ep}, edp={spec.dim_size('dp') // spec.ep})"
    text = f"ds-mesh: this engine runs on the mesh {dims}"
    if is_hsdp(spec):
        text += (
            f"; HSDP: ZeRO partitions over dp_shard ({spec.dim_size('dp_shard')} ranks) and averages "
            f"gradients across dp_replicate ({spec.dim_size('dp_replicate')} replicas)"
        )
    if len(spec.ranks) == spec.world_size:
        text += f"; all {spec.world_size} ranks" if spec.world_size > 1 else "; the world's one rank"
    else:
        noun = "ranks" if len(spec.ranks) > 1 else "rank"
        text += f"; {noun} {_span(spec.ranks)} of {spec.world_size} (a sub-world engine)"
    return text + "; engine.mesh_device holds it"


def announce(spec: MeshSpec, rank: int) -> None:
    """Log :func:`describe` once, on the first rank of ``spec``."""
    if rank == min(spec.ranks):
        logger.warning("%s", describe(spec))


def _span(ranks: Sequence[int]) -> str:
    ranks = sorted(ranks)
    if ranks == list(range(ranks[0], ranks[-1] + 1)) and len(ranks) > 2:
        return f"{ranks[0]}..{ranks[-1]}"
    return ", ".join(map(str, ranks))
