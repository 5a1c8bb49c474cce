"""ZeRO-3 parameters that arrive partitioned over other ranks than the engine's.

transformers and TRL build a model under ``deepspeed.zero.Init`` (``from_pretrained`` with ZeRO-3)
before any engine exists: its parameters are partitioned over zero.Init's group, the whole world
by default. An engine that partitions over other ranks — a sub-world engine (``"mesh": {"ranks":
[0]}``) or a layout whose data-parallel group is not the world (``"mesh": {"tp": 2}``) — would keep
those partitions: its collectives then name ranks that are not in the engine (a hang when only
the members run it) or mix two partition counts (wrong values).

:func:`check_zero3_partitions` refuses that in ``deepspeed.initialize``, before any collective,
on every rank that calls it. It does not re-partition: that would gather every parameter over the
rank set zero.Init used — ranks that, for a sub-world engine, do not call ``initialize`` at all
(a hang) — and hold the whole model at once, which zero.Init exists to avoid. Build the model
under ``zero.Init(data_parallel_group=<the engine's mesh>.get_group(("dp", "sp")))`` instead (see
docs/zero3_partitions.md).
"""

from __future__ import annotations

from typing import Any

from mesh_core import MeshLayout, MeshSpec, MeshSpecError

# the ZeRO-3 optimizer partitions over ("dp", "sp"); an mpu-driven zero.Init over the mpu's dp group
ZERO_DIMS = (("dp", "sp"), ("dp",))
DOCS = "docs/zero3_partitions.md"


def check_zero3_partitions(model: Any, spec: MeshSpec, rank: int) -> None:
    """Raise :class:`MeshSpecError` when a zero.Init-partitioned parameter of ``model`` lives on
    another rank set than the ZeRO-3 group ``rank`` has in the engine's mesh ``spec``, naming the
    parameter, its ranks and the engine's. Local: reads the parameters' groups, sends nothing."""
    import torch.distributed as dist

    layout = MeshLayout(spec)
    allowed = [layout.group_ranks(dims, rank) for dims in ZERO_DIMS]
    stray: dict[tuple[int, ...], list[str]] = {}
    for name, param in model.named_parameters():
        group = getattr(param, "ds_process_group", None)
        if not hasattr(param, "ds_id") or group is None:
            continue  # not partitioned yet: the engine partitions it over its own group
        if getattr(param, "ds_zero_partition_process_group", None) is not None:
            continue  # a group chosen per parameter (AutoEP experts): DeepSpeed checks those itself
        ranks = sorted(dist.get_process_group_ranks(group))
        if all(ranks != sorted(a) for a in allowed):
            stray.setdefault(tuple(ranks), []).append(name)
    if not stray:
        return
    ranks, names = next(iter(stray.items()))
    outside = sorted(set(ranks) - set(spec.ranks))
    more = sum(len(v) for v in stray.values()) - 1
    zero_ranks = sorted(allowed[0])
    raise MeshSpecError(
        f"ZeRO-3 parameter {names[0]!r}{f' (and {more} more)' if more else ''} was partitioned by zero.Init "
        f"over ranks {list(ranks)}, but this engine, {spec.describe()}, partitions rank {rank}'s parameters "
        f"over ranks {zero_ranks}"
        + (f"; ranks {outside} hold parts of it and are not in the engine" if outside else "")
        + ". A partitioned parameter does not move to other ranks: build the model for this engine under "
        "deepspeed.zero.Init(data_parallel_group=mesh.get_group(('dp', 'sp'))) with "
        "mesh = DeepSpeedDeviceMesh.from_config(config) and pass mesh=mesh to deepspeed.initialize "
        f"(only the engine's ranks do this), or give the engine the ranks zero.Init used (see {DOCS})"
    )
