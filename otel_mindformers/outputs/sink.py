"""The sink contract, and the fan-out that feeds every sink on the pipeline's worker thread.

Sinks take the sampled steps of one worker batch at once: at interval 1 that is a dozen
records, written with one lock, one `write(2)` and one flush where each record made its own.
A sink that raises is said once, naming it; the other sinks carry on. Its later batches are
tried again, each in its turn (a failing try costs a failed system call or two): a disk that
was full, or a folder that was unwritable, is written to again once it is not, said once.
Failures after that first episode are said together at the run's end, in one line per sink.
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
    """Hands each batch of records to every sink; one that fails keeps being offered them."""

    def __init__(self, sinks: list[OutputSink]) -> None:
        self._sinks = list(sinks)
        self._failing: dict[str, int] = {}  # sink name -> the first step of the batch it failed first
        self._said: set[tuple[str, str]] = set()  # (sink name, "failed" / "resumed"): each said once
        self._unsaid: dict[str, tuple[int, int, Exception]] = {}  # name -> later failed batches, last step, error

    def write(self, records: Sequence[StepRecord]) -> bool:
        """Whether every sink wrote the batch (the flight ring's mark of what the outputs
        wrote moves only then: flight_recorder/)."""
        wrote_all = True
        for sink in self._sinks:
            try:
                sink.write(records)
            except Exception as exc:  # a broken sink must never take training down
                wrote_all = False
                self._failed_batch(sink, records, exc)
                continue
            first_lost = self._failing.pop(sink.name, None)
            if first_lost is not None and records:
                self._say_once(
                    sink, "resumed", "otel_mindformers: output %r writes again from step %d (the records of steps "
                    "%d..%d are missing from it)", sink.name, records[0].step, first_lost, records[0].step - 1,
                )  # fmt: skip
        return wrote_all

    def close(self) -> None:
        for name, (batches, last_step, exc) in self._unsaid.items():
            _logger.warning(
                "otel_mindformers: output %r failed again after it first wrote again: %d more batch(es) "
                "missing from it, the last up to step %d (%s)", name, batches, last_step, exc,
            )  # fmt: skip
        for sink in self._sinks:
            try:
                sink.close()
            except Exception as exc:  # a broken sink must never take training down
                if sink.name not in self._failing:  # its failure was said already
                    _logger.warning("otel_mindformers: output %r failed at its close: %s", sink.name, exc)

    def _failed_batch(self, sink: OutputSink, records: Sequence[StepRecord], exc: Exception) -> None:
        name = sink.name
        if (name, "resumed") in self._said:  # an episode after the first: said at the run's end
            batches = self._unsaid.get(name, (0, 0, exc))[0]
            self._unsaid[name] = (batches + 1, records[-1].step if records else 0, exc)
        elif name not in self._failing:
            self._say_once(
                sink, "failed", "otel_mindformers: output %r failed: %s; its records are dropped while it "
                "fails, and each later batch is tried again", name, exc,
            )  # fmt: skip
        self._failing.setdefault(name, records[0].step if records else 0)

    def _say_once(self, sink: OutputSink, what: str, message: str, *args: object) -> None:
        if (sink.name, what) not in self._said:
            self._said.add((sink.name, what))
            _logger.warning(message, *args)
