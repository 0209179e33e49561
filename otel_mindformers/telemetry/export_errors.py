"""One clear warning when OTLP export fails, instead of one per export attempt.

Against a collector that is down or never answers, the SDK's exporters and batch
processors log a warning or an error for every attempt, every retry and every dropped
span: a long run would bury its own logs. While installed, `ExportErrorReporter` turns the
first such record into one warning on our logger and swallows the rest; training goes on
and telemetry that cannot be delivered is dropped.
"""

from __future__ import annotations

import logging
import threading

_logger = logging.getLogger("otel_mindformers.telemetry")

# Loggers of the OTLP exporters and of the SDK parts that call them (batch processors,
# the periodic metric reader). Filters attach to a logger, not to its children, so every
# module logger under these prefixes gets one.
_EXPORT_LOGGER_PREFIXES = (
    "opentelemetry.exporter.otlp",
    "opentelemetry.sdk._shared_internal",
    "opentelemetry.sdk.trace.export",
    "opentelemetry.sdk.metrics._internal.export",
    "opentelemetry.sdk._logs._internal.export",
)


class ExportErrorReporter(logging.Filter):
    """Collapses export warnings and errors into a single warning; lower levels pass."""

    def __init__(self, destination: str) -> None:
        super().__init__("otel_mindformers.export_errors")
        self.destination = destination
        self._reported = False
        self._lock = threading.Lock()
        self._loggers: list[logging.Logger] = []

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        with self._lock:
            first = not self._reported
            self._reported = True
        if first:
            _logger.warning(
                "otel_mindformers: OTLP export to %s is failing or too slow (%s). Training "
                "continues; telemetry that cannot be delivered is dropped and further export "
                "errors are not logged.",
                self.destination,
                record.getMessage(),
            )
        return False

    def install(self) -> "ExportErrorReporter":
        """Attach to every export logger that exists now (the exporters are imported)."""
        names = [
            name
            for name in list(logging.Logger.manager.loggerDict)
            if name.startswith(_EXPORT_LOGGER_PREFIXES)
        ]
        for name in names:
            logger = logging.getLogger(name)
            logger.addFilter(self)
            self._loggers.append(logger)
        return self

    def uninstall(self) -> None:
        for logger in self._loggers:
            logger.removeFilter(self)
        self._loggers.clear()
