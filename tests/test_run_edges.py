"""A run's edges: sink mode, the last record, failed starts, odd outputs, custom monitors.

Real MindSpore training where the behaviour needs one; MindSpore's own RunContext and
callback parameters with hand-picked `net_outputs` where the point is what a step may
return (any value of any shape in any position).
"""

from __future__ import annotations

import logging
import math
import threading
import time

import mindspore as ms
import numpy as np
import pytest
from mindspore import nn
from mindspore.train.callback import RunContext, _InternalCallbackParam

from otel_mindformers import ConfigError, MonitorCallback
from otel_mindformers.analysis.report import build_report
from otel_mindformers.names import semconv
from otel_mindformers.outputs.jsonl_reader import read_logs
from tests.support import monitors, training
from tests.support.in_memory import Capture
from tests.support.jsonl import json_lines as lines


def monitor_threads() -> set[str]:
    return {t.name for t in threading.enumerate() if t.name.startswith("otel-mindformers")}


@pytest.mark.slow
def test_sink_mode_samples_by_the_real_step_not_the_sink_size(workdir):
    """MindSpore reports batch_num = sink_size (4) but runs the whole epoch (12 steps)."""
    log = workdir / "m.json"
    cb = MonitorCallback({"interval": 5, "output_type": ["json_file"], "json_log_path": str(log)})
    training.train([cb], steps=12, epochs=2, shape="tuple5", mode=ms.GRAPH_MODE, sink_size=4)
    written = lines(log)
    assert [line["step"] for line in written] == [1, 5, 10, 15, 20, 24]
    assert [line["epoch"] for line in written] == [1, 1, 1, 2, 2, 2]


def _drive_sinks(cb, *, sink: int, sinks: int, step_seconds: float = 0.0) -> None:
    """`cb` as graph-mode sink mode on a device calls it: the step hooks once per sink with
    `cur_step_num += sink_size` (Model._train_dataset_sink_process). The CPU cannot sink, so
    MindSpore's own RunContext is driven as that loop drives it."""
    params = _InternalCallbackParam()
    params.batch_num, params.epoch_num, params.cur_step_num, params.dataset_sink_mode = sink, sinks, 0, True
    params.train_dataset = training.build_dataset(steps=10)
    params.optimizer = nn.Momentum(nn.Dense(2, 1).trainable_params(), learning_rate=0.01, momentum=0.9)
    params.train_network = params.network = None
    context = RunContext(params)
    cb.on_train_begin(context)
    for epoch in range(1, sinks + 1):
        params.cur_epoch_num = epoch
        cb.on_train_epoch_begin(context)
        params.cur_step_num += sink
        cb.on_train_step_begin(context)
        time.sleep(sink * step_seconds)  # the sink's steps
        params.net_outputs = ms.Tensor(1.0 / epoch)
        cb.on_train_step_end(context)
        cb.on_train_epoch_end(context)
    cb.on_train_end(context)


@pytest.mark.slow
def test_device_sink_mode_reports_per_step_values_and_no_gaps(workdir):
    """4-step sinks of 5 ms steps at interval 6 are sampled at 4, 8, 12, 20, 24 (the first
    sink end past each multiple of 6), with the step time and throughput of one step, not of
    a sink, and `report` finds no gap where sampling skipped a sink end."""
    log, step_seconds = workdir / "m.json", 0.005
    cb = MonitorCallback({"interval": 6, "output_type": ["json_file"], "json_log_path": str(log)})
    _drive_sinks(cb, sink=4, sinks=6, step_seconds=step_seconds)
    written = lines(log)
    assert [line["step"] for line in written] == [4, 8, 12, 20, 24]
    for line in written[1:]:  # the first window holds the start-up
        assert step_seconds * 1000 <= line["train_per_step_time"] < 3 * step_seconds * 1000  # a sink: 4x
        assert line["samples_per_second"] == pytest.approx(training.BATCH * 1000 / line["train_per_step_time"])
    (summary,) = build_report(read_logs([log])).series
    assert summary.gaps == []


