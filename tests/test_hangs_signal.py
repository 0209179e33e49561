"""SIGUSR1 to a rank of a job that runs with the default configuration: the alert rules'
runbooks tell operators to send it, so it must dump the stacks and let training go on."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest
import yaml

from tests.support.trainer_process import log_tail, spawn

pytestmark = [pytest.mark.slow, pytest.mark.integration]  # a real training in a child process


def _wait_for(predicate, timeout: float, what: str, workdir) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}\n{log_tail(workdir)}"
        time.sleep(0.05)


def _lines(path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]


def test_sigusr1_under_the_default_config_dumps_the_stacks_and_training_goes_on(tmp_path):
    logs = tmp_path / "logs"
    config = tmp_path / "monitor.yaml"  # no alert_config: alerts are off
    config.write_text(yaml.safe_dump({"monitor_config": {"json_log_path": str(logs / "m.json")}}))
    stop_file = tmp_path / "stop"
    trainer = spawn(config, tmp_path, steps=100000, stop_file=stop_file)
    try:
        json_log = logs / "m.json"
        _wait_for(lambda: len(_lines(json_log)) >= 1, 120, "the first JSON line", tmp_path)
        os.kill(trainer.pid, signal.SIGUSR1)
        diagnosis = logs / "diagnosis_rank_0.jsonl"
        _wait_for(lambda: _lines(diagnosis), 30, "the stack dump", tmp_path)
        steps_at_dump = len(_lines(json_log))
        # Still training after the dump: more sampled steps arrive.
        _wait_for(lambda: len(_lines(json_log)) > steps_at_dump + 2, 60, "steps after the dump", tmp_path)
    finally:
        stop_file.touch()
        code = trainer.wait(timeout=120)
    assert code == 0, log_tail(tmp_path)
    (dump,) = _lines(diagnosis)
    assert dump["kind"] == "stacks" and dump["reason"] == "SIGUSR1"
    assert any(thread.get("training") for thread in dump["threads"])
