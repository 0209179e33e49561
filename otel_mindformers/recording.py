"""What a sampled step records, as pure functions of its StepRecord.

The live pipeline (telemetry/step_recorder.py) and `otel-mindformers replay` both call
these, so a replayed run and a live run produce the same measurements and the same step
span by construction; they differ only in how they deliver them (SDK instruments "now",
or export data stamped with the record's own time).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from opentelemetry.trace import Status, StatusCode

from otel_mindformers import semconv
from otel_mindformers import training_metrics as tm
from otel_mindformers.metric_spec import MetricSpec
from otel_mindformers.record import StepRecord


@dataclass(frozen=True)
class Measurement:
    """One value for one instrument: a gauge's value, a counter's increment, or a
    histogram's observation."""

    spec: MetricSpec
    value: float
    attributes: Mapping[str, Any]


@dataclass(frozen=True)
class StepSpanFields:
    name: str
    attributes: dict[str, Any]
    status: Status
    start_time: float  # wall seconds
    end_time: float


def measurements(record: StepRecord, point_attributes: Mapping[str, Any]) -> list[Measurement]:
    """Every measurement of one sampled step, in the table's order.

    Non-finite values are counted under `training.metric` instead of recorded: the SDK drops
    NaN/Inf measurements without a word.
    """
    bad = record.nonfinite()
    out = [Measurement(tm.STEPS, record.steps_in_window, point_attributes)]
    out += [Measurement(tm.NONFINITE, 1, {**point_attributes, tm.ATTR_METRIC: key}) for key in bad]
    for key, value in record.ordered_values():
        row = tm.BY_KEY.get(key)
        if row is None or key in bad:
            continue
        out.append(Measurement(row.instrument, _number(value) * row.instrument_scale, point_attributes))
        if row.counted_when_true is not None and value:
            out.append(Measurement(row.counted_when_true, 1, point_attributes))
    return out


def _number(value: float | bool) -> float | int:
    return int(value) if isinstance(value, bool) else value


def step_span(record: StepRecord) -> StepSpanFields:
    """The step span: `training.<key>` per finite value; an error status naming the
    non-finite ones. It spans the step itself: from `started_at` when the live callback
    knew it, else one step time (the window's mean) before the record's time stamp."""
    bad = record.nonfinite()
    attributes: dict[str, Any] = {
        semconv.ATTR_STEP: record.step,
        semconv.ATTR_EPOCH: record.epoch,
        semconv.ATTR_STEPS_IN_WINDOW: record.steps_in_window,
    }
    for key, value in record.ordered_values():
        row = tm.BY_KEY.get(key)
        if row is not None and key not in bad:
            attributes[row.span_attribute] = value
    status = (
        Status(StatusCode.ERROR, f"non-finite {', '.join(bad)}") if bad else Status(StatusCode.UNSET)
    )
    return StepSpanFields(semconv.SPAN_STEP, attributes, status, span_start(record), record.time_stamp)


def span_start(record: StepRecord) -> float:
    if record.started_at is not None:
        return record.started_at
    step_ms = record.values.get(tm.STEP_TIME)
    if isinstance(step_ms, float) and 0 < step_ms < float("inf"):
        return record.time_stamp - step_ms / 1000.0
    return record.time_stamp
