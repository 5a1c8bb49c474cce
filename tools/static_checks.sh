#!/usr/bin/env bash
# Static checks, configured in pyproject.toml ([tool.ruff], [tool.mypy]): the linter over the tree, the
# formatter's check, and mypy over the faces (mesh_core, runtime_hooks, axis_names, torch_compat, compat,
# codemods, codemods.migrate). Exits non-zero when any fails; runs all three either way.
#
#   tools/static_checks.sh                      # ruff and mypy from the project's venv (the test extra)
#   PYTHON=.venv/bin/python tools/static_checks.sh
#   RUFF=/tmp/lint/bin/ruff MYPY=/tmp/lint/bin/mypy tools/static_checks.sh   # tools from another venv;
#                                               # mypy still reads torch's types from $PYTHON's packages
#
set -u
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python}
RUFF=${RUFF:-"$PYTHON -m ruff"}
MYPY=${MYPY:-"$PYTHON -m mypy"}
failed=()

step() {
    local name=$1
    shift
    echo "== $name: $*"
    if "$@"; then echo "== $name: ok"; else echo "== $name: FAILED"; failed+=("$name"); fi
}

step "ruff check" $RUFF check .
step "ruff format --check" $RUFF format --check --output-format concise .
step "mypy" $MYPY --python-executable "$(command -v "$PYTHON" || echo "$PYTHON")"

if ((${#failed[@]})); then
    echo "static checks failed: ${failed[*]}"
    exit 1
fi
echo "static checks passed"
