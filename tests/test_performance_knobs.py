"""The knobs that keep fleet-scale export affordable: `step_spans` and `otlp.temporality`."""

from __future__ import annotations

import json
import time

import pytest
from mindspore.train import Callback
from opentelemetry.proto.metrics.v1 import metrics_pb2
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from otel_mindformers.config import ConfigError, load_monitor_config
from otel_mindformers.names import straggler_names as names

STEPS = 20


def _train_with_spans(step_spans, faults=None, slow=(), signal=False, wait=0.05) -> tuple[list, list[dict]]:
    """The step spans, and the JSON lines. The straggler signal is off unless
    asked: on a loaded machine, three windows of tiny steps whose waits between steps pass
    20 % of their wall are an "input-bound" episode, whose event on a step span that
    `step_spans` skips starts it (an anomaly gets its span): a step the test did not expect."""
    from otel_mindformers.runtime.callback import MonitorCallback
    from tests.support.training import train

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    config = {"interval": 1, "output_type": ["json_file"], "step_spans": step_spans, "stragglers": {"signal": signal}}
    callback = MonitorCallback(config, tracer_provider=provider)
    train([callback, WaitBetween(slow, wait)], steps=STEPS, faults=faults)
    spans = [span for span in exporter.get_finished_spans() if span.name == "mindformers.train.step"]
    with open("output/train_metric.json") as handle:
        lines = [json.loads(line) for line in handle]
    return spans, lines


def _steps(spans, event: str | None = None) -> list[int]:
    """The steps of these spans, or of those holding an event named `event`."""
    return sorted(
        s.attributes["training.step"] for s in spans if event is None or any(e.name == event for e in s.events)
    )


class WaitBetween(Callback):
    """A wait before each of `steps` (a loaded machine's, or a slow callback's), counted as
    the time between steps."""

    def __init__(self, steps, seconds):
        self.steps, self.seconds = set(steps), seconds

    def on_train_step_begin(self, run_context):
        if run_context.original_args()["cur_step_num"] in self.steps:
            time.sleep(self.seconds)


@pytest.mark.slow
def test_every_sampled_step_gets_a_span_by_default(workdir):
    spans, lines = _train_with_spans(True)
    assert _steps(spans) == list(range(1, STEPS + 1))
    assert len(lines) == STEPS


@pytest.mark.slow
def test_step_spans_every_n_keeps_the_last_and_nonfinite_steps(workdir):
    from tests.support.training import Faults

    # Steps 8-10 wait as a loaded machine's steps may: no span of theirs appears.
    spans, lines = _train_with_spans(6, faults=Faults(nan_at={19}), slow={8, 9, 10})
    assert _steps(spans) == [6, 12, 18, 19, 20]
    assert len(lines) == STEPS, "sampling spans never thins the metrics or the local outputs"


@pytest.mark.slow
def test_step_spans_every_n_keeps_a_sampled_last_step(workdir):
    """Step 20 is sampled on the cadence (interval 1), so only the run's end knows it was the
    last: its span comes then, with its own times."""
    spans, _ = _train_with_spans(7)
    assert _steps(spans) == [7, 14, 20]


@pytest.mark.slow
def test_a_skipped_step_with_a_straggler_episode_keeps_its_span(workdir):
    """Three windows input-bound (steps 8-10): the signal's event goes on step 10's span,
    which `step_spans: 6` would have skipped (docs/configuration.md: an anomaly gets its span)."""
    # Waits that pass a fifth of the window even when a loaded machine slows the steps; its own
    # gaps may start the episode a window early, which puts the event on step 9, or make an
    # episode of their own elsewhere: that step keeps its span too.
    spans, _ = _train_with_spans(6, slow={8, 9, 10}, signal=True, wait=0.5)
    with_event = _steps(spans, names.EVENT_STRAGGLER)
    assert set(with_event) & {9, 10}, with_event
    assert set(_steps(spans)) == {6, 12, 18, 20, *with_event}, _steps(spans)


@pytest.mark.slow
def test_step_spans_off_keeps_the_run_span(workdir):
    spans, lines = _train_with_spans(False)
    assert spans == []
    assert len(lines) == STEPS


@pytest.mark.parametrize("value", [0, -3, "some", 1.5])
def test_step_spans_rejects_bad_values(workdir, value):
    with pytest.raises(ConfigError, match="monitor_config.step_spans"):
        load_monitor_config({"step_spans": value})


@pytest.mark.slow
@pytest.mark.parametrize(
    ("temporality", "env", "expected"),
    [
        ("delta", None, metrics_pb2.AGGREGATION_TEMPORALITY_DELTA),
        ("cumulative", "delta", metrics_pb2.AGGREGATION_TEMPORALITY_CUMULATIVE),
        (None, "delta", metrics_pb2.AGGREGATION_TEMPORALITY_DELTA),
        (None, None, metrics_pb2.AGGREGATION_TEMPORALITY_CUMULATIVE),
    ],
)
def test_otlp_temporality(workdir, otlp_receiver, monkeypatch, temporality, env, expected):
    """The YAML key wins over OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE, which still
    applies when the key is unset; counters and the step histogram follow it."""
    from otel_mindformers.runtime.callback import MonitorCallback
    from tests.support.training import train

    if env is not None:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE", env)
    otlp = {"endpoint": otlp_receiver.grpc_endpoint, "export_interval": 60}
    if temporality is not None:
        otlp["temporality"] = temporality
    train([MonitorCallback({"interval": 1, "output_type": ["otlp"], "otlp": otlp})], steps=5)

    metrics = {
        metric.name: metric
        for request in otlp_receiver.metric_requests
        for rm in request.resource_metrics
        for sm in rm.scope_metrics
        for metric in sm.metrics
    }
    assert metrics["mindformers.train.step.duration"].histogram.aggregation_temporality == expected
    assert metrics["mindformers.train.steps"].sum.aggregation_temporality == expected


@pytest.mark.slow
def test_metrics_are_exported_every_export_interval_seconds(workdir, otlp_receiver):
    """`otlp.export_interval` is in seconds: a run of a few seconds at 1 s sends about one
    metrics request a second, and one more as it ends."""
    from otel_mindformers.runtime.callback import MonitorCallback
    from tests.support.training import Faults, train

    otlp = {"endpoint": otlp_receiver.grpc_endpoint, "export_interval": 1}
    started = time.monotonic()
    train(
        [MonitorCallback({"interval": 1, "output_type": ["otlp"], "otlp": otlp})],
        steps=6,
        faults=Faults(sleep_at={step: 0.5 for step in range(2, 7)}),
    )
    elapsed = time.monotonic() - started
    assert elapsed >= 2.5
    assert 2 <= len(otlp_receiver.metric_requests) <= elapsed + 2, (len(otlp_receiver.metric_requests), elapsed)
