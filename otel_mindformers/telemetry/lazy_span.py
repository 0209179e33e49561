"""A step span that exists only if something is recorded on it.

With `step_spans: N` most sampled steps get no span, but an alert on one of them must still
leave its event and error status in a trace. `LazySpan` stands in for the span: it reports
itself as recording, and the first event, status or exception starts the real span (with
the step's start time, links and attributes); plain attributes alone never do.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from opentelemetry.trace import INVALID_SPAN, Span, SpanContext, Status, StatusCode


class LazySpan(Span):
    def __init__(self, start: Callable[[], Span]) -> None:
        self._start = start
        self._span: Span | None = None

    @property
    def started(self) -> bool:
        return self._span is not None

    def _real(self) -> Span:
        if self._span is None:
            self._span = self._start()
        return self._span

    # Recording an anomaly starts the span.
    def add_event(self, name: str, attributes: Any = None, timestamp: int | None = None) -> None:
        self._real().add_event(name, attributes, timestamp)

    def set_status(self, status: Status | StatusCode, description: str | None = None) -> None:
        self._real().set_status(status, description)

    def record_exception(
        self, exception: BaseException, attributes: Any = None, timestamp: int | None = None, escaped: bool = False
    ) -> None:
        self._real().record_exception(exception, attributes, timestamp, escaped)

    # Everything else only reaches a span that already exists.
    def set_attribute(self, key: str, value: Any) -> None:
        if self._span is not None:
            self._span.set_attribute(key, value)

    def set_attributes(self, attributes: Any) -> None:
        if self._span is not None:
            self._span.set_attributes(attributes)

    def update_name(self, name: str) -> None:
        if self._span is not None:
            self._span.update_name(name)

    def get_span_context(self) -> SpanContext:
        # Invalid until started: no exemplar points at a span that may never exist.
        return (self._span or INVALID_SPAN).get_span_context()

    def is_recording(self) -> bool:
        return True

    def end(self, end_time: int | None = None) -> None:
        if self._span is not None:
            self._span.end(end_time)
