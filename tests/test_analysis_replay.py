"""Replay on fixture logs: ids, alerts, restarts and cumulative metrics as the live pipeline has them."""

from __future__ import annotations

import json

import pytest
from opentelemetry.sdk.resources import Resource
from opentelemetry.trace import StatusCode

from otel_mindformers.analysis.replay import build_metrics, build_spans, replay_otlp
from otel_mindformers.config import OtlpConfig
from otel_mindformers.names import job as job_names
from otel_mindformers.names import semconv
from otel_mindformers.names import training as tm
from otel_mindformers.outputs.jsonl_reader import as_records, read_logs
from otel_mindformers.telemetry.step_ids import job_step_ids, job_trace_key
from tests.support.paths import LOG_FIXTURES as FIXTURES

pytestmark = pytest.mark.analysis


def spans_of(name: str):
    (series,) = read_logs([FIXTURES / name])
    return series, build_spans(series, as_records(series), "run-x", lambda job: (Resource.create({}), {}))


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


def _job_lines(path, rank: int, attempts: dict[int, range], job_id: str = "job-7") -> None:
    """A rank's log of a restarted job: each attempt's steps, every step sampled, lines naming their job."""
    lines = [
        {"time_stamp": 1000.0 + 10 * attempt + step, "step": step, "epoch": 1, "rank": rank, "loss": 1.0 / step,
         "train_per_step_time": 100.0, "job": {"id": job_id, "attempt": attempt}}
        for attempt, steps in attempts.items() for step in steps
    ]  # fmt: skip
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))


def test_an_alert_after_the_last_step_goes_on_the_last_attempts_run_span(tmp_path):
    """A restarted job's log ends with an alert past its last step line (the run stopped on
    it): the event is on the run span of the attempt that logged it, the last."""
    log = tmp_path / "train_metric.json"
    _job_lines(log, 0, {1: range(1, 4), 2: range(2, 5)})
    with log.open("a") as lines:
        lines.write(json.dumps({"time_stamp": 1030.0, "step": 5, "alert": "loss 9.3 above loss_threshold 8.0"}) + "\n")
    (series,) = read_logs([log])
    spans = build_spans(series, as_records(series), "run-x", lambda job: (Resource.create({}), {"attempt": job[1]}))
    runs = [s for s in spans if s.name == semconv.SPAN_RUN]
    assert [(run.attributes["attempt"], [e.name for e in run.events]) for run in runs] == [
        (1, []),
        (2, [semconv.EVENT_ALERT]),
    ]


@pytest.mark.slow  # a real OTLP receiver
def test_replay_names_the_lines_job_and_attempt_and_puts_each_job_step_in_its_live_trace(tmp_path, otlp_receiver):
    """Two ranks of job-7: attempt 1 logged steps 1..3, attempt 2 resumed at 2 and logged 2..4.
    Replayed, each attempt has the live resource (the lines' job id and attempt, not the run
    id), its own run span and counters; each job step is one trace across the ranks, under
    one `mindformers.job.step` root from rank 0, at the ids the live ranks derive."""
    for rank in (0, 1):
        _job_lines(tmp_path / f"train_metric_rank_{rank}.json", rank, {1: range(1, 4), 2: range(2, 5)})
    config = OtlpConfig(endpoint=otlp_receiver.http_endpoint, protocol="http/protobuf")
    replay_otlp(read_logs([tmp_path]), config, run_id="run-x")

    steps = otlp_receiver.spans(semconv.SPAN_STEP)
    assert len(steps) == 2 * (3 + 3)
    assert {(s.resource[semconv.ATTR_JOB_ID], s.resource[job_names.ATTR_ATTEMPT]) for s in steps} == {
        ("job-7", 1), ("job-7", 2)
    }  # fmt: skip
    roots = {(int(r.trace_id, 16), int(r.span_id, 16)): r for r in otlp_receiver.spans(semconv.SPAN_JOB_STEP)}
    assert len(roots) == 6 and {r.resource[semconv.ATTR_RANK] for r in roots.values()} == {0}
    for span in steps:
        attempt = span.resource[job_names.ATTR_ATTEMPT]
        window = span.attributes[semconv.ATTR_STEP] - span.attributes[semconv.ATTR_STEPS_IN_WINDOW]
        ids = job_step_ids(job_trace_key("job-7", attempt), window)
        assert (int(span.trace_id, 16), int(span.parent_span_id, 16)) == ids
        root = roots[ids]
        assert root.attributes[job_names.ATTR_ATTEMPT] == attempt and root.attributes[semconv.ATTR_JOB_ID] == "job-7"
    runs = otlp_receiver.spans(semconv.SPAN_RUN)
    assert sorted((r.resource[semconv.ATTR_RANK], r.resource[job_names.ATTR_ATTEMPT]) for r in runs) == [
        (0, 1), (0, 2), (1, 1), (1, 2)
    ]  # fmt: skip
    counted = [p for p in otlp_receiver.points(tm.STEPS.name) if p.resource[semconv.ATTR_RANK] == 0]
    by_attempt = {a: [p.value for p in counted if p.resource[job_names.ATTR_ATTEMPT] == a] for a in (1, 2)}
    assert by_attempt == {1: [1, 2, 3], 2: [1, 2, 3]}, "each attempt's counters start at its own process's start"


@pytest.mark.slow  # a real OTLP receiver
def test_lines_without_a_job_keep_the_run_id_as_the_job(tmp_path, otlp_receiver):
    log = tmp_path / "train_metric.json"
    log.write_text("".join(json.dumps({"time_stamp": 1000.0 + s, "step": s, "rank": 0}) + "\n" for s in (1, 2)))
    replay_otlp(
        read_logs([log]), OtlpConfig(endpoint=otlp_receiver.http_endpoint, protocol="http/protobuf"), run_id="r"
    )
    spans = otlp_receiver.spans()
    assert {s.resource[semconv.ATTR_JOB_ID] for s in spans} == {"r"}
    assert all(job_names.ATTR_ATTEMPT not in s.resource for s in spans)
    assert otlp_receiver.spans(semconv.SPAN_JOB_STEP) == [] and all(s.parent_span_id == "" for s in spans)
