"""AlertEngine: what it records (span events, status, log records, counters), early-stop
decisions, custom alerts, and the stall watchdog — on real SDK providers."""

import math
import os
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path

import pytest
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import InMemoryLogRecordExporter, SimpleLogRecordProcessor
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from otel_mindformers.config import load_monitor_config
from otel_mindformers.core.step_record import StepRecord
from otel_mindformers.job.identity import Identity
from otel_mindformers.outputs import diagnosis_file as records
from otel_mindformers.runtime.custom_monitors import BaseMonitor
from otel_mindformers.telemetry.providers import build_telemetry
from tests.support.alert_engine import engine_for
from tests.support.paths import REPO
from tests.support.webhook_receiver import WebhookReceiver

IDENTITY = Identity(rank=1, world_size=2, job_id="job-a", host_name="host-a")


pytestmark = pytest.mark.slow  # real training runs


class Harness:
    """An engine on real in-memory SDK pipelines."""

    def __init__(self, alert_section, *, enable_alert=True):
        self.config = load_monitor_config(
            {
                "output_type": [],
                "json_log_path": str(Path(tempfile.mkdtemp()) / "train_metric.json"),  # stack dumps go beside it
                "alert_config": {"enable_alert": enable_alert, "stall_timeout": None, **alert_section},
            }
        )
        self.spans = InMemorySpanExporter()
        self.logs = InMemoryLogRecordExporter()
        self.metrics = InMemoryMetricReader()
        tracer_provider = TracerProvider()
        tracer_provider.add_span_processor(SimpleSpanProcessor(self.spans))
        logger_provider = LoggerProvider()
        logger_provider.add_log_record_processor(SimpleLogRecordProcessor(self.logs))
        self.telemetry = build_telemetry(
            self.config.telemetry,
            IDENTITY,
            tracer_provider=tracer_provider,
            meter_provider=MeterProvider(metric_readers=[self.metrics]),
            logger_provider=logger_provider,
        )
        self.progress = types.SimpleNamespace(step=0, last_step_end=time.perf_counter())
        self.engine = engine_for(self.config, IDENTITY, self.telemetry, self.progress)

    def step(self, step, **values):
        """One sampled step inside a step span, as the callback does it; returns the stop reason."""
        self.progress.step, self.progress.last_step_end = step, time.perf_counter()
        span = self.telemetry.tracer.start_span("mindformers.train.step")
        record = StepRecord(step=step, epoch=1, rank=IDENTITY.rank, time_stamp=time.time(), values=values)
        reason = self.engine.evaluate(record, span)
        span.end()
        return reason

    def alert_counts(self):
        counts = {}
        data = self.metrics.get_metrics_data()
        for resource_metrics in data.resource_metrics if data else ():
            for scope_metrics in resource_metrics.scope_metrics:
                for metric in scope_metrics.metrics:
                    if metric.name == "mindformers.alerts":
                        for point in metric.data.data_points:
                            attrs = point.attributes
                            counts[(attrs["training.alert.rule"], attrs["training.alert.severity"])] = point.value
        return counts

    def log_records(self):
        return [data.log_record for data in self.logs.get_finished_logs()]


def test_off_means_no_engine():
    assert Harness({}, enable_alert=False).engine is None


def test_anomalous_step_gets_event_error_status_log_record_and_counter():
    h = Harness({"loss_threshold": 8.0})
    assert h.step(1, loss=2.0) is None
    assert h.step(2, loss=9.0) is None
    h.engine.shutdown(1.0)
    normal, anomalous = h.spans.get_finished_spans()
    assert normal.events == () and normal.status.status_code == StatusCode.UNSET
    (event,) = anomalous.events
    assert event.name == "mindformers.alert"
    assert dict(event.attributes) == {
        "training.alert.rule": "loss_threshold",
        "training.alert.severity": "warning",
        "training.alert.value": 9.0,
        "training.alert.threshold": 8.0,
        "message": "loss 9 > threshold 8",
    }
    assert anomalous.status.status_code == StatusCode.ERROR
    assert "loss_threshold" in anomalous.status.description
    (log,) = h.log_records()
    assert log.event_name == "mindformers.alert"
    assert log.severity_text == "WARNING"
    assert log.attributes["training.alert.rule"] == "loss_threshold"
    assert log.attributes["training.step"] == 2
    assert log.attributes["training.rank"] == 1
    assert "job-a" in log.body and "step 2" in log.body
    assert h.alert_counts() == {("loss_threshold", "warning"): 1}


