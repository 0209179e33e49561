"""The synchronous training instruments, created from the training-metric table, and the
one function that applies measurements to them."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from opentelemetry import metrics

from otel_mindformers.core.recording import Measurement
from otel_mindformers.names import training as tm
from otel_mindformers.names.spec import Kind, MetricSpec


def create_instrument(meter: metrics.Meter, spec: MetricSpec, **kwargs: Any) -> Any:
    """One instrument from its spec; observable kinds take `callbacks=` in kwargs."""
    factories: dict[Kind, Callable[..., Any]] = {
        Kind.COUNTER: meter.create_counter,
        Kind.GAUGE: meter.create_gauge,
        Kind.HISTOGRAM: meter.create_histogram,
        Kind.OBSERVABLE_GAUGE: meter.create_observable_gauge,
        Kind.OBSERVABLE_COUNTER: meter.create_observable_counter,
        Kind.OBSERVABLE_UP_DOWN_COUNTER: meter.create_observable_up_down_counter,
    }
    return factories[spec.kind](spec.name, unit=spec.unit, description=spec.description, **kwargs)


class TrainingInstruments:
    """Every instrument of `training_metrics.INSTRUMENTS`, by name. Apply measurements
    inside the step span's context so histogram points get exemplars."""

    def __init__(self, meter: metrics.Meter) -> None:
        self._apply = {}
        for spec in tm.INSTRUMENTS:
            if spec.kind is Kind.HISTOGRAM:
                # The bucket advisory works with providers we did not build (no View needed).
                buckets = tm.HISTOGRAM_BUCKETS.get(spec.name, tm.STEP_DURATION_BUCKETS)
                instrument = create_instrument(meter, spec, explicit_bucket_boundaries_advisory=list(buckets))
                self._apply[spec.name] = instrument.record
            elif spec.kind is Kind.COUNTER:
                self._apply[spec.name] = create_instrument(meter, spec).add
            else:
                self._apply[spec.name] = create_instrument(meter, spec).set

    def apply(self, measured: Iterable[Measurement]) -> None:
        for measurement in measured:
            self._apply[measurement.spec.name](measurement.value, measurement.attributes)
