"""A job's restarts through the run API: a real custom loop (tests/support/custom_loop_attempt.py)
that saves a checkpoint every 10 steps and says so with `run.checkpoint_saved`, SIGKILLs
itself at step 25, and is resumed from the step-20 checkpoint with
`otel_mindformers.start(..., initial_step=20)`; `report` over the output folder, as a user
runs it, between the attempts and after them."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from tests.support import restart_worker
from tests.support.cli import cli_output
from tests.support.custom_loop_attempt import checkpoint_path
from tests.support.reliability_worker import spawn

pytestmark = [pytest.mark.slow, pytest.mark.mindspore_api]

STEPS, INTERVAL, SAVE_EVERY, KILL_AT = 40, 5, 10, 25
RESUME = KILL_AT // SAVE_EVERY * SAVE_EVERY  # 20: the last checkpoint before the kill


def _attempt(workdir: Path, **spec) -> int:
    config = {
        "interval": INTERVAL,
        "output_type": ["json_file"],
        "json_log_path": str(workdir / "output" / "train_metric.json"),
        "restarts": {"heartbeat_interval": 0.1},
    }
    full = {"config": config, "steps": STEPS, "checkpoint_dir": str(workdir), "save_every": SAVE_EVERY, **spec}
    with restart_worker.reaped(spawn(full, workdir, module="tests.support.custom_loop_attempt")) as process:
        _, err = process.communicate(timeout=300)
    assert process.returncode in (0, -signal.SIGKILL), err[-4000:]
    return process.returncode


def _job(output: Path) -> dict:
    return json.loads(cli_output("report", str(output), "--json"))["job"]


@pytest.fixture(scope="module")
def job():
    """Both attempts; the report between them and after them."""
    with restart_worker.private_dir() as workdir:
        output = workdir / "output"
        assert _attempt(workdir, kill_at=KILL_AT) == -signal.SIGKILL
        assert checkpoint_path(workdir, RESUME).exists()
        between = _job(output)
        assert _attempt(workdir, resume=RESUME) == 0
        yield {
            "output": output, "between": between, "after": _job(output), "text": cli_output("report", str(output)),
            "lines": [json.loads(line) for line in (output / "train_metric.json").read_text().splitlines()],
        }  # fmt: skip


def test_a_killed_loop_has_its_steps_past_the_last_checkpoint_at_risk(job):
    (killed,) = job["between"]["attempts"]
    assert (killed["outcome"], killed["last_step"]) == ("killed", KILL_AT)  # exact: the flight ring's
    # From `run.checkpoint_saved(20, ...)`: the steps a resume from it computes again.
    assert (killed["durable_step"], killed["at_risk_steps"]) == (RESUME, KILL_AT - RESUME)


def test_the_resumed_loop_carries_the_jobs_step(job):
    lines = job["lines"]
    steps = [line["step"] for line in lines]
    # Attempt 1's samples to its kill (the last ones recovered from its flight ring), then
    # attempt 2's from its first step, 21: sampling follows the job's step.
    assert steps == [1, 5, 10, 15, 20, 25, 21, 25, 30, 35, 40]
    assert [line["job"]["attempt"] for line in lines] == [1] * 6 + [2] * 5
    assert {line["epoch"] for line in lines} == {1}  # live and recovered alike: the loop names no epochs
    # The resumed loop is the same training: step 25 again, from the step-20 checkpoint.
    first, again = (line for line in lines if line["step"] == KILL_AT)
    assert again["loss"] == pytest.approx(first["loss"], rel=1e-5)


def test_report_shows_the_attempts_and_the_lost_steps(job):
    attempts = job["after"]["attempts"]
    assert [(a["attempt"], a["resume_step"], a["last_step"], a["outcome"]) for a in attempts] == [
        (1, 0, KILL_AT, "killed"),
        (2, RESUME, STEPS, "completed"),
    ]
    assert [a["lost_steps"] for a in attempts] == [KILL_AT - RESUME, 0]
    totals = job["after"]["totals"]
    assert totals["lost_steps"] == KILL_AT - RESUME and totals["attempts"] == 2
    assert "2 attempts" in job["text"] and f"{KILL_AT - RESUME} steps lost" in job["text"], job["text"]