def test_nonfinite_loss_stops_at_once_and_is_critical():
    h = Harness({})
    assert h.step(1, loss=1.0, grad_norm=1.0) is None
    reason = h.step(2, loss=math.nan, grad_norm=math.nan)
    h.engine.shutdown(1.0)
    assert reason == "non-finite loss (nan) at step 2"
    assert h.alert_counts() == {("nonfinite", "critical"): 1}
    rules = [(r.attributes["training.alert.rule"], r.severity_text) for r in h.log_records()]
    assert rules == [("nonfinite", "CRITICAL"), ("early_stop", "CRITICAL")]
    span = h.spans.get_finished_spans()[1]
    assert span.events[0].attributes["message"] == "loss is nan"
    assert "training.alert.value" not in span.events[0].attributes  # NaN is not an attribute value


def test_nonfinite_without_stop_then_stop_after_consecutive_anomalous_steps():
    h = Harness({"stop_on_nonfinite": False, "stop_after_anomalous_steps": 3})
    reasons = [h.step(s, loss=math.nan) for s in (1, 2, 3, 4)]
    h.engine.shutdown(1.0)
    assert reasons[:2] == [None, None]
    assert reasons[2] == "3 consecutive anomalous sampled steps, the last at step 3"
    assert reasons[3] == reasons[2]  # decided once, reported to every later call


def test_a_normal_step_resets_the_anomalous_streak():
    h = Harness({"loss_threshold": 5.0, "stop_after_anomalous_steps": 2})
    reasons = [h.step(s, loss=v) for s, v in enumerate([9.0, 1.0, 9.0, 1.0, 9.0, 9.0], start=1)]
    h.engine.shutdown(1.0)
    assert reasons[:5] == [None] * 5 and reasons[5].startswith("2 consecutive")


def test_a_resolved_notice_is_an_info_record_whatever_the_rules_severity():
    h = Harness({"loss_threshold": 5.0})
    h.step(1, loss=9.0)
    h.step(2, loss=1.0)
    h.engine.shutdown(1.0)
    records = [(r.attributes["training.alert.status"], r.severity_text) for r in h.log_records()]
    assert records == [("firing", "WARNING"), ("resolved", "INFO")]


def test_custom_monitor_alerts_through_the_same_engine():
    h = Harness({"alert_interval": 10})
    monitor = BaseMonitor(h.config)
    monitor.raise_alert("queue_depth", "nothing bound yet")  # before train begin: a no-op
    monitor.alert_engine = h.engine
    for step in (1, 5, 11):
        h.progress.step = step
        monitor.raise_alert("queue_depth", "data queue empty", value=0.0, threshold=1.0, severity="critical")
    h.engine.shutdown(1.0)
    assert h.alert_counts() == {("queue_depth", "critical"): 3}
    assert [r.attributes["training.step"] for r in h.log_records()] == [1, 11]
    with pytest.raises(ValueError, match="severity"):
        monitor.raise_alert("queue_depth", "x", severity="fatal")


def test_stall_watchdog_names_rank_and_last_step_then_resolves():
    with WebhookReceiver() as receiver:
        h = Harness({"stall_timeout": 0.3, "notifiers": [{"type": "webhook", "url": receiver.url()}]})
        h.progress.step, h.progress.last_step_end = 41, time.perf_counter()  # step 41 finished
        (stalled,) = receiver.wait_for(1)
        assert h.alert_counts() == {("stall", "critical"): 1}  # counted before it is sent
        h.progress.step, h.progress.last_step_end = 42, time.perf_counter()
        resolved = receiver.wait_for(2)[1]
        h.engine.shutdown(5.0)
        # No step after 42: a loaded host may reach shutdown after the watchdog fired again.
        firing = [r for r in receiver.requests if r.body["status"] == "firing"]
    assert stalled.body["rule"] == "stall" and stalled.body["status"] == "firing"
    assert stalled.body["severity"] == "critical" and stalled.body["step"] == 41
    assert "rank 1" in stalled.body["message"] and "stalled after step 41" in stalled.body["message"]
    assert stalled.body["threshold"] == 0.3 and stalled.body["value"] > 0.3
    assert (resolved.body["status"], resolved.body["step"]) == ("resolved", 42)
    assert h.alert_counts() == {("stall", "critical"): len(firing)}  # a resolve is no alert
    assert [r.body["step"] for r in firing[1:]] == [42] * (len(firing) - 1)


def test_watchdog_waits_for_the_first_finished_step():
    """The first step includes graph compilation: no stall alert before it finishes."""
    with WebhookReceiver() as receiver:
        h = Harness({"stall_timeout": 0.05, "notifiers": [{"type": "webhook", "url": receiver.url()}]})
        time.sleep(0.5)  # ten timeouts with no finished step
        h.engine.shutdown(5.0)
        assert receiver.requests == []
    assert h.alert_counts() == {}


