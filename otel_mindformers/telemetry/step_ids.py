"""Step spans whose trace and span ids are known before the spans exist.

A step span is started on the pipeline's worker thread after its step has ended, so
nothing made during the step (a log record, above all) can read its ids from the current
context. Instead, a run derives them: a hash of a per-run random seed and the window the
sampled step closes (the step number of the previous sample, which both the training thread,
from `Cadence.window_step`, and the worker, from the StepRecord, know). The training thread
computes the ids of the step in progress without waiting for anything; the worker makes the
SDK use them for that step's span. Records are exported as they are made, nothing is held
back, and the span keeps its real start and end times.

The SDK takes ids only from its tracer's `id_generator`: `StepSpanIds.install` wraps that of
our tracer in a generator that hands out the preset ids once, on the thread that asked for
them, inside `preset()`, and the tracer's own ids everywhere else. A tracer that is not the
SDK's, or whose generator makes non-random ids (AWS X-Ray's carry a timestamp), keeps its
ids: `install` returns None and step spans cannot be found from their records.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags


class _PresetIdGenerator:
    """The tracer's id generator, except for one span started inside `preset()`."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self._local = threading.local()

    @contextmanager
    def preset(self, trace_id: int, span_id: int) -> Iterator[None]:
        self._local.ids = [trace_id, span_id]
        try:
            yield
        finally:
            self._local.ids = None

    def generate_trace_id(self) -> int:
        ids = getattr(self._local, "ids", None)
        return ids[0] if ids else self.inner.generate_trace_id()

    def generate_span_id(self) -> int:
        ids = getattr(self._local, "ids", None)
        if not ids:
            return self.inner.generate_span_id()
        self._local.ids = None  # one span: a child started inside the preset gets its own id
        return ids[1]

    def is_trace_id_random(self) -> bool:
        return self.inner.is_trace_id_random()


class StepSpanIds:
    """One run's step-span ids: `context_of(window)` on any thread, `preset(window)` on the
    thread that starts the span."""

    def __init__(self, generator: _PresetIdGenerator, seed: bytes | None = None) -> None:
        self._generator = generator
        self._seed = seed if seed is not None else os.urandom(16)

    def preset_ids(self, trace_id: int, span_id: int) -> Any:
        """The next span started on this thread inside the block gets these ids (a span
        recorded after the fact: a killed attempt's run span, restarts/attempt_tracker.py)."""
        return self._generator.preset(trace_id, span_id)

    @classmethod
    def install(cls, tracer: Any) -> StepSpanIds | None:
        """Ids for the step spans `tracer` starts; None when it cannot be told them."""
        current = getattr(tracer, "id_generator", None)
        if isinstance(current, _PresetIdGenerator):  # a previous run in this process
            return cls(current)
        if current is None or not current.is_trace_id_random():
            return None
        generator = _PresetIdGenerator(current)
        tracer.id_generator = generator
        return cls(generator)

    def ids(self, window_start: int) -> tuple[int, int]:
        """(trace id, span id) of the span of the sample that closes the window opened at
        step `window_start`. Hashed from the run's random seed, so they are random too (the
        W3C random-trace-id flag stays true) and differ between runs."""
        digest = hashlib.blake2b(window_start.to_bytes(8, "big", signed=True), key=self._seed, digest_size=24).digest()
        return int.from_bytes(digest[:16], "big") or 1, int.from_bytes(digest[16:], "big") or 1

    def context_of(self, window_start: int) -> otel_context.Context:
        """A context whose current span has that step span's ids (for log records)."""
        trace_id, span_id = self.ids(window_start)
        span = NonRecordingSpan(
            SpanContext(trace_id, span_id, is_remote=False, trace_flags=TraceFlags(TraceFlags.SAMPLED))
        )
        return trace.set_span_in_context(span, otel_context.Context())

    @contextmanager
    def preset(self, window_start: int) -> Iterator[None]:
        """The next span started on this thread gets the ids of `window_start`'s step span."""
        with self._generator.preset(*self.ids(window_start)):
            yield
