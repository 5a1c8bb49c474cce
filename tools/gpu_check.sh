#!/usr/bin/env bash
# The GPU acceptance run, part by part: a version preflight, then one torchrun of tests/gpu/nccl_checks.py
# per part (one rank per GPU), each under its own bound, each reported as one JSON line
# ({"part": ..., "ok": ...}) when it ends, so a hang names its part and the later parts still run.
#
#   tools/gpu_check.sh [--cpu] [--world N] [--python PY] [--wheels] [PART ...]
#
# Parts (tests/gpu/gpu_world.py gives each its bound and world; docs/gpu_check.md says what each checks):
# probe, member_only, not_split, split, sharing, subworld_engine, zero3, zero_bf16, hf_trainer, pipelines,
# transfer, weight_link, link_reads, member_only_bound, unbound_engine. The world is bound to each rank's GPU only
# where DeepSpeed binds it (not on torch 2.6.x/2.7.0); unbound_engine leaves the world unbound and set_device to
# DeepSpeed.
# Plain-vs-shim comparisons run with NCCL_ALGO=Ring NCCL_NVLS_ENABLE=0; bf16 parts are skipped, with the
# reason, on GPUs before Ampere; every group's timeout lies inside its part's bound.
# World = the largest of 8, 4, 2, 1 not above the GPU count (--world N to choose).
#
# --cpu: the same parts on gloo/CPU processes (default world 1; NCCL-only parts report "dry run"),
#   to check the script where there is no GPU (tests/gpu/test_gpu_check_cpu.py runs it in CI).
# --wheels: print the wheels this run needs and how to carry them to a machine without network.
# It installs nothing: a missing package or another release is reported by the preflight, and the run stops.
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
    -h|--help) sed -n 2,21p "$0"; exit 0 ;;
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
if [ "$DRY" = 1 ]; then
  export MESH_GPU_DRY_RUN=1 DS_ACCELERATOR=cpu
  FLAGS=(--cpu)
else
  export DS_ACCELERATOR=cuda
  FLAGS=()
fi
[ -n "$WORLD" ] && FLAGS+=(--world "$WORLD")

# the version preflight: one JSON line; it stops the run when something must be brought first
set +e
PRE=$("$PY" tests/gpu/gpu_preflight.py ${FLAGS[@]+"${FLAGS[@]}"} 2>/dev/null | grep -E '^\{"part": "preflight"')
RC=$?
set -e
if [ -z "$PRE" ]; then
  echo '{"part": "preflight", "ok": false, "problems": ["the preflight could not run: is torch installed for '"$PY"'?"]}'
  wheels >&2
  exit 3
fi
echo "$PRE"
if ! echo "$PRE" | grep -q '"ok": true'; then
  wheels >&2
  exit 3
fi
WORLD=$(echo "$PRE" | "$PY" -c 'import json, sys; print(json.load(sys.stdin)["world"])')

OUT=$(mktemp -d "${TMPDIR:-/tmp}/gpu_check.XXXXXX")
export TORCH_EXTENSIONS_DIR="${TORCH_EXTENSIONS_DIR:-$OUT/torch_extensions}"  # a cache given is reused
echo "world $WORLD, results in $OUT (one JSON line per part, also in $OUT/parts.jsonl)"
START=$SECONDS
set +e
"$PY" tests/gpu/gpu_driver.py "$OUT" "$WORLD" $([ "$DRY" = 1 ] && echo --dry) ${PARTS[@]+"${PARTS[@]}"}
RC=$?
set -e
if [ $RC -ne 0 ]; then
  echo "FAILED after $((SECONDS - START)) s: see the parts' lines above (logs in $OUT/<part>/run.log)" >&2
  exit 1
fi
echo "passed in $((SECONDS - START)) s"
