"""The poll thread: reads every source in turn, refreshes the cache, counts failures."""

from __future__ import annotations

import threading
from collections.abc import Sequence

from opentelemetry.metrics import Counter

from otel_mindformers.core.guarded_log import get_logger
from otel_mindformers.devices.cache import ReadingCache
from otel_mindformers.devices.command import kill_tool_of
from otel_mindformers.devices.source import Source, SourceError
from otel_mindformers.names import semconv

_logger = get_logger(__name__)


class Poller:
    """Polls `sources` every `interval` seconds on a daemon thread.

    A failing source loses its cached readings (no stale values are reported), adds one to
    `failures` per poll, and is named in one warning for the whole run: a driver that stays
    broken for hours must not flood the training log. A failing query of a poll that still
    read something (`Readings.problems`) is counted and warned about the same way, once per
    query. A tool that is not installed is counted once and not run again: it will not
    appear during the run, and every poll would only count it again.
    """

    def __init__(
        self,
        sources: Sequence[Source],
        cache: ReadingCache,
        interval: float,
        failures: Counter | None = None,
    ) -> None:
        self._sources = list(sources)
        self._cache = cache
        self._interval = interval
        self._failures = failures
        self._warned: set[tuple[str, str]] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="otel-mindformers-devices", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float) -> None:
        """Return within about `timeout`. A poll still stuck in a tool call then has the
        tool's process group killed, so the poll ends (and closes the sources) at once:
        the process may exit right after the run, and a hung tool would outlive it."""
        self._stop.set()
        self._thread.join(timeout)
        if self._thread.is_alive() and kill_tool_of(self._thread.ident):
            self._thread.join(min(timeout, 1.0))

    def poll_once(self) -> None:
        for source in list(self._sources):
            if self._stop.is_set():
                return
            try:
                readings = source.read()
            except Exception as exc:  # a device tool must never take training down
                if self._stop.is_set():  # a tool killed by `stop`: not the device's failure
                    return
                self._cache.drop(source.name)
                self._count_failure(source.name, exc)
                if isinstance(exc, SourceError) and exc.error_type == "not_found":
                    self._sources.remove(source)
            else:
                self._cache.put(source.name, readings)
                for problem in readings.problems:
                    self._count_failure(source.name, problem)

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                self.poll_once()
                self._stop.wait(self._interval)
        finally:
            for source in self._sources:
                try:
                    source.close()
                except Exception as exc:
                    _logger.debug("otel_mindformers: closing device source %s: %s", source.name, exc)

    def _count_failure(self, name: str, exc: Exception) -> None:
        error_type = exc.error_type if isinstance(exc, SourceError) else type(exc).__name__
        query = exc.query if isinstance(exc, SourceError) else ""
        if self._failures is not None:
            self._failures.add(1, {semconv.ATTR_DEVICE_SOURCE: name, semconv.ATTR_ERROR_TYPE: error_type})
        if (name, query) not in self._warned:
            self._warned.add((name, query))
            what = f"`{query}` of device source {name!r}" if query else f"device source {name!r}"
            _logger.warning(
                "otel_mindformers: %s failed (%s: %s); its readings are left out while it fails, "
                "and each failed poll is counted in %s",
                what,
                error_type,
                exc,
                semconv.DEVICE_POLL_FAILURES,
            )
