"""How tests/gpu/nccl_checks.py sets up each part's world, and what each part needs (no torch import at
module level: tools/gpu_check.sh's driver reads :data:`SPECS` before any world exists).

- **bound where DeepSpeed binds**: DeepSpeed's ``init_distributed`` passes ``device_id`` to
  ``init_process_group`` on CUDA except on torch ``2.6.0 < v < 2.7.1`` (torch#153960: random NCCL hangs
  with ``device_id``) and on a world of one (``deepspeed/comm/torch.py`` of 0.19.8). A "bound" part binds
  by the same version rule; on a world of one it binds anyway (the member-only detector needs a bound
  world, and on one GPU nothing can hang on a peer), which :func:`deepspeed_binds` reports apart;
- **unbound**: ``init_process_group`` without ``device_id`` and no ``set_device``: the world DeepSpeed
  leaves on torch 2.6.x+cuXXX / 2.7.0 and on a world of one, for a script that leaves the device to it.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Optional

BIND_UNSAFE = ((2, 6, 0), (2, 7, 1))  # DeepSpeed: 2.6.0 < torch < 2.7.1 is not bound (torch#153960)


@dataclasses.dataclass(frozen=True)
class PartSpec:
    """One part: its bound (seconds, the whole torchrun of that part), its world, whether it compares
    plain DeepSpeed with the shim bit for bit (then NCCL is pinned to the ring algorithm, no NVLS, so
    both communicators reduce alike), and whether it computes in bf16."""

    bound_s: int
    world: str = "bound"  # "bound" (where DeepSpeed binds) or "unbound"
    compares: bool = False
    bf16: bool = False
    selftest: bool = False  # only run when named (checks the script's own bounds)
    nccl_only: str = ""  # why the gloo dry run has nothing to run of it ("" when it has)
    min_world: int = 1  # the smallest world it has something to check in


SPECS: dict[str, PartSpec] = {
    "probe": PartSpec(90, nccl_only="the probe reads a world bound to a GPU"),
    "member_only": PartSpec(90),
    "not_split": PartSpec(90),  # the dry run shows its split-source signal on gloo (and says what it cannot check)
    "split": PartSpec(90, nccl_only="gloo cannot split"),
    "sharing": PartSpec(90),
    "subworld_engine": PartSpec(150, min_world=2),
    "zero3": PartSpec(150),
    "zero_bf16": PartSpec(300, compares=True, bf16=True),
    "hf_trainer": PartSpec(240, bf16=True),
    "pipelines": PartSpec(240, compares=True, min_world=2),
    "transfer": PartSpec(150, min_world=2),
    "weight_link": PartSpec(90),
    "link_reads": PartSpec(90),
    "member_only_bound": PartSpec(90),
    "unbound_engine": PartSpec(180, world="unbound", compares=True),
    "step_aside": PartSpec(90),
    "hang_selftest": PartSpec(15, selftest=True),
}
#: NCCL's settings for the parts that compare plain with shim bit for bit
COMPARE_ENV = {"NCCL_ALGO": "Ring", "NCCL_NVLS_ENABLE": "0"}
GROUP_TIMEOUT_MARGIN_S = 30  # a part's groups time out this long before its bound


def nothing_to_run(spec: PartSpec, world: int, dry: bool) -> "str | None":
    """Why a part has nothing to check in this run (the driver then starts no processes for it)."""
    if dry and spec.nccl_only:
        return f"dry run ({spec.nccl_only})"
    if world < spec.min_world:
        return f"needs a world of >= {spec.min_world} (this run has {world})"
    return None


def group_timeout_s(spec: PartSpec) -> int:
    """The timeout of the part's world and of every group it creates: inside the part's bound, so a
    hung collective is reported by torch before the part is killed."""
    return max(5, spec.bound_s - GROUP_TIMEOUT_MARGIN_S)


def torch_release(version: str) -> Optional[tuple[int, int, int]]:
    match = re.match(r"^\s*(\d+)\.(\d+)(?:\.(\d+))?", version)
    return None if match is None else (int(match.group(1)), int(match.group(2)), int(match.group(3) or 0))


def version_allows_binding(version: str) -> bool:
    """DeepSpeed 0.19.8's version rule: ``not (2.6.0 < torch < 2.7.1)`` (``2.6.0+cu124`` > 2.6.0)."""
    from packaging.version import Version

    return not (Version("2.6.0") < Version(version) < Version("2.7.1"))


def deepspeed_binds(version: str, world_size: int) -> bool:
    """Whether DeepSpeed's ``init_distributed`` binds the world to ``cuda:LOCAL_RANK`` (CUDA)."""
    return world_size != 1 and version_allows_binding(version)


def not_binding_reason(version: str) -> str:
    return (
        f"DeepSpeed does not bind the world on torch {version} (2.6.0 < torch < 2.7.1: torch#153960, NCCL hangs "
        "with device_id), so neither does this run"
    )
