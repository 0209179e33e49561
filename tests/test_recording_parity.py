"""A live run and the replay of its JSON lines produce the same telemetry, field by field.

Both go through `recording.measurements` / `recording.step_span`; this test holds them to
it at a real OTLP receiver: the step spans' names, attributes and status, and every metric
series' final state (gauges' last value, counters' totals, the histogram's count, sum and
buckets). Ids, time stamps and exemplars are the only differences allowed.
"""

from __future__ import annotations

import pytest

from otel_mindformers.analysis.replay import replay_otlp
from otel_mindformers.config import OtlpConfig
from otel_mindformers.names import semconv
from otel_mindformers.outputs.jsonl_reader import read_logs
from otel_mindformers.runtime.callback import MonitorCallback
from tests.support import training
from tests.support.otlp_receiver import OtlpReceiver
from tests.support.training import Faults


def _step_spans(receiver: OtlpReceiver) -> dict[int, tuple]:
    return {
        span.attributes[semconv.ATTR_STEP]: (span.name, span.attributes, span.status_code)
        for span in receiver.spans(semconv.SPAN_STEP)
    }


def _final_series(receiver: OtlpReceiver) -> dict[tuple, tuple]:
    """Per (metric, attributes): the state of its newest point."""
    newest: dict[tuple, object] = {}
    for point in sorted(receiver.points(), key=lambda p: p.time_unix_nano):
        if point.metric.startswith("mindformers.train"):
            newest[(point.metric, tuple(sorted(point.attributes.items())))] = point
    return {
        key: (point.unit, point.value, point.count, pytest.approx(point.sum) if point.sum else point.sum)
        for key, point in newest.items()
    }


@pytest.mark.slow
def test_replay_of_a_live_run_matches_its_live_export(workdir, monkeypatch):
    monkeypatch.setenv("RANK_ID", "0")
    monkeypatch.setenv("RANK_SIZE", "1")
    log = workdir / "live.json"
    with OtlpReceiver() as live:
        callback = MonitorCallback(
            {
                "interval": 3,
                "output_type": ["json_file", "otlp"],
                "json_log_path": str(log),
                "otlp": {"endpoint": live.grpc_endpoint, "export_interval": 60},
            }
        )
        # A NaN mid-run: counted as non-finite, an error status, and left out of the gauges.
        training.train([callback], steps=14, shape="tuple5", faults=Faults(nan_at={9}))
        live_spans, live_series = _step_spans(live), _final_series(live)

    with OtlpReceiver() as replayed:
        replay_otlp(read_logs([log]), OtlpConfig(endpoint=replayed.grpc_endpoint))
        replay_spans, replay_series = _step_spans(replayed), _final_series(replayed)

    assert sorted(live_spans) == [1, 3, 6, 9, 12, 14]
    assert replay_spans == live_spans
    assert any(status == 2 for _name, _attrs, status in live_spans.values())  # the NaN step
    names = {metric for metric, _attributes in live_series}
    assert {
        "mindformers.train.loss",
        "mindformers.train.nonfinite",
        "mindformers.train.step.duration",
        "mindformers.train.steps",
        "mindformers.train.overflow",
    } <= names
    assert replay_series == live_series
