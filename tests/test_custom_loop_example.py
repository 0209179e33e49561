"""examples/custom_loop.py runs as a user would run it, with examples/train_config.yaml (the
article's monitor_config, its custom monitor included), in PyNative and under `jit`."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.support.jsonl import json_lines
from tests.support.paths import EXAMPLES, pythonpath_with_repo

pytestmark = [pytest.mark.slow, pytest.mark.mindspore_api]  # a real training in a child process


@pytest.mark.parametrize("mode", [[], ["--jit"]], ids=["pynative", "jit"])
def test_the_custom_loop_example_trains_and_reports(tmp_path, mode):
    env = {**os.environ, "PYTHONPATH": pythonpath_with_repo(os.environ.get("PYTHONPATH"))}
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / "custom_loop.py"), "--steps", "25", *mode],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    lines = json_lines(tmp_path / "output" / "train_metric.json")
    ours = [line for line in lines if "rank" in line]  # the custom monitor writes the same file
    theirs = [line for line in lines if "rank" not in line]
    assert [line["step"] for line in ours] == [1, 10, 20, 25]
    # The example names its length: the last step is sampled at its end, its norm read too.
    assert all(line["grad_norm"] > 0 for line in ours) and ours[0]["learning_rate"] == pytest.approx(0.01)
    assert [line["step"] for line in theirs] == list(range(1, 26))  # every step, as the article's monitor asks
    assert "[otel_mindformers] rank 0 epoch 1 step 10 | loss" in done.stdout
