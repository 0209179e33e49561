"""`otel-mindformers replay`: send a recorded run to an OTLP endpoint or a TensorBoard folder.

An air-gapped run only leaves JSON lines; replay turns them into what the live callback
would have sent, with the original time stamps:
- per series and attempt a run span (`mindformers.train`), and per record a step span
  (`mindformers.train.step`) linked to it, as the callback does; lines that name their job
  (id and attempt) give the live resource and the live traces: one per job step across the
  ranks, under its `mindformers.job.step` root (telemetry/step_ids.py), and lines without
  one a trace per step span; attributes, status and alert events as live;
- the training metrics as OTLP points stamped with each record's time (the SDK's
  instruments always stamp "now", so the points are built as SDK export data and handed to
  the official OTLP exporters, which do the encoding and transport);
- or TensorBoard scalars with the original steps and wall times.

Replay is idempotent. Span ids are derived from the run id, the series, the step and the
step's occurrence (a restarted run logs a step twice), trace ids from those too or from the
job step (its job id, attempt and step), so sending the same logs
again yields the same ids, which trace backends treat as the same spans; metric points
repeat the same series at the same time stamps with the same values, which metric
backends store once. TensorBoard output goes to one fixed file name per rank, replaced
on every replay.
"""

from __future__ import annotations

import bisect
import hashlib
import math
import os
import re
import shutil
import tempfile
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    Gauge,
    Histogram,
    HistogramDataPoint,
    Metric,
    MetricExportResult,
    MetricsData,
    NumberDataPoint,
    ResourceMetrics,
    ScopeMetrics,
    Sum,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.trace.export import SpanExportResult
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, Status, StatusCode, TraceFlags

from otel_mindformers.config import OtlpConfig
from otel_mindformers.core import measurements
from otel_mindformers.core.step_record import StepRecord
from otel_mindformers.job.identity import Identity
from otel_mindformers.names import job as job_names
from otel_mindformers.names import semconv
from otel_mindformers.names import training as tm
from otel_mindformers.names.semconv import DEFAULT_SERVICE_NAME
from otel_mindformers.names.spec import Kind, MetricSpec
from otel_mindformers.outputs.jsonl_reader import AlertMark, AnalysisError, Series, as_records
from otel_mindformers.outputs.runs import set_aside_stamp
from otel_mindformers.telemetry.export_errors import ExportErrorReporter
from otel_mindformers.telemetry.providers import otlp_exporters
from otel_mindformers.telemetry.step_ids import job_step_ids, job_trace_key
from otel_mindformers.version import __version__

SPANS_PER_EXPORT = 512
RECORDS_PER_EXPORT = 500
TENSORBOARD_FILE = "events.out.tfevents.0.otel-mindformers-replay"

_SCOPE = InstrumentationScope(semconv.INSTRUMENTATION_NAME, __version__)
_SAMPLED = TraceFlags(TraceFlags.SAMPLED)


class ReplayError(AnalysisError):
    """The target refused or could not be reached; the message names it."""


@dataclass(frozen=True)
class ReplayResult:
    run_id: str | None  # None for TensorBoard, which has no ids
    series: int
    records: int
    spans: int
    points: int
    skipped: int  # records without a time stamp


# --- identity of what is sent ------------------------------------------------------------------


def default_run_id(series: Sequence[Series]) -> str:
    """The run's first time stamp: stable across replays, and across lines appended later."""
    stamps = [p.time_stamp for s in series for p in s.points if p.time_stamp is not None]
    if not stamps:
        raise ReplayError("no record has a time_stamp: nothing can be placed in time")
    return f"run-{min(stamps):.6f}"


def _span_context(*parts: object) -> SpanContext:
    """Trace and span id from one digest of what the span describes (0 is the invalid id)."""
    digest = hashlib.sha256("/".join(str(p) for p in parts).encode()).digest()
    return SpanContext(
        trace_id=int.from_bytes(digest[:16], "big") or 1,
        span_id=int.from_bytes(digest[16:24], "big") or 1,
        is_remote=False,
        trace_flags=_SAMPLED,
    )


