#!/usr/bin/env bash
# The test suite, with its own setup: the venv, and the real backends the tests run
# (Prometheus, Alertmanager, promtool) when this machine can install them.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
if ! { command -v promtool && command -v prometheus-alertmanager; } >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  echo "Installing Prometheus, Alertmanager and promtool..."
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
     prometheus prometheus-alertmanager >/dev/null) || echo "warning: could not install Prometheus; its tests will skip (or fail under CI=true)"
fi
export PATH="$PWD/.venv/bin:$PATH"
# Lint, format and types first (configured in pyproject.toml): zero findings, or no tests.
echo "ruff check, ruff format --check, mypy..."
.venv/bin/ruff check --quiet .
.venv/bin/ruff format --check --quiet .
.venv/bin/mypy
exec .venv/bin/python -m pytest "$@"
