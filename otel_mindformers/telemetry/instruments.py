"""The synchronous training instruments, created from the semconv table."""

from __future__ import annotations

from typing import Any

from opentelemetry import metrics

from otel_mindformers import record as rec
from otel_mindformers import semconv
from otel_mindformers.semconv import Kind, MetricSpec

# StepRecord value name → the gauge that carries it.
GAUGE_FOR_VALUE: dict[str, MetricSpec] = {
    rec.LOSS: semconv.LOSS,
    rec.LEARNING_RATE: semconv.LEARNING_RATE,
    rec.GRAD_NORM: semconv.GRAD_NORM,
    rec.LOSS_SCALE: semconv.LOSS_SCALE,
    rec.SAMPLES_PER_SECOND: semconv.SAMPLES_RATE,
    rec.TOKENS_PER_SECOND: semconv.TOKENS_RATE,
}


def create_instrument(meter: metrics.Meter, spec: MetricSpec, **kwargs: Any) -> Any:
    """One instrument from its spec; observable kinds take `callbacks=` in kwargs."""
    factory = {
        Kind.COUNTER: meter.create_counter,
        Kind.GAUGE: meter.create_gauge,
        Kind.HISTOGRAM: meter.create_histogram,
        Kind.OBSERVABLE_GAUGE: meter.create_observable_gauge,
        Kind.OBSERVABLE_COUNTER: meter.create_observable_counter,
    }[spec.kind]
    return factory(spec.name, unit=spec.unit, description=spec.description, **kwargs)


class TrainingInstruments:
    """Records a StepRecord. Call inside the step span so the histogram gets an exemplar."""

    def __init__(self, meter: metrics.Meter, point_attributes: dict[str, Any]) -> None:
        self._attrs = dict(point_attributes)
        self._gauges = {name: create_instrument(meter, spec) for name, spec in GAUGE_FOR_VALUE.items()}
        self._overflow = create_instrument(meter, semconv.OVERFLOW)
        self._overflow_steps = create_instrument(meter, semconv.OVERFLOW_STEPS)
        self._steps = create_instrument(meter, semconv.STEPS)
        self._nonfinite = create_instrument(meter, semconv.NONFINITE)
        # The bucket advisory works with providers we did not build (no View needed).
        self._step_duration = create_instrument(
            meter,
            semconv.STEP_DURATION,
            explicit_bucket_boundaries_advisory=list(semconv.STEP_DURATION_BUCKETS),
        )

    def record(self, record: rec.StepRecord, step_seconds: float) -> None:
        attrs = self._attrs
        self._steps.add(record.steps_in_window, attrs)
        self._step_duration.record(step_seconds, attrs)
        bad = set(record.nonfinite())
        for name in bad:
            self._nonfinite.add(1, {**attrs, semconv.ATTR_METRIC: name})
        for name, value in record.values.items():
            gauge = self._gauges.get(name)
            if gauge is not None and name not in bad:
                gauge.set(value, attrs)
        overflow = record.values.get(rec.OVERFLOW)
        if overflow is not None:
            self._overflow.set(int(overflow), attrs)
            if overflow:
                self._overflow_steps.add(1, attrs)