def _ns(seconds: float) -> int:
    return int(round(seconds * 1e9))


def _identity_attributes(series: Series, run_id: str, world_size: int, job: Job | None) -> dict[str, Any]:
    """What the logs tell of the rank's identity (host and device were not logged): the job id
    and attempt its lines carry (`job`), as the live run's resource names them; the run id
    for lines without one."""
    rank = series.rank or 0
    job_id = job[0] if job else run_id
    attributes: dict[str, Any] = {
        "service.instance.id": Identity(rank=rank, world_size=world_size, job_id=job_id).instance_id,
        semconv.ATTR_RANK: rank,
        semconv.ATTR_WORLD_SIZE: world_size,
        semconv.ATTR_JOB_ID: job_id,
    }
    if job:
        attributes[job_names.ATTR_ATTEMPT] = job[1]
    return attributes


def _world_size(series: Sequence[Series]) -> int:
    ranks = [s.rank for s in series if s.rank is not None]
    return max(ranks) + 1 if ranks else 1


# --- spans -------------------------------------------------------------------------------------


Job = tuple[str, int]  # a line's job id and attempt number


def _job_of(record: StepRecord) -> Job | None:
    return (str(record.job["id"]), int(record.job["attempt"])) if record.job else None  # type: ignore[call-overload]


def attempts(records: list[StepRecord]) -> list[list[StepRecord]]:
    """The records cut where the lines' job or attempt changes: live, each attempt is a process
    of its own (its resource, its run span, its counters from zero)."""
    parts: list[list[StepRecord]] = []
    for record in records:
        if parts and _job_of(parts[-1][0]) == _job_of(record):
            parts[-1].append(record)
        else:
            parts.append([record])
    return parts


def build_spans(
    series: Series,
    records: list[StepRecord],
    run_id: str,
    identity_of: Callable[[Job | None], tuple[Resource, dict[str, Any]]],
    roots: set[tuple[bytes, int]] | None = None,
) -> list[ReadableSpan]:
    """Per attempt a run span, and one step span per record, with ids derived from what they
    describe: the run id, the series (its label: the rank, or the file when ranks repeat),
    the step and how many times that step was logged before. A record whose line names its
    job and attempt goes into its job step's trace, as live (telemetry/step_ids.py), under
    the job step's root, which the first series to reach it emits (`roots`: the job steps
    emitted so far; the caller goes through the series lowest rank first, as live the lowest
    rank emits it). `identity_of(job)`: the resource and run span attributes of an attempt."""
    # An alert belongs to the first record at or after its step (a stall fires between
    # samples); alerts after the last record, or without a step, go on the last run span.
    pending = sorted((a for a in series.alerts if a.step is not None), key=lambda a: a.step or 0)
    roots = set() if roots is None else roots
    spans: list[ReadableSpan] = []
    seen: dict[int, int] = {}
    parts = attempts(records)
    for index, part in enumerate(parts):
        job = _job_of(part[0])
        resource, run_attributes = identity_of(job)
        run_context = _span_context(run_id, series.label, "run", *(job or ()))
        job_key = job_trace_key(*job) if job else None
        steps: list[ReadableSpan] = []
        for record in part:
            occurrence = seen[record.step] = seen.get(record.step, -1) + 1
            alerts = []
            while pending and (pending[0].step or 0) <= record.step:
                alerts.append(pending.pop(0))
            fields = measurements.step_span(record)
            context, parent = _span_context(run_id, series.label, record.step, occurrence), None
            if job_key is not None:
                trace_id, root_id = job_step_ids(job_key, record.step - record.steps_in_window)
                context = SpanContext(trace_id, context.span_id, is_remote=False, trace_flags=_SAMPLED)
                parent = SpanContext(trace_id, root_id, is_remote=True, trace_flags=_SAMPLED)
                if (job_key, trace_id) not in roots:
                    roots.add((job_key, trace_id))
                    steps.append(_root_span(parent, resource, record, fields, run_attributes))
            steps.append(
                ReadableSpan(
                    name=fields.name,
                    context=context,
                    parent=parent,
                    resource=resource,
                    attributes=fields.attributes,
                    events=[_alert_event(a, record.time_stamp) for a in alerts],
                    links=[Link(run_context)],
                    status=_status(fields.status, alerts),
                    start_time=_ns(fields.start_time),
                    end_time=_ns(fields.end_time),
                    instrumentation_scope=_SCOPE,
                )
            )
        leftover = pending + [a for a in series.alerts if a.step is None] if index == len(parts) - 1 else []
        run = ReadableSpan(
            name=semconv.SPAN_RUN,
            context=run_context,
            resource=resource,
            attributes={**run_attributes, semconv.ATTR_STEP: part[-1].step},
            events=[_alert_event(a, part[-1].time_stamp) for a in leftover],
            start_time=_ns(measurements.span_start(part[0])),
            end_time=_ns(part[-1].time_stamp),
            instrumentation_scope=_SCOPE,
        )
        spans += [run, *steps]
    return spans


