"""The sink contract, and the fan-out that feeds every sink on the pipeline's worker thread.

Sinks take the sampled steps of one worker batch at once: at interval 1 that is a dozen
records, written with one lock, one `write(2)` and one flush where each record made its own.
A sink that raises is disabled with one warning naming it; the other sinks carry on.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from otel_mindformers.core.guarded_log import get_logger
from otel_mindformers.core.step_record import StepRecord

_logger = get_logger(__name__)


class OutputSink(Protocol):
    """A destination for sampled steps. Both methods run on the pipeline's worker thread."""

    name: str

    def write(self, records: Sequence[StepRecord]) -> None:
        """Records of consecutive sampled steps, in step order."""

    def close(self) -> None: ...


class SinkFanout:
    """Hands each batch of records to every live sink."""

    def __init__(self, sinks: list[OutputSink]) -> None:
        self._sinks = list(sinks)
        self._started = len(self._sinks)

    def write(self, records: Sequence[StepRecord]) -> bool:
        """Whether every sink the run started with wrote the batch (the flight ring's mark
        of what the outputs wrote moves only then: flight_recorder/)."""
        for sink in list(self._sinks):
            self._guarded(sink, sink.write, records)
        return len(self._sinks) == self._started

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
