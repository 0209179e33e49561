"""The run's sources on the device metrics' observable instruments, one per spec, over the
reading cache; and the poll-failure counter."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from opentelemetry.metrics import CallbackOptions, Counter, Observation

from otel_mindformers.devices.cache import ReadingCache
from otel_mindformers.names import semconv
from otel_mindformers.telemetry.observables import RunObservables
from otel_mindformers.telemetry.training_instruments import create_instrument


def register(observables: RunObservables, cache: ReadingCache) -> Counter:
    """Observe `cache` on the device instruments until `observables` closes (a later run in
    the process observes its own cache; telemetry/observables.py), and return the
    poll-failure counter."""
    failures: Counter | None = None
    for spec in semconv.DEVICE_METRICS:
        if spec.kind is semconv.Kind.COUNTER:
            failures = create_instrument(observables.meter, spec)
        else:
            observables.observe(spec, _observer(cache, spec.name))
    assert failures is not None  # DEVICE_METRICS has the poll-failure counter
    return failures


def _observer(cache: ReadingCache, metric: str) -> Callable[[CallbackOptions], Iterable[Observation]]:
    def observe(_options: CallbackOptions) -> Iterable[Observation]:
        # Runs on the metric reader's thread: reads the cache, never a device.
        for point in cache.points(metric):
            yield Observation(point.value, dict(point.attributes))

    return observe