def _root_span(
    context: SpanContext, resource: Resource, record: StepRecord, fields: Any, run_attributes: dict[str, Any]
) -> ReadableSpan:
    """The job step's root, with this rank's step times (runtime/pipeline.py `_emit_root`)."""
    named = (semconv.ATTR_JOB_ID, job_names.ATTR_ATTEMPT, semconv.ATTR_WORLD_SIZE)
    return ReadableSpan(
        name=semconv.SPAN_JOB_STEP,
        context=SpanContext(context.trace_id, context.span_id, is_remote=False, trace_flags=_SAMPLED),
        resource=resource,
        attributes={semconv.ATTR_STEP: record.step, **{k: run_attributes[k] for k in named if k in run_attributes}},
        start_time=_ns(fields.start_time),
        end_time=_ns(fields.end_time),
        instrumentation_scope=_SCOPE,
    )


def _alert_event(alert: AlertMark, fallback_time: float) -> Event:
    attributes: dict[str, Any] = {}
    if alert.step is not None:
        attributes[semconv.ATTR_STEP] = alert.step
    if alert.rule is not None:
        attributes[semconv.ATTR_ALERT_RULE] = alert.rule
    return Event(
        semconv.EVENT_ALERT,
        attributes=attributes,
        timestamp=_ns(alert.time_stamp if alert.time_stamp is not None else fallback_time),
    )


def _status(status: Status, alerts: list[AlertMark]) -> Status:
    """The live status (non-finite values), plus the alerts the log recorded for the step."""
    problems = [status.description or ""] if status.status_code is StatusCode.ERROR else []
    problems += [alert.describe() for alert in alerts]
    return Status(StatusCode.ERROR, "; ".join(problems)) if problems else status


# --- metrics -----------------------------------------------------------------------------------


def build_metrics(records: list[StepRecord], rank: int, resource: Resource) -> list[MetricsData]:
    """What the live instruments would have exported, one point per record at its time.

    The measurements are the live ones (recording.measurements); here they are aggregated
    as the SDK would: gauges keep the last value, counters and the histogram are cumulative
    from the series' first record, and a restart (the step goes back) starts them again,
    as a restarted process would.
    """
    return [
        MetricsData([ResourceMetrics(resource, [ScopeMetrics(_SCOPE, metrics, "")], "")])
        for metrics in _metric_chunks(records, {semconv.ATTR_RANK: rank})
    ]


def _attribute_key(attributes: Any) -> tuple:
    return tuple(sorted(attributes.items()))


@dataclass
class _HistogramState:
    bounds: tuple[float, ...] = tm.STEP_DURATION_BUCKETS  # the live instrument's (HISTOGRAM_BUCKETS)
    buckets: list[int] = field(default_factory=list)
    count: int = 0
    sum: float = 0.0
    min: float = math.inf
    max: float = -math.inf

    def observe(self, value: float) -> None:
        if not self.buckets:
            self.buckets = [0] * (len(self.bounds) + 1)
        # Explicit buckets are (lower, upper]: bisect_left finds the first bound >= value.
        self.buckets[bisect.bisect_left(self.bounds, value)] += 1
        self.count += 1
        self.sum += value
        self.min, self.max = min(self.min, value), max(self.max, value)


