#!/usr/bin/env bash
# A 4-rank ZeRO-3 trainer job and a 2-rank tp=2 rollout job, launched separately on this machine
# (gloo, CPU), joined only by the weight link's address. Prints per sync: seconds, bytes, WEIGHTS EQUAL.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(dirname "$(dirname "$here")")"
python="${PYTHON:-$root/.venv/bin/python}"
[ -x "$python" ] || python=python3
link="${LINK:-127.0.0.1:${LINK_PORT:-29650}}"
steps="${STEPS:-3}"
export DS_ACCELERATOR=cpu OMP_NUM_THREADS=1 PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"
# the secret both jobs share (docs/transfer.md, "Security"): one drawn per run unless given
DS_MESH_LINK_SECRET="${DS_MESH_LINK_SECRET:-$("$python" -c 'import secrets; print(secrets.token_hex(16))')}"
export DS_MESH_LINK_SECRET
"$python" -m torch.distributed.run --standalone --nproc-per-node 4 "$here/trainer.py" --link "$link" --steps "$steps" &
trainer=$!
"$python" -m torch.distributed.run --standalone --nproc-per-node 2 "$here/rollout.py" --link "$link" --syncs "$steps" &
rollout=$!
status=0
wait "$trainer" || status=$?
wait "$rollout" || status=$?
exit "$status"
