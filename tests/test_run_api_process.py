"""The run API seen from outside its process (tests/support/custom_loop_process.py, a real
PyNative custom loop): a loop SIGKILLed mid-window, whose exact last step `report` gives and
whose JSON log gets its tail back from the flight ring (docs/flight_recorder.md); and a
`start()` given no config, configured by OTEL_PYTHON_MINDFORMERS_CONFIG alone (zero-code); a
script that never calls `run.end()`, ended at the interpreter's exit."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from otel_mindformers.integration.environment_variables import OTEL_PYTHON_MINDFORMERS_CONFIG
from otel_mindformers.names import training as tm
from tests.support.cli import cli_output
from tests.support.jsonl import json_lines
from tests.support.reliability_worker import finish, spawn
from tests.support.shm_segments import segments

pytestmark = [pytest.mark.slow, pytest.mark.mindspore_api]  # real trainings in child processes

MODULE = "tests.support.custom_loop_process"


def _sampled(interval: int, last: int) -> list[int]:
    return [1] + [step for step in range(2, last + 1) if step % interval == 0]


@pytest.mark.parametrize("jit", [False, True], ids=["pynative", "jit"])
def test_a_sigkilled_loop_gives_report_its_exact_last_step_and_its_log_its_tail(tmp_path, jit):
    out = tmp_path / "out"
    log = out / "train_metric.json"
    config = {"interval": 10, "output_type": ["json_file"], "json_log_path": str(log)}
    before = set(segments())
    process = spawn({"config": config, "steps": 200, "jit": jit, "die_at": 57}, tmp_path, module=MODULE)
    _, err = finish(process)
    assert process.returncode == -signal.SIGKILL, err[-3000:]
    assert len(set(segments()) - before) == 1, "the dead loop's ring stays in shared memory"

    report = json.loads(cli_output("report", str(out), "--json", cwd=out))

    (attempt,) = report["job"]["attempts"]
    assert (attempt["outcome"], attempt["last_step"]) == ("killed", 57)  # not 50, the last sampled
    lines = json_lines(log)  # every line whole
    assert [line["step"] for line in lines] == _sampled(10, 57)
    recovered = [line for line in lines if line.get("recovered")]
    assert lines[len(lines) - len(recovered) :] == recovered, "what the dead worker had not written comes last"
    assert all(line[tm.LOSS] > 0 and line[tm.GRAD_NORM] > 0 for line in lines)
    assert set(segments()) == before, "report took the ring out of shared memory"
    again = json.loads(cli_output("report", str(out), "--json", cwd=out))
    assert again["job"]["attempts"][0]["last_step"] == 57 and json_lines(log) == lines  # each record once


def test_start_without_a_config_reads_the_file_the_environment_names(tmp_path):
    log = tmp_path / "from_env" / "metrics.json"
    yaml = tmp_path / "monitor.yaml"
    yaml.write_text(
        f"monitor_config:\n  interval: 5\n  output_type: [json_file]\n  json_log_path: {log}\n"
        "  monitored_metrics: [loss, grad_norm, train_per_step_time]\n"
    )
    process = spawn({"steps": 12}, tmp_path, env={OTEL_PYTHON_MINDFORMERS_CONFIG: str(yaml)}, module=MODULE)
    out, err = finish(process)
    assert process.returncode == 0, err[-3000:]
    assert "last step 12" in out
    lines = json_lines(log)
    assert [line["step"] for line in lines] == [1, 5, 10, 12]
    assert set(lines[1]) >= {tm.LOSS, tm.GRAD_NORM, tm.STEP_TIME} and tm.LEARNING_RATE not in lines[1]


def test_a_config_file_the_environment_names_that_is_wrong_fails_before_training(tmp_path):
    yaml = tmp_path / "monitor.yaml"
    yaml.write_text("monitor_config:\n  intervall: 5\n")
    process = spawn({"steps": 3}, tmp_path, env={OTEL_PYTHON_MINDFORMERS_CONFIG: str(yaml)}, module=MODULE)
    out, err = finish(process)
    assert process.returncode != 0 and "last step" not in out
    assert f"{OTEL_PYTHON_MINDFORMERS_CONFIG}={yaml}: monitor_config.intervall: unknown key" in err, err[-3000:]
    assert not Path(tmp_path / "output" / "train_metric.json").exists()


@pytest.mark.parametrize(
    ("raise_at", "c_error_at", "outcome", "records"),
    [
        (None, None, ("completed", 12, None), [1, 5, 10, 12]),
        # An error a C extension printed and handled is no crash (MindSpore 2.10 prints one).
        (None, 3, ("completed", 12, None), [1, 5, 10, 12]),
        (7, None, ("crashed", 7, "RuntimeError: the loop failed after step 7"), [1, 5]),
    ],
    ids=["returns", "returns after a C extension printed an error", "raises"],
)  # fmt: skip
def test_a_script_that_never_calls_end_is_ended_at_exit_as_end_ends_it(
    tmp_path, raise_at, c_error_at, outcome, records
):
    out = tmp_path / "out"
    log = out / "train_metric.json"
    config = {"interval": 5, "output_type": ["json_file"], "json_log_path": str(log)}
    spec = {"config": config, "steps": 12, "end": "never", "raise_at": raise_at, "c_error_at": c_error_at}
    process = spawn(spec, tmp_path, module=MODULE)
    _, err = finish(process)
    assert process.returncode == (0 if raise_at is None else 1), err[-3000:]
    assert [line["step"] for line in json_lines(log)] == records  # the last step sampled where end() would
    report = json.loads(cli_output("report", str(out), "--json", cwd=out))
    (attempt,) = report["job"]["attempts"]
    assert (attempt["outcome"], attempt["last_step"], attempt["reason"]) == outcome


def test_a_forked_child_that_exits_leaves_the_parents_run_alone(tmp_path):
    out = tmp_path / "out"
    log = out / "train_metric.json"
    config = {"interval": 5, "output_type": ["json_file"], "json_log_path": str(log)}
    process = spawn({"config": config, "steps": 12, "fork_at": 6}, tmp_path, module=MODULE)
    _, err = finish(process)
    assert process.returncode == 0, err[-3000:]
    assert "flight ring" not in err, err[-3000:]  # the child did not end the run and take its ring
    assert [line["step"] for line in json_lines(log)] == [1, 5, 10, 12]
    (attempt,) = json.loads(cli_output("report", str(out), "--json", cwd=out))["job"]["attempts"]
    assert (attempt["outcome"], attempt["last_step"]) == ("completed", 12)
