#!/usr/bin/env bash
# The GPU acceptance run (< 5 min): tests/gpu/nccl_checks.py on one torchrun world, one rank per GPU.
#
#   tools/gpu_check.sh [--cpu] [--world N] [--python PY] [--wheels] [PART ...]
#
# On 1 GPU: probe, member_only, split, sharing, zero3, zero_bf16 (ZeRO 0-3 bf16, plain vs shim
# bit-identical), hf_trainer (an HF Trainer step under DS_MESH=1), member_only_bound (one-rank and
# sub-world meshes built by their members only). On 2-8 GPUs also: subworld_engine, pipelines
# (pp=2; pp=4 from 4 GPUs; p2p groups), transfer (actor -> rollout weights, and a CPU tensor refused
# on every rank) and member-only creation on the bound multi-GPU world. World = the largest of
# 8, 4, 2, 1 not above the GPU count (--world N to choose).
#
# --cpu: the same parts on gloo/CPU processes (default world 1; NCCL-only parts report "dry run"),
#   to check the script where there is no GPU (tests/gpu/test_gpu_check_cpu.py runs it in CI).
# --wheels: print the wheels this run needs and how to carry them to a machine without network.
# It installs nothing: a missing package is reported with the wheel to bring, and the run stops.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=python3
DRY=0
WORLD=""
PARTS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --cpu) DRY=1 ;;
    --world) WORLD="$2"; shift ;;
    --python) PY="$2"; shift ;;
    --wheels) SHOW_WHEELS=1 ;;
    -h|--help) sed -n 2,17p "$0"; exit 0 ;;
    -*) echo "unknown option $1 (see --help)" >&2; exit 2 ;;
    *) PARTS+=("$1") ;;
  esac
  shift
done

wheels() {
  cat <<'EOF'
Wheels for tools/gpu_check.sh (the GPU machine has no network). On a machine with network and the
GPU machine's Python version and platform:

  mkdir wheels
  pip download -d wheels "deepspeed==0.19.8" "transformers==5.24.0" "accelerate==1.16.0" \
      "numpy>=1.24" "wrapt>=1.15" "libcst>=1.1" setuptools wheel
  pip wheel -w wheels --no-deps "deepspeed==0.19.8"    # deepspeed is published as an sdist only

(add --python-version 3.11 --platform manylinux2014_x86_64 --only-binary=:all: to pip download
when that machine differs; torch: keep the GPU machine's CUDA build, or bring it with
pip download -d wheels torch==<release> --index-url https://download.pytorch.org/whl/cu128).
Copy wheels/ and this repository over, then on the GPU machine:

  pip install --no-index --find-links wheels deepspeed==0.19.8 transformers==5.24.0 accelerate==1.16.0 wrapt libcst numpy
  tools/gpu_check.sh             # runs from the checkout (PYTHONPATH); the project needs no install
EOF
}
if [ "${SHOW_WHEELS:-0}" = 1 ]; then wheels; exit 0; fi

export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" OMP_NUM_THREADS=1
if ! "$PY" - <<'PYEOF'
import importlib, sys
need = {"torch": None, "deepspeed": "0.19.8", "numpy": None, "wrapt": None, "libcst": None,
        "transformers": "5.24.0", "accelerate": "1.16.0"}
missing = []
for name, version in need.items():
    try:
        module = importlib.import_module(name)
    except Exception as err:  # noqa: BLE001 - any import failure means: bring the wheel
        missing.append(f"{name}{'==' + version if version else ''} ({type(err).__name__}: {err})")
        continue
    print(f"{name} {getattr(module, '__version__', '?')}")
if missing:
    print("missing packages: " + "; ".join(missing), file=sys.stderr)
    sys.exit(3)
PYEOF
then
  wheels >&2
  exit 3
fi

if [ "$DRY" = 1 ]; then
  export MESH_GPU_DRY_RUN=1 DS_ACCELERATOR=cpu
  WORLD="${WORLD:-1}"
  "$PY" -c "import torch; print('dry run: gloo on CPU, torch', torch.__version__)"
else
  export DS_ACCELERATOR=cuda
  GPUS=$("$PY" -c "import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)")
  if [ "$GPUS" = 0 ]; then echo "no CUDA GPU visible (use --cpu for the gloo dry run)" >&2; exit 2; fi
  if [ -z "$WORLD" ]; then for n in 8 4 2 1; do if [ "$GPUS" -ge "$n" ]; then WORLD=$n; break; fi; done; fi
  "$PY" - <<'PYEOF'
import torch
print("torch", torch.__version__, "cuda", torch.version.cuda, "gpus", torch.cuda.device_count(),
      [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())])
PYEOF
fi

OUT=$(mktemp -d "${TMPDIR:-/tmp}/gpu_check.XXXXXX")
export TORCH_EXTENSIONS_DIR="$OUT/torch_extensions"
echo "world $WORLD, results in $OUT"
START=$SECONDS
set +e
timeout 280 "$PY" -m torch.distributed.run --standalone --nproc_per_node="$WORLD" \
  tests/gpu/nccl_checks.py "$OUT" ${PARTS[@]+"${PARTS[@]}"} >"$OUT/run.log" 2>&1
RC=$?
set -e
grep -E "^rank [0-9]+: " "$OUT/run.log" || true
if [ $RC -ne 0 ]; then
  tail -n 40 "$OUT/run.log" >&2
  echo "FAILED: torchrun exit $RC after $((SECONDS - START)) s (124: the 280 s bound)" >&2
  exit 1
fi
"$PY" - "$OUT" "$WORLD" <<'PYEOF'
import json, sys
out, world = sys.argv[1], int(sys.argv[2])
ranks = [json.load(open(f"{out}/rank{r}.json")) for r in range(world)]
failed = 0
for part in ranks[0]["results"]:
    rows = [r["results"][part] for r in ranks]
    skipped = sorted({row.get("skipped") for row in rows} - {None})
    ok = all(row["ok"] for row in rows)
    failed += not ok
    state = "ok" if ok and not skipped else ("skipped: " + "; ".join(skipped) if ok else "FAILED")
    print(f"{part:18} {state}  ({max(row.get('seconds', 0) for row in rows)} s)")
    if not ok:
        print(json.dumps({i: row for i, row in enumerate(rows) if not row["ok"]}, indent=1)[:4000])
print(f"start-up hook installed the shim: {ranks[0].get('startup_hook_installed_the_shim')}")
sys.exit(1 if failed else 0)
PYEOF
echo "passed in $((SECONDS - START)) s"