def test_custom_alert_values_of_any_type_never_raise_and_infinity_is_kept():
    import mindspore as ms
    import numpy as np

    with WebhookReceiver() as receiver:
        h = Harness({"alert_interval": 1, "notifiers": [{"type": "webhook", "url": receiver.url()}]})
        monitor = BaseMonitor(h.config)
        monitor.alert_engine = h.engine
        values = [np.array([2.5]), ms.Tensor([3.5], ms.float32), np.float32(4.5), "5.5", np.zeros(3), "n/a"]
        for step, value in enumerate(values, start=1):
            h.progress.step = step
            monitor.raise_alert("custom", f"value {step}", value=value, threshold=math.inf)
        bodies = [r.body for r in receiver.wait_for(len(values))]
        h.engine.shutdown(5.0)
    assert [b["message"] for b in bodies] == [f"value {s}" for s in range(1, 7)]
    assert [b["value"] for b in bodies] == [2.5, 3.5, 4.5, 5.5, None, None]
    # inf cannot be strict JSON: null, and named as non-finite like the JSON log does.
    assert {(b["threshold"], tuple(b["nonfinite"])) for b in bodies} == {(None, ("threshold",))}
    logs = h.log_records()
    assert logs[0].attributes["training.alert.threshold"] == math.inf and "threshold: inf" in logs[0].body


def test_run_end_notices_are_off_by_default_and_sent_by_reporting_and_crashed_ranks():
    def notices(section, *calls):
        with WebhookReceiver() as receiver:
            h = Harness({**section, "notifiers": [{"type": "webhook", "url": receiver.url()}]})
            for call in calls:
                h.engine.notify_run_end(*call)
            h.engine.shutdown(5.0)
            return [
                (r.body["rule"], r.body["status"], r.body["severity"], r.body["step"], r.body["message"])
                for r in receiver.requests
            ]

    assert notices({}, ("completed", None, 20)) == []
    # IDENTITY is rank 1 and report_ranks defaults to [0]: only a crash is this rank's news.
    assert notices({"notify_run_end": True}, ("completed", None, 20), ("stopped", "loss spike", 20)) == []
    assert notices({"notify_run_end": True}, ("crashed", "RuntimeError: HCCL timeout", 17)) == [
        ("run_end", "crashed", "critical", 17, "run crashed after step 17: RuntimeError: HCCL timeout")
    ]


def test_run_end_notices_from_a_reporting_rank():
    with WebhookReceiver() as receiver:
        h = Harness({"notify_run_end": True, "notifiers": [{"type": "webhook", "url": receiver.url()}]})
        h.engine.shutdown(1.0)
        h.config.report_ranks = "all"
        h.engine = engine_for(h.config, IDENTITY, h.telemetry, h.progress)
        h.engine.notify_run_end("completed", None, 20)
        h.engine.notify_run_end("stopped", "3 consecutive anomalous sampled steps", 9)
        h.engine.shutdown(5.0)
        bodies = [r.body for r in receiver.requests]
    assert [(b["status"], b["severity"], b["message"]) for b in bodies] == [
        ("completed", "info", "run completed after step 20"),
        ("stopped", "warning", "run stopped early after step 9: 3 consecutive anomalous sampled steps"),
    ]
    assert [r.severity_text for r in h.log_records()] == ["INFO", "WARNING"]


CONSOLE_SCRIPT = """
import os, time, types
from otel_mindformers.alerts import AlertEngine
from otel_mindformers.config import load_monitor_config
from otel_mindformers.job.identity import Identity
from otel_mindformers.telemetry.providers import build_telemetry

config = load_monitor_config({"output_type": [], "json_log_path": "m.json",
                              "alert_config": {"enable_alert": True, "stall_timeout": 0.2}})
identity = Identity(rank=0, world_size=1, host_name="h")
progress = types.SimpleNamespace(step=0, last_step_end=time.perf_counter(), phase="step")
engine = AlertEngine.start(config.alert_config, identity, build_telemetry(config.telemetry, identity), progress,
                           job="job", reports_training=True, json_log_path=config.json_log_path)
progress.step, progress.last_step_end = 1, time.perf_counter()  # step 1 finished, then nothing
while not os.path.exists("diagnosis_rank_0.jsonl"):  # written when the stall is seen
    time.sleep(0.05)
progress.step, progress.last_step_end = 2, time.perf_counter()
engine.shutdown(2.0)
"""


