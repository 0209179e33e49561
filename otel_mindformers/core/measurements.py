"""What a sampled step records, as pure functions of its StepRecord.

The live pipeline (pipeline.py) and `otel-mindformers replay` both call
these, so a replayed run and a live run produce the same measurements and the same step
span by construction; they differ only in how they deliver them (SDK instruments "now",
or export data stamped with the record's own time).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from opentelemetry.trace import Status, StatusCode

from otel_mindformers.core.step_record import StepRecord, counted_nonfinite
from otel_mindformers.names import model_state as ms_specs
from otel_mindformers.names import semconv
from otel_mindformers.names import training as tm
from otel_mindformers.names.spec import MetricSpec


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
    if record.model_state:
        out += model_state_measurements(record.model_state.summary(), point_attributes)
    return out


def model_state_measurements(summary: Mapping[str, Any], point_attributes: Mapping[str, Any]) -> list[Measurement]:
    """The model state's series (names/model_state.py): per layer, per kind, the max with the
    parameter's name, the selected parameters; local losses, MoE balance. Null (non-finite)
    values are left out."""
    out: list[Measurement] = []

    def add(spec: MetricSpec, value: Any, **attributes: Any) -> None:
        if isinstance(value, (int, float)):
            out.append(Measurement(spec, value, {**point_attributes, **attributes}))

    for family in ms_specs.FAMILIES:
        part = summary.get(family.key)
        if not part:
            continue
        for layer, value in part.get("layer", {}).items():
            add(family.layer, value, **{ms_specs.ATTR_LAYER: layer})
        for kind, value in part.get("kind", {}).items():
            add(family.kind, value, **{ms_specs.ATTR_KIND: kind})
        top = part.get("max")
        if top:
            where = {ms_specs.ATTR_PARAMETER: top["parameter"]}
            if top.get("layer") is not None:
                where[ms_specs.ATTR_LAYER] = top["layer"]
            add(family.max, top["value"], **where)
        for name, value in part.get("parameter", {}).items():
            add(family.parameter, value, **{ms_specs.ATTR_PARAMETER: name})
    for value in summary.get(ms_specs.SUMMARY_LOCAL_LOSS, ()):
        add(ms_specs.LOCAL_LOSS, value)
    for tag, value in summary.get(ms_specs.SUMMARY_DEVICE_LOCAL_LOSS, {}).items():
        add(ms_specs.DEVICE_LOCAL_LOSS, value, **{ms_specs.ATTR_LOSS: tag})
    for spec, key in (
        (ms_specs.EXPERT_LOAD_IMBALANCE, ms_specs.SUMMARY_EXPERT_LOAD_IMBALANCE),
        (ms_specs.DROP_RATE, ms_specs.SUMMARY_DROP_RATE),
    ):
        for layer, value in summary.get(key, {}).items():
            add(spec, value, **{ms_specs.ATTR_LAYER: layer})
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
    if record.model_state:
        summary = record.model_state.summary()
        for family in ms_specs.FAMILIES:
            top = (summary.get(family.key) or {}).get("max")
            if top and top["value"] is not None:  # which parameter is largest, in the trace too
                attributes[f"training.{family.key}.max"] = top["value"]
                attributes[f"training.{family.key}.max_parameter"] = top["parameter"]
    # An error only for what loss scaling does not explain (an overflow step's grad norm).
    faults = counted_nonfinite(bad, record.values.get(tm.OVERFLOW))
    status = Status(StatusCode.ERROR, f"non-finite {', '.join(faults)}") if faults else Status(StatusCode.UNSET)
    return StepSpanFields(semconv.SPAN_STEP, attributes, status, span_start(record), record.time_stamp)


def span_start(record: StepRecord) -> float:
    if record.started_at is not None:
        return record.started_at
    step_ms = record.values.get(tm.STEP_TIME)
    if isinstance(step_ms, float) and 0 < step_ms < float("inf"):
        return record.time_stamp - step_ms / 1000.0
    return record.time_stamp
