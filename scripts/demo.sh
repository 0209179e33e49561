#!/usr/bin/env bash
# The main job: the article's example, a real tiny MindSpore training with monitoring on,
# on local defaults (stdout, JSON lines, TensorBoard; no collector needed).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
# Python runs as this script's child, not through `exec`: an exec'd process keeps the
# shell's start time, and the installation above would count as the run's start-up.
.venv/bin/python examples/train_main.py "$@"
