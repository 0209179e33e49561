"""Observable instruments shared by the runs of one process, and each run's sources on them.

The SDK registers an instrument once per meter and name: asked for the name again, it hands
back the first instrument and drops the new `callbacks=`. A meter outlives a run when its
provider is borrowed (a global provider set by the user or by `opentelemetry-instrument`, or
one passed in): the provider caches the meter, so a second `Model.train` in the process gets
the first run's meter, and callbacks registered per run would keep reporting the first run.

So each observable instrument is created once per (meter, name), with one callback that asks
the sources the live runs registered. A run adds its sources as it starts (`RunObservables`)
and removes them as it ends, on every exit path: a finished run reports nothing, since a
frozen step after the run ended reads as a stalled rank. With a provider each run builds
for itself, the meter is new every run and this is one instrument with one source, as before.

Threads: the metric reader's thread calls the instruments' callbacks; the training thread
adds and removes sources. A source list is a tuple replaced whole under a lock, and a
collection iterates the tuple it read, so neither thread waits on the other's work.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from opentelemetry.metrics import CallbackOptions, Meter, Observation

from otel_mindformers.core.guarded_log import get_logger
from otel_mindformers.names.spec import MetricSpec
from otel_mindformers.telemetry.training_instruments import create_instrument

_logger = get_logger(__name__)

Source = Callable[[CallbackOptions], Iterable[Observation]]


class _Registered:
    """One run's source on one instrument; a failing source is reported once."""

    __slots__ = ("name", "reported", "source")

    def __init__(self, name: str, source: Source) -> None:
        self.name, self.source, self.reported = name, source, False


class _Shared:
    """The sources of one observable instrument, read by its one callback."""

    __slots__ = ("sources",)

    def __init__(self) -> None:
        self.sources: tuple[_Registered, ...] = ()

    def observe(self, options: CallbackOptions) -> Iterator[Observation]:
        for registered in self.sources:  # the tuple read once: a removal replaces it
            try:
                yield from registered.source(options)
            except Exception as exc:  # one run's failing source must not hide the others'
                if not registered.reported:
                    registered.reported = True
                    _logger.warning("otel_mindformers: observing %s failed: %s", registered.name, exc)


# Keyed weakly on the meter: a provider built for one run drops its meter, and this with it.
# The values must not refer to the meter (the SDK instrument holds `_Shared.observe`, not us).
_shared: weakref.WeakKeyDictionary[Any, dict[str, _Shared]] = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def _instrument_for(meter: Meter, spec: MetricSpec) -> _Shared:
    """`spec`'s instrument on `meter`, created on first use. Called with `_lock` held."""
    by_name = _shared.get(meter)
    if by_name is None:
        by_name = _shared[meter] = {}
    shared = by_name.get(spec.name)
    if shared is None:
        shared = by_name[spec.name] = _Shared()
        create_instrument(meter, spec, callbacks=[shared.observe])
    return shared


class RunObservables:
    """One run's sources on `meter`'s observable instruments; `close` removes them all."""

    def __init__(self, meter: Meter) -> None:
        self.meter = meter
        self._added: list[tuple[_Shared, _Registered]] = []

    def observe(self, spec: MetricSpec, source: Source) -> None:
        """From now until `close`, every collection of `spec`'s instrument includes what
        `source` yields (called on the metric reader's thread)."""
        registered = _Registered(spec.name, source)
        with _lock:
            shared = _instrument_for(self.meter, spec)
            shared.sources = (*shared.sources, registered)
            self._added.append((shared, registered))

    def close(self) -> None:
        """Remove this run's sources; the instruments stay for a later run. Idempotent."""
        with _lock:
            added, self._added = self._added, []
            for shared, registered in added:
                shared.sources = tuple(source for source in shared.sources if source is not registered)


__all__ = ["RunObservables", "Source"]