@dataclass
class _Cumulative:
    """Running totals since the series (or a restart) began, as a live process keeps them."""

    start_ns: int
    totals: dict[tuple, float] = field(default_factory=dict)
    histograms: dict[tuple, _HistogramState] = field(default_factory=dict)


@dataclass
class _Batch:
    """The points of up to RECORDS_PER_EXPORT records, by instrument."""

    points: dict[str, list[Any]] = field(default_factory=dict)

    def add(self, measurement: measurements.Measurement, state: _Cumulative, now: int) -> None:
        spec, attrs = measurement.spec, dict(measurement.attributes)
        key = (spec.name, _attribute_key(attrs))
        if spec.kind is Kind.GAUGE:
            point: Any = NumberDataPoint(attrs, now, now, measurement.value)
        elif spec.kind is Kind.COUNTER:
            state.totals[key] = total = state.totals.get(key, 0) + measurement.value
            point = NumberDataPoint(attrs, state.start_ns, now, total)
        else:
            histogram = state.histograms.setdefault(
                key, _HistogramState(tm.HISTOGRAM_BUCKETS.get(spec.name, tm.STEP_DURATION_BUCKETS))
            )
            histogram.observe(measurement.value)
            point = HistogramDataPoint(
                attrs,
                state.start_ns,
                now,
                histogram.count,
                histogram.sum,
                list(histogram.buckets),
                list(histogram.bounds),
                histogram.min,
                histogram.max,
            )
        self.points.setdefault(spec.name, []).append(point)

    def metrics(self) -> list[Metric]:
        out = []
        for name, points in self.points.items():
            spec = _SPECS[name]
            if spec.kind is Kind.GAUGE:
                data: Any = Gauge(points)
            elif spec.kind is Kind.COUNTER:
                data = Sum(points, AggregationTemporality.CUMULATIVE, is_monotonic=True)
            else:
                data = Histogram(points, AggregationTemporality.CUMULATIVE)
            out.append(Metric(spec.name, spec.description, spec.unit, data))
        return out


_SPECS: dict[str, MetricSpec] = {spec.name: spec for spec in tm.INSTRUMENTS}


def _metric_chunks(records: list[StepRecord], attrs: dict[str, Any]) -> Iterator[list[Metric]]:
    batch = _Batch()
    state: _Cumulative | None = None
    for index, record in enumerate(records):
        now = _ns(record.time_stamp)
        if state is None or record.step <= records[index - 1].step:
            state = _Cumulative(_ns(measurements.span_start(record)))
        for measurement in measurements.measurements(record, attrs):
            batch.add(measurement, state, now)
        if (index + 1) % RECORDS_PER_EXPORT == 0 or index == len(records) - 1:
            yield batch.metrics()
            batch = _Batch()


# --- targets -----------------------------------------------------------------------------------


def replay_otlp(
    series: Sequence[Series],
    otlp: OtlpConfig,
    *,
    run_id: str | None = None,
    service_name: str | None = None,
) -> ReplayResult:
    """Send every series through the official OTLP exporters; ReplayError if one fails."""
    run_id = run_id or default_run_id(series)
    service = service_name or os.environ.get("OTEL_SERVICE_NAME") or DEFAULT_SERVICE_NAME
    world = _world_size(series)
    span_exporter, metric_exporter, log_exporter = otlp_exporters(otlp)
    # The exporters' own log lines (one per attempt and retry) become the reason in our one error.
    failures = ExportErrorReporter(
        otlp.endpoint or "the OTEL_EXPORTER_OTLP_* endpoint", secrets=otlp.headers.values(), announce=False
    ).install()
    target = failures.destination
    sent_spans = sent_points = records_total = skipped = 0
    roots: set[tuple[bytes, int]] = set()
    try:
        for one in sorted(series, key=lambda one: one.rank or 0):  # the lowest rank emits a job step's root
            records = as_records(one)
            records_total += len(records)
            skipped += len(one.points) - len(records)

            def identity_of(job: Job | None, one: Series = one) -> tuple[Resource, dict[str, Any]]:
                identity = _identity_attributes(one, run_id, world, job)
                return Resource.create({"service.name": service, **identity}), identity

            built = build_spans(one, records, run_id, identity_of, roots)
            for start in range(0, len(built), SPANS_PER_EXPORT):
                batch = built[start : start + SPANS_PER_EXPORT]
                if span_exporter.export(batch) is not SpanExportResult.SUCCESS:
                    raise ReplayError(_refused("spans", one, target, failures.first_failure))
                sent_spans += len(batch)
            for part in attempts(records):
                resource, _ = identity_of(_job_of(part[0]))
                for data in build_metrics(part, one.rank or 0, resource):
                    if metric_exporter.export(data) is not MetricExportResult.SUCCESS:
                        raise ReplayError(_refused("metrics", one, target, failures.first_failure))
                    sent_points += _point_count(data)
    finally:
        for exporter in (span_exporter, metric_exporter, log_exporter):
            exporter.shutdown()
        failures.uninstall()
    return ReplayResult(run_id, len(series), records_total, sent_spans, sent_points, skipped)


