"""Replay on fixture logs: ids, alerts, restarts and cumulative metrics as the live pipeline has them."""

from __future__ import annotations

import json

import pytest
from opentelemetry.sdk.resources import Resource
from opentelemetry.trace import StatusCode

from otel_mindformers.analysis.replay import build_metrics, build_spans, replay_otlp
from otel_mindformers.config import OtlpConfig
from otel_mindformers.names import semconv
from otel_mindformers.names import training as tm
from otel_mindformers.outputs.jsonl_reader import as_records, read_logs
from tests.support.paths import LOG_FIXTURES as FIXTURES

pytestmark = pytest.mark.analysis


def spans_of(name: str):
    (series,) = read_logs([FIXTURES / name])
    return series, build_spans(series, as_records(series), "run-x", Resource.create({}), {})


def metric_points(series) -> dict[str, list]:
    points: dict[str, list] = {}
    for data in build_metrics(as_records(series), 0, Resource.create({})):
        for metric in data.resource_metrics[0].scope_metrics[0].metrics:
            points.setdefault(metric.name, []).extend(metric.data.data_points)
    return points


def test_alert_lines_become_events_and_error_status_on_their_step():
    _, spans = spans_of("mixed_writers.json")
    run, *steps = spans
    (alerted,) = [s for s in steps if s.events]
    assert alerted.attributes[semconv.ATTR_STEP] == 20
    assert [e.name for e in alerted.events] == [semconv.EVENT_ALERT]
    assert alerted.status.status_code is StatusCode.ERROR
    assert alerted.status.description == "loss 9.3 above loss_threshold 8.0"
    (nonfinite,) = [s for s in steps if s.attributes[semconv.ATTR_STEP] == 30]
    assert nonfinite.status.description == "non-finite loss"
    assert tm.BY_KEY[tm.LOSS].span_attribute not in nonfinite.attributes
    assert run.events == ()


def test_restarted_steps_get_their_own_ids_and_counters_start_again():
    series, spans = spans_of("gap_and_restart.json")
    steps = spans[1:]
    by_step: dict[int, set] = {}
    for span in steps:
        by_step.setdefault(span.attributes[semconv.ATTR_STEP], set()).add(span.context.span_id)
    assert len(by_step[1]) == 2 and len(by_step[10]) == 2  # logged twice, two distinct spans
    assert len({s.context.trace_id for s in steps}) == len(steps)
    counted = metric_points(series)[tm.STEPS.name]
    lines = [json.loads(line) for line in (FIXTURES / "gap_and_restart.json").read_text().splitlines()]
    assert [p.time_unix_nano for p in counted] == [round(line["time_stamp"] * 1e9) for line in lines]
    # Cumulative from each start: 1, +9, +10, +10, +40, +10 | restart: 1, +9
    assert [p.value for p in counted] == [1, 10, 20, 30, 70, 80, 1, 10]
    assert counted[6].start_time_unix_nano > counted[5].time_unix_nano


def test_step_duration_histogram_is_cumulative_in_seconds():
    (series,) = read_logs([FIXTURES / "rotated"])
    (last,) = metric_points(series)[tm.instrument_name(tm.STEP_TIME)][-1:]
    assert last.count == 60 and abs(last.sum - 60 * 0.05) < 1e-9
    assert last.bucket_counts[list(tm.STEP_DURATION_BUCKETS).index(0.05)] == 60  # 0.05 s sits in (0.025, 0.05]


@pytest.mark.slow
def test_ids_do_not_depend_on_the_order_files_are_given(otlp_receiver):
    config = OtlpConfig(endpoint=otlp_receiver.http_endpoint, protocol="http/protobuf")
    forward = read_logs([FIXTURES / "multirank"])
    replay_otlp(forward, config, run_id="r")
    first = sorted((s.trace_id, s.span_id) for s in otlp_receiver.spans())
    otlp_receiver.trace_requests.clear()
    replay_otlp(list(reversed(forward)), config, run_id="r")
    assert sorted((s.trace_id, s.span_id) for s in otlp_receiver.spans()) == first


@pytest.mark.slow  # the exporter's own retries before it gives up
def test_a_collector_that_is_not_there_is_one_error_that_does_not_promise_a_retry():
    from otel_mindformers.analysis.replay import ReplayError
    from tests.support.instrumented import free_port

    config = OtlpConfig(endpoint=f"http://127.0.0.1:{free_port()}", protocol="grpc")
    with pytest.raises(ReplayError) as raised:
        replay_otlp(read_logs([FIXTURES / "multirank"]), config, run_id="r")
    said = str(raised.value)
    assert said.startswith("sending the spans of rank 0 to http://127.0.0.1:") and "failed: " in said
    assert "UNAVAILABLE" in said and "retrying" not in said


def test_replayed_tensorboard_shows_a_resumed_runs_steps_once(tmp_path):
    """Steps 1..5, then a resume from step 3 logging 4..8 in the same file: TensorBoard reads
    each step once, the resumed run's, as the live output's restart marker makes it."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from otel_mindformers.analysis.replay import replay_tensorboard

    log = tmp_path / "train_metric.json"
    lines = [
        {"time_stamp": float(step), "step": step, "epoch": 1, "rank": 0, "loss": step + 0.1} for step in range(1, 6)
    ]
    lines += [
        {"time_stamp": 10.0 + step, "step": step, "epoch": 1, "rank": 0, "loss": step + 0.5} for step in range(4, 9)
    ]
    log.write_text("".join(json.dumps(line) + "\n" for line in lines))
    replay_tensorboard(read_logs([log]), tmp_path / "tb")
    (rank_dir,) = (tmp_path / "tb").iterdir()
    events = EventAccumulator(str(rank_dir))
    events.Reload()
    shown = [(e.step, round(e.value, 3)) for e in events.Scalars("loss")]
    assert shown == [(1, 1.1), (2, 2.1), (3, 3.1), (4, 4.5), (5, 5.5), (6, 6.5), (7, 7.5), (8, 8.5)]
