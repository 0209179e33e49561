"""The sink contract and the background thread that feeds every sink.

The training thread only puts a StepRecord on a bounded queue; a single writer thread
hands it to each sink. A full queue drops the record (counted, reported once) instead of
blocking the step; a sink that raises is disabled with one warning naming it, and the
other sinks carry on.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from typing import Protocol

from otel_mindformers.record import StepRecord

_logger = logging.getLogger(__name__)

_STOP = object()


class OutputSink(Protocol):
    """A destination for sampled steps. Both methods run on the writer thread."""

    name: str

    def write(self, record: StepRecord) -> None: ...

    def close(self) -> None: ...


class BackgroundDispatcher:
    """Fans StepRecords out to sinks on one daemon thread behind a bounded queue."""

    def __init__(self, sinks: list[OutputSink], max_queue: int = 1024) -> None:
        self._sinks = list(sinks)
        self._queue: queue.Queue[object] = queue.Queue(maxsize=max_queue)
        self.dropped = 0
        self._drop_reported = False
        self._thread = threading.Thread(
            target=self._run, name="otel-mindformers-writer", daemon=True
        )
        self._thread.start()

    def submit(self, record: StepRecord) -> None:
        """Never blocks: a full queue drops the record."""
        try:
            self._queue.put_nowait(record)
        except queue.Full:
            self.dropped += 1
            if not self._drop_reported:
                self._drop_reported = True
                _logger.warning(
                    "otel_mindformers: output queue full (%d records); dropping records "
                    "rather than slowing training. Raise `interval` or check the sinks.",
                    self._queue.maxsize,
                )

    def close(self, timeout: float = 5.0) -> None:
        """Drain what is queued, close every sink, and return within `timeout` seconds."""
        deadline = time.monotonic() + timeout
        try:
            self._queue.put(_STOP, timeout=timeout)
        except queue.Full:
            _logger.warning("otel_mindformers: writer thread stuck; closing without draining")
        self._thread.join(max(0.0, deadline - time.monotonic()))

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is _STOP:
                break
            for sink in list(self._sinks):
                self._guarded(sink, sink.write, item)
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
