#!/usr/bin/env bash
# Creates .venv (once) and installs the package with its pinned test/demo dependencies.
# Re-runs are fast: the install is skipped while pyproject.toml is unchanged.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
  .venv/bin/python -m pip install --quiet --upgrade pip
fi
stamp=.venv/.otel_mindformers_installed
wanted=$(sha256sum pyproject.toml | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$wanted" ]; then
  echo "Installing otel_mindformers with mindspore 2.9.0 + mindformers 1.9.0 (first run: a few minutes)..."
  .venv/bin/python -m pip install --quiet -e ".[test]"
  echo "$wanted" > "$stamp"
fi
