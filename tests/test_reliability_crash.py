"""Crashes: a training process killed with SIGKILL leaves readable logs, and an exception
inside training ends the spans with an error, flushes the files and reaches the caller as
it was raised.
"""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from otel_mindformers.outputs.jsonl_reader import read_logs
from tests.support.jsonl import json_lines
from tests.support.paths import EXAMPLES, REPO
from tests.support.reliability_worker import spawn
from tests.support.waiting import wait_until


def _complete_lines_but_the_last(path: Path) -> list[dict]:
    """All lines parse, except possibly an unterminated last one (cut by the kill)."""
    text = path.read_text()
    lines = text.split("\n")
    tail = lines.pop()  # "" when the file ends with a newline
    parsed = [json.loads(line) for line in lines if line]
    if tail:
        with pytest.raises(ValueError):
            json.loads(tail)
    return parsed


def _ours_written(path: Path) -> int:
    """The package's complete lines in the JSON log so far (its records name the epoch; the
    custom monitor's do not)."""
    if not path.exists():
        return 0
    return sum('"epoch"' in line for line in path.read_text().split("\n")[:-1])


@pytest.mark.slow
@pytest.mark.parametrize("round_", range(2))
def test_kill_9_mid_run_leaves_complete_lines(tmp_path, round_):
    marker = tmp_path / "running"
    spec = {
        "config": {
            "interval": 1,
            "output_type": ["json_file", "tensorboard"],
            "json_log_path": str(tmp_path / "logs" / "train_metric.json"),
            "tensorboard_path": str(tmp_path / "logs" / "tensorboard"),
            "custom_monitor_callback": "custom_monitor.CustomMetricMonitor",
            "alert_config": {"loss_threshold": 1e9},
        },
        "steps": 100_000,
        "graph": True,
        "report": str(tmp_path / "report.json"),
        "at": {"30": [["touch", str(marker)]]},
    }
    process = spawn(spec, tmp_path, env={"PYTHONPATH": f"{EXAMPLES}:{REPO}"})
    try:
        deadline = time.monotonic() + 120
        while not marker.exists() and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert process.poll() is None, process.communicate()[1][-3000:]
        # Killed while both writers are busy: ours (the pipeline's worker, in batches, behind
        # the training thread on a loaded host) past step 30, or 30 steps later.
        json_path = tmp_path / "logs" / "train_metric.json"
        wait_until(
            lambda: _ours_written(json_path) >= 30 + 30 * round_, "our writer past the mark", process, timeout=120
        )
        process.send_signal(signal.SIGKILL)
        process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == -signal.SIGKILL

    lines = _complete_lines_but_the_last(json_path)
    ours = [line["step"] for line in lines if "epoch" in line]
    theirs = [line["step"] for line in lines if "lr" in line]
    assert len(ours) >= 30 and len(theirs) >= 30
    assert ours == sorted(ours) and theirs == sorted(theirs)
    # The package's own reader takes the file as it is, damaged tail included.
    series = read_logs([json_path])
    assert series and max(point.step for s in series for point in s.points) >= 30


@pytest.mark.slow  # a training process
def test_a_forked_child_that_exits_leaves_the_parents_run_alone(tmp_path):
    """A child forked mid-training that leaves through sys.exit runs the exit handlers it
    inherited: they must not end the parent's run (nor take its flight ring) in the child."""
    log = tmp_path / "out" / "train_metric.json"
    spec = {
        "config": {"interval": 5, "output_type": ["json_file"], "json_log_path": str(log)},
        "steps": 12,
        "report": str(tmp_path / "report.json"),
        "at": {"6": [["fork_exit"]]},
    }
    process = spawn(spec, tmp_path)
    _, err = process.communicate(timeout=300)
    assert process.returncode == 0, err[-3000:]
    assert "flight ring" not in err and "exited before training ended" not in err, err[-3000:]
    assert [line["step"] for line in json_lines(log)] == [1, 5, 10, 12]


class Boom(Exception):
    pass


@pytest.mark.slow
@pytest.mark.parametrize("error", [Boom("data pipeline broke at step 5"), KeyboardInterrupt()])
def test_exception_in_training_ends_spans_with_error(workdir, error):
    import mindspore as ms
    from mindspore.train import Callback

    from otel_mindformers.runtime.callback import MonitorCallback
    from tests.support.training import train

    class RaiseAtStep5(Callback):
        def on_train_step_end(self, run_context):
            if run_context.original_args().cur_step_num == 5:
                raise error

    spans = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    callback = MonitorCallback({"interval": 1, "output_type": ["json_file"]}, tracer_provider=provider)

    with pytest.raises(type(error)) as raised:
        train([callback, RaiseAtStep5()], steps=20, mode=ms.GRAPH_MODE)
    assert raised.value is error, "the exception reaches the caller unchanged"

    finished = {span.name: span for span in spans.get_finished_spans()}
    run_span = finished["mindformers.train"]
    assert run_span.status.status_code is StatusCode.ERROR
    assert type(error).__name__ in run_span.status.description
    assert any(event.name == "exception" for event in run_span.events)
    assert "mindformers.train.epoch" in finished, "the open epoch span is ended too"

    lines = [json.loads(line) for line in (workdir / "output" / "train_metric.json").read_text().splitlines()]
    assert [line["step"] for line in lines] == [1, 2, 3, 4, 5], "files are flushed before the exception leaves"
