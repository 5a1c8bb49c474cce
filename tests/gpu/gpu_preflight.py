"""The version preflight of tools/gpu_check.sh: one JSON line (``{"part": "preflight", ...}``) saying
what is installed against what the run needs, the GPUs, NCCL, bf16 and whether DeepSpeed binds the
world on this torch. Exit 0 when the run can go on, 3 when something must be brought or changed
first (the line says what).

usage: gpu_preflight.py [--cpu] [--world N]
"""

from __future__ import annotations

import importlib
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import gpu_world  # noqa: E402

#: package -> the release the run is checked against (None: any); a different one stops the run
PINNED = {"deepspeed": "0.19.8", "transformers": "5.24.0", "accelerate": "1.16.0"}
NEEDED = ["torch", "deepspeed", "numpy", "wrapt", "libcst", "transformers", "accelerate", "packaging"]


def _version(name: str) -> "tuple[str | None, str | None]":
    try:
        module = importlib.import_module(name)
    except Exception as err:  # noqa: BLE001 - any import failure means: bring the wheel
        return None, f"{type(err).__name__}: {err}"
    return str(getattr(module, "__version__", "?")), None


def preflight(dry: bool, world: "int | None") -> dict:
    line: dict = {"part": "preflight", "packages": {}, "problems": []}
    for name in NEEDED:
        version, error = _version(name)
        line["packages"][name] = version
        if error:
            wanted = f"=={PINNED[name]}" if name in PINNED else ""
            line["problems"].append(f"missing {name}{wanted} ({error}): bring its wheel (tools/gpu_check.sh --wheels)")
        elif name in PINNED and version.split("+")[0] != PINNED[name]:
            line["problems"].append(f"{name} {version} is installed; the run is checked against {name}=={PINNED[name]}")
    torch_version = line["packages"].get("torch")
    if torch_version:
        from mesh_core import torch_compat

        if not torch_compat.is_supported(torch_version):
            line["problems"].append(f"torch {torch_version} is outside the supported {torch_compat.SUPPORTED}")
        line["deepspeed_binds"] = {
            "world_of_many": gpu_world.deepspeed_binds(torch_version, 2),
            "world_of_one": gpu_world.deepspeed_binds(torch_version, 1),
        }
        line.update(_devices(dry, world, torch_version))
    line["ok"] = not line["problems"]
    return line


def _devices(dry: bool, world: "int | None", torch_version: str) -> dict:
    import torch

    if dry:
        return {"devices": "dry run: gloo on CPU", "world": world or 1}
    if not torch.cuda.is_available():
        return {"devices": "no CUDA GPU visible (use --cpu for the gloo dry run)", "world": 0}
    count = torch.cuda.device_count()
    gpus = [
        {
            "name": torch.cuda.get_device_name(i),
            "capability": ".".join(map(str, torch.cuda.get_device_capability(i))),
            "bf16": torch.cuda.get_device_capability(i) >= (8, 0),
        }
        for i in range(count)
    ]
    try:
        nccl = ".".join(map(str, torch.cuda.nccl.version()))
    except Exception as err:  # noqa: BLE001
        nccl = f"unknown ({err})"
    chosen = world or next(n for n in (8, 4, 2, 1) if count >= n)
    return {
        "cuda": torch.version.cuda,
        "nccl": nccl,
        "gpus": gpus,
        "world": chosen,
        "binding": "bound where DeepSpeed binds"
        if gpu_world.version_allows_binding(torch_version)
        else gpu_world.not_binding_reason(torch_version),
    }


def main() -> int:
    dry = "--cpu" in sys.argv
    world = int(sys.argv[sys.argv.index("--world") + 1]) if "--world" in sys.argv else None
    line = preflight(dry, world)
    if not dry and not line.get("world"):
        line["ok"] = False
        line["problems"].append(str(line.get("devices")))
    print(json.dumps(line), flush=True)
    return 0 if line["ok"] else 3


if __name__ == "__main__":
    sys.exit(main())
