"""The synchronous training instruments, created from the training-metric table; the
function that applies measurements to them; and `Coalesced`, which holds a batch of
records' gauge and counter measurements until the batch ends."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from functools import partial
from typing import Any

from opentelemetry import metrics

from otel_mindformers.core.measurements import Measurement
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


Recorder = Callable[[float, Mapping[str, Any]], None]  # an instrument's `set` / `add` / `record`


class Coalesced:
    """Gauge sets and counter adds held until `flush`, then applied once per instrument and
    attribute set: a gauge's last value, a counter's sum. The SDK exports the same points as
    if each had been applied in turn (a gauge exports its last value, a counter its sum),
    with one SDK call where a batch of records made one per record. Histograms are not held:
    each observation counts, and its exemplar needs the step span current.

    Held by the attribute dict's identity, not its content: hashing a dict's items for each
    measurement cost about as much as the SDK call it saved. The held value keeps its dict
    alive, so no id is reused within a batch. Equal dicts are separate keys: a counter's adds
    still sum, and gauges are applied in the order they were last set, so the last one wins."""

    def __init__(self) -> None:
        self._gauges: dict[tuple[Recorder, int], tuple[float, Mapping[str, Any]]] = {}
        self._sums: dict[tuple[Recorder, int], tuple[float, Mapping[str, Any]]] = {}

    def set(self, instrument_set: Recorder, value: float, attributes: Mapping[str, Any]) -> None:
        key = (instrument_set, id(attributes))
        gauges = self._gauges
        if key in gauges:
            del gauges[key]  # set again: it moves to the end of the flush order
        gauges[key] = (value, attributes)

    def add(self, instrument_add: Recorder, value: float, attributes: Mapping[str, Any]) -> None:
        key = (instrument_add, id(attributes))
        held = self._sums.get(key)
        self._sums[key] = (value + held[0], attributes) if held is not None else (value, attributes)

    def flush(self) -> None:
        gauges, sums = self._gauges, self._sums
        self._gauges, self._sums = {}, {}
        for (instrument_set, _), (value, attributes) in gauges.items():
            instrument_set(value, attributes)
        for (instrument_add, _), (value, attributes) in sums.items():
            instrument_add(value, attributes)


class TrainingInstruments:
    """Every instrument of `training_metrics.INSTRUMENTS`, by name. Apply measurements
    inside the step span's context so histogram points get exemplars; gauges and counters
    wait in `coalesced` until the pipeline flushes it at the end of a batch of records."""

    def __init__(self, meter: metrics.Meter) -> None:
        self.coalesced = Coalesced()
        self._apply: dict[str, Recorder] = {}
        for spec in tm.INSTRUMENTS:
            if spec.kind is Kind.HISTOGRAM:
                # The bucket advisory works with providers we did not build (no View needed).
                buckets = tm.HISTOGRAM_BUCKETS.get(spec.name, tm.STEP_DURATION_BUCKETS)
                instrument = create_instrument(meter, spec, explicit_bucket_boundaries_advisory=list(buckets))
                self._apply[spec.name] = instrument.record
            elif spec.kind is Kind.COUNTER:
                self._apply[spec.name] = partial(self.coalesced.add, create_instrument(meter, spec).add)
            else:
                self._apply[spec.name] = partial(self.coalesced.set, create_instrument(meter, spec).set)

    def apply(self, measured: Iterable[Measurement]) -> None:
        for measurement in measured:
            self._apply[measurement.spec.name](measurement.value, measurement.attributes)

    def flush(self) -> None:
        """Apply the held gauge and counter measurements (the end of a batch of records)."""
        self.coalesced.flush()