@pytest.mark.slow
def test_device_sink_mode_keeps_a_step_span_every_n_steps(workdir):
    """3-step sinks at interval 10 are sampled at 3, 12, 21, 30, 42, 51, 60: `step_spans: 20`
    keeps the samples first past 20, 40 and 60 (21, 42, 60; `step % 20` would keep 60 alone)."""
    capture = Capture()
    log = str(workdir / "m.json")
    # No straggler signal: an anomaly (a sink that only waits is "input-bound") adds its span.
    config = {"interval": 10, "step_spans": 20, "output_type": ["json_file"], "json_log_path": log}
    cb = capture.callback({**config, "stragglers": {"signal": False}})
    _drive_sinks(cb, sink=3, sinks=20)
    sampled = [line["step"] for line in lines(workdir / "m.json")]
    assert sampled == [3, 12, 21, 30, 42, 51, 60]
    spans = sorted(s.attributes[semconv.ATTR_STEP] for s in capture.finished(semconv.SPAN_STEP))
    assert spans == [21, 42, 60]


def test_step_time_is_the_mean_over_the_window_not_the_last_step(workdir):
    """Step 7 takes 0.2 s, the others nothing: the window 6..10 reports 0.2 s / 5 steps,
    where the last step of the window (10) took almost nothing."""
    log = workdir / "m.json"
    _drive(ms.Tensor(1.0), steps=10, slow_steps={7: 0.2}, interval=5, json_log_path=str(log))
    by_step = {line["step"]: line["train_per_step_time"] for line in lines(log)}
    assert sorted(by_step) == [1, 5, 10]
    assert 200 / 5 <= by_step[10] < 200 / 2
    assert by_step[5] < 200 / 5


class _StuckStdout:
    """A terminal that stops taking output until released (a blocked pipe)."""

    def __init__(self) -> None:
        self.release = threading.Event()

    def write(self, text: str) -> int:
        self.release.wait()
        return len(text)

    def flush(self) -> None:
        pass


@pytest.mark.slow
def test_records_a_stuck_output_never_took_are_counted_at_train_end(workdir, monkeypatch, caplog):
    """The worker is stuck writing its first batch (step 1, with step 2 when it was queued
    by then): after the local drain the warning counts every record not on disk, the stuck
    batch's and those left in the queue (the run's end is not one)."""
    stuck = _StuckStdout()
    monkeypatch.setattr("sys.stdout", stuck)
    try:
        with caplog.at_level(logging.WARNING, logger="otel_mindformers"):
            _drive(ms.Tensor(1.0), steps=3, output_type=["stdout"], shutdown_timeout=0)
    finally:
        stuck.release.set()
    assert "sampled steps did not drain within 10.0 s; 3 record(s) not written" in caplog.text


@pytest.mark.slow
def test_shutdown_timeout_zero_still_writes_the_last_record(workdir):
    log = workdir / "m.json"
    cb = MonitorCallback(
        {
            "interval": 4,
            "output_type": ["json_file", "tensorboard"],
            "json_log_path": str(log),
            "tensorboard_path": str(workdir / "tb"),
            "shutdown_timeout": 0,
        }
    )
    training.train([cb], steps=10, shape="tuple5")
    assert [line["step"] for line in lines(log)] == [1, 4, 8, 10]


@pytest.mark.slow
def test_a_failed_start_leaves_no_thread_behind(workdir):
    """The output folder cannot be created (a file is in the way): ConfigError naming the
    key, and every thread the run had started is gone."""
    (workdir / "blocker").write_text("a file, not a folder")
    before = monitor_threads()
    for _ in range(3):
        cb = MonitorCallback(
            {
                "output_type": ["json_file", "otlp"],
                "json_log_path": str(workdir / "blocker" / "m.json"),
                "otlp": {"endpoint": "http://127.0.0.1:9"},
            }
        )
        with pytest.raises(ConfigError, match="json_log_path"):
            training.train([cb], steps=2)
    assert monitor_threads() == before


