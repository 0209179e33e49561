"""The sink contract and the background thread that feeds every sink.

The training thread only puts a StepRecord on a bounded queue; a single writer thread
hands it to each sink. A full queue drops the record (counted, reported once) instead of
blocking the step; a sink that raises is disabled with one warning naming it, and the
other sinks carry on.
"""

from __future__ import annotations

import logging
from typing import Protocol

from otel_mindformers.background import BoundedWorker
from otel_mindformers.record import StepRecord

_logger = logging.getLogger(__name__)


class OutputSink(Protocol):
    """A destination for sampled steps. Both methods run on the writer thread."""

    name: str

    def write(self, record: StepRecord) -> None: ...

    def close(self) -> None: ...


class BackgroundDispatcher(BoundedWorker[StepRecord]):
    """Fans StepRecords out to sinks on the writer thread; closes them when stopped."""

    def __init__(self, sinks: list[OutputSink], max_queue: int = 1024) -> None:
        self._sinks = list(sinks)
        self.dropped = 0
        super().__init__("otel-mindformers-writer", max_queue)

    def on_drop(self, record: StepRecord) -> None:
        self.dropped += 1
        if self.dropped == 1:
            _logger.warning(
                "otel_mindformers: output queue full (%d records); dropping records "
                "rather than slowing training. Raise `interval` or check the sinks.",
                self.max_queue,
            )

    def close(self, timeout: float = 5.0) -> None:
        """Drain what is queued and close every sink, within `timeout` seconds."""
        left = super().close(timeout)
        if left:
            _logger.warning(
                "otel_mindformers: outputs did not drain within %.1f s; %d record(s) not written",
                timeout, len(left),
            )

    def handle(self, record: StepRecord) -> None:
        for sink in list(self._sinks):
            self._guarded(sink, sink.write, record)

    def on_stop(self) -> None:
        for sink in self._sinks:
            self._guarded(sink, sink.close)

    def _guarded(self, sink: OutputSink, method, *args) -> None:
        try:
            method(*args)
        except Exception as exc:  # a broken sink must never take training down
            _logger.warning(
                "otel_mindformers: output %r failed and is disabled: %s", sink.name, exc
            )
            if sink in self._sinks:
                self._sinks.remove(sink)
