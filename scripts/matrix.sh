#!/usr/bin/env bash
# The version matrix: the tests that depend on MindSpore / MindFormers behaviour (marker
# `mindspore_api`), run once per release pair that installs here, each in its own venv.
#
#   bash scripts/matrix.sh                    # every row
#   bash scripts/matrix.sh ms2.7.0-mf1.6.0    # chosen rows (names below)
#
# Venvs live in .matrix/<row>/venv (gitignored) and are reinstalled only when pyproject.toml,
# the row's pins or the checkout change (a second run installs nothing; a new venv downloads
# what pip's cache does not keep). Rows run one after the other (each install unpacks
# ~2.5 GB; tests train on every core). Prints
# each row's install and test wall time and a summary table; exits non-zero if a row fails.
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
MATRIX_DIR="${MATRIX_DIR:-.matrix}"
# Absolute from here on: the row's venv goes first on PATH (msrun's workers start the
# `python` found there), which a relative path, or "$PWD/" before an absolute one, misses.
[[ "$MATRIX_DIR" = /* ]] || MATRIX_DIR="$PWD/$MATRIX_DIR"

# row -> the pins installed beside the package's `test-tools` extra. The main pair (also the
# README's test venv) is ms2.9.0-mf1.9.0; MindSpore before 2.10 is built against numpy 1.x.
declare -A PINS=(
  [ms2.7.0-mf1.6.0]="mindspore==2.7.0 mindformers==1.6.0 numpy<2"
  [ms2.7.1-mf1.7.0]="mindspore==2.7.1 mindformers==1.7.0 numpy<2"
  [ms2.7.2-mf1.8.0]="mindspore==2.7.2 mindformers==1.8.0 numpy<2"
  [ms2.9.0-mf1.9.0]="mindspore==2.9.0 mindformers==1.9.0 numpy<2"
  [ms2.8.0]="mindspore==2.8.0 numpy<2"
  [ms2.10.0-numpy2]="mindspore==2.10.0 numpy>=2"
)
ROWS=(ms2.7.0-mf1.6.0 ms2.7.1-mf1.7.0 ms2.7.2-mf1.8.0 ms2.9.0-mf1.9.0 ms2.8.0 ms2.10.0-numpy2)
# row -> the tests it runs (pytest -m); the default below. The msrun jobs a row runs are those
# whose outcome is MindSpore's own (`msrun_api`: the launcher's environment, a worker's death,
# data-parallel gradients); the others check this package across ranks, which does not change
# with the release and which the main pair's whole suite runs. Rows without MindFormers leave out the tests marked
# `mindformers`; the numpy 2 row adds the offline commands (marker `analysis`), numpy's users,
# and leaves out real msrun jobs (`msrun_job`): MindSpore 2.10.0's own workers never leave the
# cluster under numpy 2 (a plain msrun script fails the same way; with numpy 1.26 it passes).
DEFAULT_TESTS="mindspore_api and (not msrun_job or msrun_api)"
declare -A TESTS=(
  [ms2.8.0]="mindspore_api and not mindformers and (not msrun_job or msrun_api)"
  [ms2.10.0-numpy2]="(mindspore_api or analysis) and not mindformers and not msrun_job"
)

usage() {
  echo "usage: scripts/matrix.sh [ROW...]; rows: ${ROWS[*]}" >&2
  exit 2
}

install_row() {  # row venv: create it once; install when pyproject.toml or the pins changed
  local row=$1 venv=$2
  local stamp="$venv/.matrix_installed"
  local wanted
  # The editable install points at this checkout: another checkout's venv is reinstalled.
  wanted=$(cat pyproject.toml <(echo "${PINS[$row]} $PWD") | sha256sum | cut -d' ' -f1)
  [ "$(cat "$stamp" 2>/dev/null)" = "$wanted" ] && return 0
  if [ ! -x "$venv/bin/python" ]; then
    "$PYTHON" -m venv "$venv" || return 1
    # pip >= 23.3 resolves the OTLP JSON exporter's pinned transport (README, Install).
    "$venv/bin/python" -m pip install --quiet --upgrade pip || return 1
  fi
  # shellcheck disable=SC2086  # the pins are words
  "$venv/bin/python" -m pip install --quiet -e ".[test-tools]" ${PINS[$row]} || return 1
  echo "$wanted" > "$stamp"
}

run_row() {  # row: install, test; the row's times and outcome go to .matrix/<row>/result
  local row=$1 venv="$MATRIX_DIR/$1/venv" log="$MATRIX_DIR/$1/pytest.log" result="$MATRIX_DIR/$1/result"
  local selection="${TESTS[$row]:-$DEFAULT_TESTS}" start installed status
  mkdir -p "$MATRIX_DIR/$row"
  start=$(date +%s)
  echo "== $row: installing ${PINS[$row]}"
  if ! install_row "$row" "$venv"; then
    echo "$(( $(date +%s) - start )) 0 install failed" > "$result"
    return 1
  fi
  installed=$(date +%s)
  "$venv/bin/python" -m pip list 2>/dev/null | grep -iE "^(mindspore|mindformers|numpy) "
  echo "== $row: pytest -m \"$selection\""
  # The row's venv first on PATH: msrun starts workers with the `python` it finds there.
  PATH="$venv/bin:$PATH" "$venv/bin/python" -m pytest -q -m "$selection" 2>&1 | tee "$log"
  status=${PIPESTATUS[0]}
  # pytest's summary line ("1 failed, 214 passed, 1222 deselected in 574.47s"; framed by `=`
  # without -q), less its time: the row's outcome.
  echo "$(( installed - start )) $(( $(date +%s) - installed )) $(grep -E '(passed|failed|error|no tests ran).* in [0-9.]+s' "$log" \
    | tail -1 | sed -E 's/^=+ //; s/ in [0-9.]+s.*//')" > "$result"
  return "$status"
}

main() {
  local rows=("$@") row failed=0
  [ ${#rows[@]} -eq 0 ] && rows=("${ROWS[@]}")
  # An empty name is no row (bash refuses it as an array subscript).
  for row in "${rows[@]}"; do [ -n "$row" ] && [ -n "${PINS[$row]:-}" ] || usage; done
  for row in "${rows[@]}"; do
    rm -f "$MATRIX_DIR/$row/result"
    run_row "$row" || failed=1
  done
  echo
  printf '%-18s %10s %8s  %s\n' row "install s" "tests s" outcome
  for row in "${rows[@]}"; do
    read -r install tests outcome < "$MATRIX_DIR/$row/result"
    printf '%-18s %10s %8s  %s\n' "$row" "$install" "$tests" "$outcome"
  done
  return "$failed"
}

main "$@"