def _drive(outputs, steps: int = 3, slow_steps: dict[int, float] | None = None, **config):
    """MonitorCallback through MindSpore's own RunContext, with `outputs` as every step's
    net_outputs; `slow_steps` maps a step to the seconds it takes."""
    net = nn.Dense(2, 1)
    params = _InternalCallbackParam()
    params.batch_num, params.epoch_num, params.cur_epoch_num, params.cur_step_num = steps, 1, 1, 0
    params.optimizer = nn.Momentum(net.trainable_params(), learning_rate=0.01, momentum=0.9)
    params.train_network = None
    params.train_dataset = None
    params.net_outputs = outputs
    context = RunContext(params)
    cb = MonitorCallback({"interval": 1, "output_type": ["json_file"], **config})
    cb.on_train_begin(context)
    for step in range(1, steps + 1):
        params.cur_step_num = step
        time.sleep((slow_steps or {}).get(step, 0.0))  # the step's own work
        cb.on_train_step_end(context)
    cb.on_train_end(context)
    return cb


def test_the_otlp_exporters_checked_before_training_are_the_ones_the_run_uses(workdir, otlp_receiver, monkeypatch):
    """MonitorCallback builds our OTLP exporters to check their settings before training;
    the run built them a second time (the check's were shut down unused). A later run of the
    same callback builds its own: the first run shut its exporters down."""
    from otel_mindformers.names import semconv
    from otel_mindformers.telemetry import providers

    built = []

    def counted(*args, **kwargs):
        built.append(args)
        return real(*args, **kwargs)

    real = providers.otlp_exporters
    monkeypatch.setattr(providers, "otlp_exporters", counted)
    params = _InternalCallbackParam()
    params.batch_num, params.epoch_num, params.cur_epoch_num, params.cur_step_num = 1, 1, 1, 0
    params.optimizer = params.train_network = params.train_dataset = None
    params.net_outputs = ms.Tensor(1.0)
    context = RunContext(params)
    cb = MonitorCallback({"output_type": ["otlp"], "otlp": {"endpoint": otlp_receiver.grpc_endpoint}})
    assert len(built) == 1
    for run in (1, 2):
        params.cur_step_num = 0
        cb.on_train_begin(context)
        params.cur_step_num = 1
        cb.on_train_step_end(context)
        cb.on_train_end(context)
        assert otlp_receiver.wait_for(lambda rx, run=run: len(rx.spans(semconv.SPAN_RUN)) == run)
        assert len(built) == run


NAN, INF = float("nan"), float("inf")
ODD_OUTPUTS = {
    "empty tuple": (),
    "nan overflow (3-tuple)": (ms.Tensor(2.0), ms.Tensor(NAN), ms.Tensor(1024.0)),
    "inf overflow (5-tuple)": (ms.Tensor(2.0), ms.Tensor(INF), ms.Tensor(1.0), ms.Tensor(0.1), ms.Tensor(0.5)),
    "nan everywhere (7-tuple)": tuple(ms.Tensor(NAN) for _ in range(7)),
    "strings and None": ("loss", None, object()),
    "empty tensor loss": (ms.Tensor(np.zeros((0,), np.float32)),),
    "2-tuple": (ms.Tensor(1.5), ms.Tensor(3.0)),
    "numpy object array": np.array([object()], dtype=object),
    "python list of lists": [[1.0, 2.0], [3.0]],
    "bool tensor loss": ms.Tensor(True),
}


@pytest.mark.parametrize("outputs", list(ODD_OUTPUTS.values()), ids=list(ODD_OUTPUTS))
def test_any_output_of_any_shape_is_recorded_or_left_out_never_raised(outputs, workdir):
    log = workdir / "m.json"
    _drive(outputs, json_log_path=str(log))
    written = lines(log)
    assert [line["step"] for line in written] == [1, 2, 3]
    for line in written:
        for key in line.get("nonfinite", []):
            assert line[key] is None


def test_nan_or_inf_in_the_overflow_position_is_counted_as_nonfinite(workdir):
    log = workdir / "m.json"
    _drive(ODD_OUTPUTS["inf overflow (5-tuple)"], json_log_path=str(log))
    first = lines(log)[0]
    assert first["overflow"] is None and first["nonfinite"] == ["overflow"]
    assert first["loss"] == 2.0 and first["grad_norm"] == 0.5


def test_inf_is_written_as_null_and_named(workdir):
    log = workdir / "m.json"
    _drive((ms.Tensor(INF),), json_log_path=str(log))
    assert all(line["loss"] is None and line["nonfinite"] == ["loss"] for line in lines(log))


