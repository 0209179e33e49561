"""Observable instruments over the reading cache, one per device metric spec."""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Iterable

from opentelemetry.metrics import CallbackOptions, Counter, Meter, Observation

from otel_mindformers.devices.cache import ReadingCache
from otel_mindformers.names import semconv


class _Observed:
    """The cache a meter's device instruments read.

    The SDK hands back the first instrument, callbacks included, when a name is registered
    again on the same meter; a second training run in one process must therefore swap its
    cache in here rather than register new callbacks that would never be called.
    """

    def __init__(self) -> None:
        self.cache: ReadingCache | None = None
        self.failures: Counter | None = None

    def observer(self, metric: str) -> Callable[[CallbackOptions], Iterable[Observation]]:
        def observe(options: CallbackOptions) -> Iterable[Observation]:
            # Runs on the metric reader's thread: reads the cache, never a device.
            cache = self.cache
            if cache is None:
                return
            for point in cache.points(metric):
                yield Observation(point.value, dict(point.attributes))

        return observe


_observed: weakref.WeakKeyDictionary[Meter, _Observed] = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def register(meter: Meter, cache: ReadingCache) -> Counter:
    """Point `meter`'s device instruments at `cache` (creating them on first use) and
    return the poll-failure counter."""
    with _lock:
        observed = _observed.get(meter)
        if observed is None:
            observed = _observed[meter] = _Observed()
            _create(meter, observed)
        observed.cache = cache
        assert observed.failures is not None  # _create made it
        return observed.failures


def _create(meter: Meter, observed: _Observed) -> None:
    factories = {
        semconv.Kind.OBSERVABLE_GAUGE: meter.create_observable_gauge,
        semconv.Kind.OBSERVABLE_COUNTER: meter.create_observable_counter,
        semconv.Kind.OBSERVABLE_UP_DOWN_COUNTER: meter.create_observable_up_down_counter,
    }
    for spec in semconv.DEVICE_METRICS:
        if spec.kind is semconv.Kind.COUNTER:
            observed.failures = meter.create_counter(spec.name, unit=spec.unit, description=spec.description)
        else:
            factories[spec.kind](
                spec.name, callbacks=[observed.observer(spec.name)], unit=spec.unit, description=spec.description
            )
