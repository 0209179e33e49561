"""Where the tests' inputs are: everything a test reads lies inside this repository."""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
FIXTURES = REPO / "tests" / "fixtures"
LOG_FIXTURES = FIXTURES / "logs"  # JSON lines as ranks write them
FAKE_BIN = FIXTURES / "bin"  # stand-ins for npu-smi and hccn_tool
COLLECTOR_CONFIG = REPO / "collector-config"
RULE_FILES = sorted((COLLECTOR_CONFIG / "rules").glob("*.yaml"))

# The article's `monitor_config`, as written, and the article's MindFormers YAML around it.
TRAIN_CONFIG_YAML = EXAMPLES / "train_config.yaml"
MINDFORMERS_YAML = EXAMPLES / "mindformers_tiny_llama.yaml"
# The project's reference MindFormers config, verbatim: `callbacks: - type: OtelCallback` and
# MindFormers' own monitor_config keys only (no article keys), trained on the CPU.
REFERENCE_YAML = FIXTURES / "mindformers-tiny-llama-cpu.yaml"
PLAIN_TRAIN = EXAMPLES / "plain_train.py"


def pythonpath_with_repo(pythonpath: str | None) -> str:
    """`pythonpath` with this repository first, so a child process imports this checkout."""
    return os.pathsep.join(filter(None, [str(REPO), pythonpath]))