@pytest.mark.slow
def test_a_raising_custom_monitor_is_isolated_and_reported_once(workdir, caplog, monkeypatch):
    monkeypatch.setattr(monitors.Raising, "calls", 0)
    log = workdir / "m.json"
    cb = MonitorCallback(
        {
            "interval": 2,
            "output_type": ["json_file"],
            "json_log_path": str(log),
            "custom_monitor_callback": "tests.support.monitors.Raising",
        }
    )
    with caplog.at_level(logging.WARNING, logger="otel_mindformers"):
        training.train([cb], steps=6)
    assert [line["step"] for line in lines(log)] == [1, 2, 4, 6]  # training and monitoring went on
    assert monitors.Raising.calls == 6  # the monitor still runs on every step
    raised = [r.getMessage() for r in caplog.records if "custom monitor" in r.getMessage()]
    assert len(raised) == 2, raised  # the first failure, then the count at train end
    assert "RuntimeError: custom monitor bug" in raised[0] and "failed 6 times" in raised[1]


@pytest.mark.slow
def test_custom_monitors_get_a_learning_rate_that_costs_nothing_until_read(workdir, monkeypatch):
    """With a schedule, the lr is a device computation: it must run only when a monitor reads it."""
    schedule = nn.CosineDecayLR(0.0, 0.1, 10)
    evaluations = []
    original = type(schedule).construct

    def counting(self, step):
        evaluations.append(1)
        return original(self, step)

    monkeypatch.setattr(type(schedule), "construct", counting)
    monkeypatch.setattr(monitors.ReadsNothing, "seen", [])
    cb = MonitorCallback(
        {
            "interval": 100,
            "output_type": [],
            "monitored_metrics": ["loss"],
            "custom_monitor_callback": "tests.support.monitors.ReadsNothing",
        }
    )
    training.train([cb], steps=8, lr=schedule)
    baseline = len(evaluations)  # the optimizer's own, once per step
    assert monitors.ReadsNothing.seen == [(True, True)] * 8

    monkeypatch.setattr(monitors.ReadsLearningRate, "values", [])
    evaluations.clear()
    cb = MonitorCallback(
        {
            "interval": 100,
            "output_type": [],
            "monitored_metrics": ["loss"],
            "custom_monitor_callback": "tests.support.monitors.ReadsLearningRate",
        }
    )
    training.train([cb], steps=8, lr=schedule)
    assert len(evaluations) == baseline + 8  # one evaluation per read, none otherwise
    expected = [0.05 * (1 + math.cos(math.pi * step / 10)) for step in range(8)]
    assert monitors.ReadsLearningRate.values == pytest.approx(expected, rel=1e-5)


@pytest.mark.slow  # a real training
def test_alert_settings_given_while_alerts_are_off_are_named_once(tmp_path, caplog):
    config = {
        "interval": 2,
        "output_type": ["json_file"],
        "json_log_path": str(tmp_path / "m.json"),
        "alert_config": {"notify_run_end": True, "stall_timeout": 5},
    }
    with caplog.at_level(logging.WARNING, logger="otel_mindformers"):
        training.train([MonitorCallback(config)], steps=4)
    (said,) = [r.getMessage() for r in caplog.records if "enable_alert is off" in r.getMessage()]
    assert "alert_config.notify_run_end, alert_config.stall_timeout have no effect" in said


def test_a_flush_left_no_time_says_the_budget_was_spent_not_that_it_took_zero_seconds(caplog):
    from opentelemetry import metrics as otel_metrics
    from opentelemetry import trace as otel_trace

    from otel_mindformers.telemetry.providers import Telemetry

    release = threading.Event()

    class SlowProvider:
        def shutdown(self):
            release.wait(10)

    telemetry = Telemetry(otel_trace.NoOpTracer(), otel_metrics.NoOpMeter("t"), None, None, _owned=[SlowProvider()])
    with caplog.at_level(logging.WARNING, logger="otel_mindformers"):
        assert telemetry.close(0.0) is False
    release.set()
    messages = [r.getMessage() for r in caplog.records]
    assert any("got no time to flush" in m and "shutdown_timeout was used up" in m for m in messages), messages
    assert not any("within 0.0 s" in m for m in messages)
