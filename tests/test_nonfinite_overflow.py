"""fp16 loss scaling is not a fault: steps that overflow (an infinite grad norm, the update
skipped) are not the run's first non-finite value; a NaN loss later is, for the alert
rule, the first-bad-rank record, the step span, `report` and `hang-report` alike, on a rank
that reports training metrics and on one that does not."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from opentelemetry.trace import StatusCode

from otel_mindformers.names import semconv
from tests.support import training
from tests.support.in_memory import Capture

pytestmark = [pytest.mark.slow, pytest.mark.mindspore_api]  # real training runs

OVERFLOW = {1, 2, 3}
NAN_STEP = 8


def _train(tmp_path, capture: Capture, **overrides) -> None:
    config = {
        "interval": 1,
        "output_type": ["json_file"],
        "json_log_path": str(tmp_path / "m.json"),
        "nonfinite_check": "all_ranks",
        "alert_config": {"enable_alert": True},
        **overrides,
    }
    faults = training.Faults(overflow_at=OVERFLOW, nan_at={NAN_STEP})
    training.train([capture.callback(config)], steps=10, shape="tuple5", faults=faults)


def _cli(*args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "otel_mindformers.cli", *args], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def _diagnosis(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_overflow_steps_are_loss_scaling_and_the_later_nan_is_the_first_fault(tmp_path):
    capture = Capture()
    _train(tmp_path, capture)

    lines = [json.loads(line) for line in (tmp_path / "m.json").read_text().splitlines()]
    by_step = {line["step"]: line for line in lines}
    for step in OVERFLOW:  # what the log holds is the data: an infinite grad norm, overflow
        assert by_step[step]["overflow"] is True and by_step[step]["nonfinite"] == ["grad_norm"]
        assert "nonfinite" not in by_step[step].get("alerts", [])
    assert "nonfinite" in by_step[NAN_STEP]["alerts"]
    (record,) = _diagnosis(tmp_path / "diagnosis_rank_0.jsonl")
    assert (record["step"], record["metrics"]) == (NAN_STEP, ["loss"])
    steps = {span.attributes[semconv.ATTR_STEP]: span for span in capture.finished(semconv.SPAN_STEP)}
    assert all(steps[step].status.status_code is not StatusCode.ERROR for step in OVERFLOW)
    assert steps[NAN_STEP].status.status_code is StatusCode.ERROR

    report = _cli("report", str(tmp_path))
    assert f"first non-finite value at step {NAN_STEP}: rank 0 (loss)" in report
    assert "1 record(s)" in report and f"non-finite values at steps {NAN_STEP}" in report
    hang = json.loads(_cli("hang-report", str(tmp_path), "--format", "json"))
    assert hang["first_nonfinite"] == {"step": NAN_STEP, "ranks": [{"rank": 0, "metrics": ["loss"]}]}


def test_a_rank_that_does_not_report_sees_the_overflow_flag_too(tmp_path, monkeypatch):
    monkeypatch.setenv("RANK_ID", "1")
    monkeypatch.setenv("RANK_SIZE", "2")
    _train(tmp_path, Capture(), report_ranks=[0])
    (record,) = _diagnosis(tmp_path / "diagnosis_rank_1.jsonl")
    assert (record["rank"], record["step"], record["metrics"]) == (1, NAN_STEP, ["loss"])
