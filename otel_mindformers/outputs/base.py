"""The sink contract, and the fan-out that feeds every sink on the pipeline's worker thread.

A sink that raises is disabled with one warning naming it; the other sinks carry on.
"""

from __future__ import annotations

from typing import Protocol

from otel_mindformers.core.guarded_log import get_logger
from otel_mindformers.core.record import StepRecord

_logger = get_logger(__name__)


class OutputSink(Protocol):
    """A destination for sampled steps. Both methods run on the pipeline's worker thread."""

    name: str

    def write(self, record: StepRecord) -> None: ...

    def close(self) -> None: ...


class SinkFanout:
    """Hands each record to every live sink."""

    def __init__(self, sinks: list[OutputSink]) -> None:
        self._sinks = list(sinks)

    def write(self, record: StepRecord) -> None:
        for sink in list(self._sinks):
            self._guarded(sink, sink.write, record)

    def close(self) -> None:
        for sink in self._sinks:
            self._guarded(sink, sink.close)

    def _guarded(self, sink: OutputSink, method, *args) -> None:
        try:
            method(*args)
        except Exception as exc:  # a broken sink must never take training down
            _logger.warning("otel_mindformers: output %r failed and is disabled: %s", sink.name, exc)
            if sink in self._sinks:
                self._sinks.remove(sink)
