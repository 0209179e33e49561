#!/usr/bin/env bash
# The test suite, with its own setup: the venv, and the real backends the tests run
# (Prometheus, Alertmanager, promtool; Chromium for the HTML report) when this machine can
# install them; under CI=true, then the version matrix's rows CI runs (below).
#
#   bash scripts/test.sh                 # everything (what CI runs)
#   bash scripts/test.sh --fast [ARGS]   # the fast set only: no setup, no lint, no backends, no matrix
#   bash scripts/test.sh [PYTEST ARGS]   # e.g. tests/test_config.py -k yaml, --lf, --sw
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = --fast ]; then
  shift
  [ -x .venv/bin/python ] || { echo "no .venv yet: run 'bash scripts/test.sh' (or scripts/setup_env.sh) once" >&2; exit 2; }
  exec .venv/bin/python -m pytest -m "not slow" -q "$@"
fi
bash scripts/setup_env.sh
missing=()
{ command -v promtool && command -v prometheus-alertmanager; } >/dev/null 2>&1 || missing+=(prometheus prometheus-alertmanager)
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
if [ ${#missing[@]} -gt 0 ] && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  echo "Installing ${missing[*]}..."
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
     "${missing[@]}" >/dev/null) || echo "warning: could not install ${missing[*]}; their tests will skip (or fail under CI=true)"
fi
export PATH="$PWD/.venv/bin:$PATH"
# Lint, format and types first (configured in pyproject.toml): zero findings, or no tests.
echo "ruff check, ruff format --check, mypy..."
.venv/bin/ruff check --quiet .
.venv/bin/ruff format --check --quiet .
.venv/bin/mypy
status=0
.venv/bin/python -m pytest "$@" || status=$?
# The version matrix (scripts/matrix.sh): CI runs the oldest pair and MindSpore 2.10 with numpy 2
# beside the main pair above. MATRIX_ROWS names other rows ("all": every row; empty: none), and
# outside CI runs them only when set.
rows=${MATRIX_ROWS-}
if [ "${CI:-}" = true ] && [ -z "${MATRIX_ROWS+set}" ]; then
  rows="ms2.7.0-mf1.6.0 ms2.10.0-numpy2"
fi
if [ -n "$rows" ]; then
  [ "$rows" = all ] && rows=""
  # shellcheck disable=SC2086  # the row names are words
  bash scripts/matrix.sh $rows || status=1
fi
exit "$status"
