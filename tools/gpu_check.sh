#!/usr/bin/env bash
# The GPU checks of tests/gpu in one run (< 5 min): NCCL member-only creation and split_group, two
# meshes sharing a communicator, a sub-world engine, a ZeRO-3 step. World = min(GPUs, 4) -> 1, 2
# or 4 ranks (NCCL needs one GPU per rank; on 1 GPU the parts needing peers report a skip).
# usage: tools/gpu_check.sh [python]      (default: python3; run from anywhere)
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${1:-python3}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" OMP_NUM_THREADS=1
"$PY" - <<'PYEOF'
import torch
print("torch", torch.__version__, "cuda", torch.version.cuda, "gpus", torch.cuda.device_count(),
      [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())])
PYEOF
timeout 290 "$PY" -m pytest tests/gpu -q -s -rs -p no:cacheprovider
