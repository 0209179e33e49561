"""An anomaly a rank records about itself: a span event and an OTel log record of one name."""

from __future__ import annotations

from typing import Any

from opentelemetry._logs import SeverityNumber
from opentelemetry.trace import Span


def record_event(
    span: Span | None, otel_logger: Any, name: str, message: str, attributes: dict[str, Any], severity: SeverityNumber
) -> None:
    """`name` as an event on `span` (when it records) and as the log record's event name."""
    if span is not None and span.is_recording():
        span.add_event(name, attributes)
    otel_logger.emit(
        severity_number=severity, severity_text=severity.name, body=message, attributes=attributes, event_name=name
    )


__all__ = ["record_event"]