# The exporter's line says what it would do next; the command stops instead.
_RETRYING = re.compile(r",? retrying in [0-9.]+ ?s\.?")


def _refused(what: str, series: Series, target: str, reason: str | None) -> str:
    said = _RETRYING.sub(".", reason) if reason else "the exporter gave no reason"
    return f"sending the {what} of {series.label} to {target} failed: {said}"


def _point_count(data: MetricsData) -> int:
    return sum(
        len(metric.data.data_points)
        for resource_metrics in data.resource_metrics
        for scope_metrics in resource_metrics.scope_metrics
        for metric in scope_metrics.metrics
    )


def replay_tensorboard(series: Sequence[Series], directory: str | Path) -> ReplayResult:
    """Scalars under `<directory>/rank_<x>/` (the live layout; a run set aside by a later one
    under `rank_<x>/<stamp>/`), written by the live sink.

    Each rank gets one event file with a fixed name, replaced whole: replaying again gives
    the same file, not a second copy of every point.
    """
    from otel_mindformers.outputs.tensorboard import TensorBoardSink

    directory = Path(directory)
    records_total = skipped = points = 0
    current_runs = Counter(one.rank for one in series if _set_aside_stamp(one) is None)
    for one in series:
        records = as_records(one)
        records_total += len(records)
        skipped += len(one.points) - len(records)
        target = directory / _tensorboard_folder(one, current_runs)
        target.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".replay-", dir=target))
        try:
            sink = TensorBoardSink(staging)
            _write_with_restarts(sink, records)
            points += sum(len(record.values) + len(record.device) for record in records)
            sink.close()
            (written,) = staging.glob("events.out.tfevents.*")
            os.replace(written, target / TENSORBOARD_FILE)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return ReplayResult(None, len(series), records_total, 0, points, skipped)


def _set_aside_stamp(one: Series) -> str | None:
    return set_aside_stamp(one.files[-1]) if one.files else None


def _tensorboard_folder(one: Series, current_runs: Counter) -> str:
    """The live output's layout: `rank_<x>/` for a rank's current run, `rank_<x>/<stamp>/` for
    a run set aside by a later one (outputs/runs.py); the series' label where two current
    runs share a rank (files of two folders named together)."""
    rank = f"rank_{one.rank}"
    stamp = _set_aside_stamp(one)
    if one.rank is not None and stamp is not None:
        return f"{rank}/{stamp}"
    if one.rank is not None and current_runs[one.rank] == 1:
        return rank
    return one.label.replace("/", "_").replace(" ", "_")


def _write_with_restarts(sink: Any, records: Sequence[StepRecord]) -> None:
    """The records in order, with the restart marker the live output writes where a resumed
    run logs a step again: TensorBoard shows each step once, the later run's."""
    start = 0
    for index in range(1, len(records)):
        if records[index].step <= records[index - 1].step:
            sink.write(records[start:index])
            sink.mark_restart(records[index].step)
            start = index
    sink.write(records[start:])
