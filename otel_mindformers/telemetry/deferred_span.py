"""A span whose ids exist now and whose SDK span is made later, on another thread.

Starting and ending an SDK span costs tens of microseconds; a `phase()` on the training
thread must cost far less. `DeferredSpan` stands in for the span while the phase runs: it
is the current span there, so what is made inside it (a child span, a log record, a
TRACEPARENT for a child process) names its ids, and it keeps what is done to it (attributes,
events, status, exceptions). After the phase, the pipeline's worker starts the real span
with those ids (`StepSpanIds.preset_ids`), the phase's start and end times, and
`replay`s onto it what was kept.

Its trace is its parent's (the parent's trace flags and state too: under the SDK's default
parent-based sampler the real span is sampled exactly when its parent is). A parent without
a valid context gets it a trace of its own, drawn once.
"""

from __future__ import annotations

import random
from typing import Any

from opentelemetry.trace import Span, SpanContext, Status, StatusCode, TraceFlags


def new_span_id() -> int:
    """A random non-zero 64-bit span id (what the SDK's RandomIdGenerator draws)."""
    return random.getrandbits(64) or 1


class DeferredSpan(Span):
    __slots__ = ("parent", "span_id", "_context", "_kept", "_open")

    def __init__(self, parent: Span, span_id: int) -> None:
        self.parent = parent
        self.span_id = span_id
        self._context: SpanContext | None = None  # made when first asked for
        self._kept: list[tuple[str, tuple]] = []
        self._open = True

    def get_span_context(self) -> SpanContext:
        context = self._context
        if context is None:
            parent = self.parent.get_span_context()
            if parent.is_valid:
                trace_id, flags, state = parent.trace_id, parent.trace_flags, parent.trace_state
            else:
                trace_id, flags, state = random.getrandbits(128) or 1, TraceFlags(TraceFlags.SAMPLED), None
            context = self._context = SpanContext(
                trace_id, self.span_id, is_remote=False, trace_flags=flags, trace_state=state
            )
        return context

    def is_recording(self) -> bool:
        return self._open

    def close(self) -> None:
        """The phase ended: nothing more is kept (the worker replays what was)."""
        self._open = False

    def _keep(self, method: str, *args: Any) -> None:
        if self._open:
            self._kept.append((method, args))

    def set_attribute(self, key: str, value: Any) -> None:
        self._keep("set_attribute", key, value)

    def set_attributes(self, attributes: Any) -> None:
        self._keep("set_attributes", dict(attributes))

    def add_event(self, name: str, attributes: Any = None, timestamp: int | None = None) -> None:
        self._keep("add_event", name, attributes, timestamp)

    def update_name(self, name: str) -> None:
        self._keep("update_name", name)

    def set_status(self, status: Status | StatusCode, description: str | None = None) -> None:
        self._keep("set_status", status, description)

    def record_exception(
        self, exception: BaseException, attributes: Any = None, timestamp: int | None = None, escaped: bool = False
    ) -> None:
        self._keep("record_exception", exception, attributes, timestamp, escaped)

    def end(self, end_time: int | None = None) -> None:
        """The phase ends its span, not whoever holds it."""

    def replay(self, span: Span) -> None:
        """Do to the real span what was done to this one, in order (the worker's thread)."""
        for method, args in self._kept:
            getattr(span, method)(*args)
