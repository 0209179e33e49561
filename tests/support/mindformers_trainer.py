"""A real MindFormers `Trainer` run on a YAML, in a child process on the CPU.

    run([*CPU_RUNNER, write_trainer(workdir, yaml_text, rows=4)], child_env(), workdir)

`write_trainer` writes the YAML to `config.yaml` and a script that trains MindFormers' Trainer on
it with `rows` random token rows (batches of 2) to `train.py`; CPU_RUNNER runs a script after
the patches MindFormers 1.9 needs on a CPU (tests/support/mindformers_cpu.py).
"""

from __future__ import annotations

import decimal
import sys
from pathlib import Path

CPU_RUNNER = [sys.executable, "-m", "tests.support.mindformers_cpu"]

_SCRIPT = """
import numpy as np
{register}from mindformers import MindFormerConfig, Trainer
from mindspore.dataset import GeneratorDataset

config = MindFormerConfig("config.yaml")
rows = np.random.default_rng(0).integers(0, 64, size=({rows}, 17), dtype=np.int32)
Trainer(args=config, train_dataset=GeneratorDataset([(r,) for r in rows], column_names=["input_ids"]).batch(2)).train()
"""
_REGISTER = "import otel_mindformers  # noqa: F401  (registers OtelCallback / MonitorCallback with MindFormers)\n"


def write_trainer(workdir: Path, config_yaml: str, *, rows: int, register: bool = True) -> str:
    """The script's name, in `workdir`. With `register`, the script imports otel_mindformers
    first, as the article's code does; without, only the zero-code path can add monitoring."""
    (workdir / "config.yaml").write_text(config_yaml)
    (workdir / "train.py").write_text(_SCRIPT.format(register=_REGISTER if register else "", rows=rows))
    return "train.py"


def as_logged(text: str, rel: float = 1e-6):
    """`pytest.approx` of a number MindFormers logged, to the digits it printed: 1.9 prints a
    loss or a norm to 6 decimals, 1.6 to 3 or 4."""
    import pytest

    return pytest.approx(float(text), rel=rel, abs=half_unit(text))


def half_unit(text: str) -> float:
    """Half a unit of the last digit `text` prints (the most a printed value is off by)."""
    exponent = decimal.Decimal(text).as_tuple().exponent
    return 0.5 * 10.0 ** int(exponent)