def test_stall_and_its_resolved_notice_reach_the_console_without_logging_setup(tmp_path):
    """No logging configuration, as in a plain training script: Python's last-resort
    handler prints WARNING and above, and the resolved notice must be among them."""
    result = subprocess.run(
        [sys.executable, "-c", CONSOLE_SCRIPT],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert result.returncode == 0, result.stderr
    assert "[FIRING] stall" in result.stderr and "[RESOLVED] stall" in result.stderr


def test_the_watchdog_rearms_after_a_resume_for_a_second_stall_of_the_same_run():
    """Driven check by check (no thread, no sleeps): stall, its second threshold, resume,
    then a second stall gets both thresholds again."""
    import types

    from otel_mindformers.hangs.stall_watchdog import StallWatchdog

    timeout = 1.0
    progress = types.SimpleNamespace(step=0, last_step_end=time.perf_counter())
    calls = []
    watchdog = StallWatchdog(
        progress, timeout, lambda step, idle, threshold: calls.append(("stall", step, threshold)),
        lambda step: calls.append(("resume", step)),
    )  # fmt: skip

    def stalled_at(step):
        progress.step, progress.last_step_end = step, time.perf_counter() - 10 * timeout

    stalled_at(5)
    for _ in range(3):
        watchdog._check(final=False)
    progress.step, progress.last_step_end = 6, time.perf_counter()
    watchdog._check(final=False)
    stalled_at(9)
    for _ in range(3):
        watchdog._check(final=False)
    assert calls == [
        ("stall", 5, 1), ("stall", 5, 2), ("resume", 6),
        ("stall", 9, 1), ("stall", 9, 2),
    ]  # fmt: skip


def test_the_second_report_of_a_stall_comes_at_twice_the_timeout():
    """Driven check by check, as above: 1.5 timeouts idle is one report, 2.5 timeouts two."""
    import types

    from otel_mindformers.hangs.stall_watchdog import StallWatchdog

    timeout = 100.0  # the test's own time is nothing beside it

    def thresholds_reported(idle_timeouts):
        progress = types.SimpleNamespace(step=0, last_step_end=time.perf_counter())
        calls = []
        watchdog = StallWatchdog(progress, timeout, lambda step, idle, threshold: calls.append(threshold), print)
        progress.step, progress.last_step_end = 5, time.perf_counter() - idle_timeouts * timeout
        for _ in range(3):
            watchdog._check(final=False)
        return calls

    assert thresholds_reported(0.5) == []
    assert thresholds_reported(1.5) == [1]
    assert thresholds_reported(2.5) == [1, 2]


def test_a_stall_is_seen_within_a_tenth_of_the_timeout_more():
    """The watchdog looks ten times per timeout, so it sees a stall within 0.4 s of the 4 s
    timeout here (2 s more allowed for a loaded host); looking once per timeout, it would see
    this one, whose step finishes just after its first look would be, 3.5 s late."""
    import threading
    import types

    from otel_mindformers.hangs.stall_watchdog import StallWatchdog

    progress = types.SimpleNamespace(step=0, last_step_end=time.perf_counter())
    seen = threading.Event()
    idle_at_report = []

    def on_stall(step, idle, threshold):
        idle_at_report.append(idle)
        seen.set()

    watchdog = StallWatchdog(progress, 4.0, on_stall, lambda step: None).start()
    # Step 1 finishes 0.5 s after the watchdog starts (a clock reading ahead of now).
    progress.step, progress.last_step_end = 1, time.perf_counter() + 0.5
    assert seen.wait(30), "no stall reported"
    watchdog.stop(5.0)
    assert 4.0 < idle_at_report[0] < 6.5  # once per timeout: 7.5


def test_a_second_stall_after_a_resume_alerts_again():
    with WebhookReceiver() as receiver:
        h = Harness({"stall_timeout": 0.3, "notifiers": [{"type": "webhook", "url": receiver.url()}]})
        h.progress.step, h.progress.last_step_end = 41, time.perf_counter()
        receiver.wait_for(1)  # the first stall
        h.progress.step, h.progress.last_step_end = 42, time.perf_counter()  # resumes, then stalls again
        bodies = [r.body for r in receiver.wait_for(3)]
        h.engine.shutdown(5.0)
    assert [(b["status"], b["step"]) for b in bodies[:3]] == [("firing", 41), ("resolved", 42), ("firing", 42)]
    assert h.alert_counts() == {("stall", "critical"): 2}
    # Each stall dumped the stacks again (at its first threshold at least).
    dumps = [r for r in records.read(h.engine.stacks.path) if r["kind"] == records.KIND_STACKS]
    assert {r["step"] for r in dumps if r["reason"] == "stall"} == {41, 42}
