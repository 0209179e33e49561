"""One clear warning when OTLP export fails, instead of one per export attempt.

Against a collector that is down or never answers, the SDK's exporters and batch
processors log a warning or an error for every attempt, every retry and every dropped
span: a long run would bury its own logs. While installed, `ExportErrorReporter` turns the
first such record (or a final flush that overran its deadline, `report()`) into one warning
on our logger and swallows the rest; training goes on and telemetry that cannot be
delivered is dropped. With `announce=False` it only keeps the first failure, for a caller
that puts it in its own message (`otel-mindformers replay`).

Credentials never reach a message: the endpoint is printed without its user info and query
(`http://***@host:4318/`), and the same parts, and any header value given as a secret, are
masked in the exporters' own text (the gRPC exporter quotes `user:token@host:4317`).
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Iterable, Iterator

from otel_mindformers.config.redaction import Redactor, endpoint_secrets, host_port, printable_endpoint
from otel_mindformers.core.guarded_log import get_logger

_logger = get_logger("otel_mindformers.telemetry")

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


# The SDK batch processor's message when its queue is full (its argument: the signal).
_QUEUE_FULL = "Queue full, dropping %s."


# The gRPC exporter names its target: "... exporting traces to 127.0.0.1:4317, retrying ...",
# "Failed to export traces to 127.0.0.1:4317, error code: ...".
_NAMED_TARGET = re.compile(r"(?:exporting|export) \w+ to (?P<address>[^\s,]+)")


def _export_loggers() -> Iterator[logging.Logger]:
    for name in list(logging.Logger.manager.loggerDict):
        if name.startswith(_EXPORT_LOGGER_PREFIXES):
            yield logging.getLogger(name)


class ExportErrorReporter(logging.Filter):
    """Collapses export warnings and errors into a single warning; lower levels pass."""

    def __init__(self, destination: str, *, secrets: Iterable[str] = (), announce: bool = True) -> None:
        """`destination`: the endpoint (or words for it); `secrets`: header values to mask."""
        super().__init__("otel_mindformers.export_errors")
        self.destination = printable_endpoint(destination)
        self._redact = Redactor(
            endpoint_secrets(destination) | {secret.strip() for secret in secrets if secret.strip()}
        )
        self.announce = announce
        self._address = host_port(destination)  # as the gRPC exporter names it
        self.first_failure: str | None = None  # the first failure's message: export is failing
        self.last_failure_at: float | None = None  # time.monotonic() of the latest one
        self._lock = threading.Lock()
        self._loggers: list[logging.Logger] = []
        self.dropped: dict[str, int] = {}  # what full SDK queues dropped, by signal

    @property
    def failing(self) -> bool:
        return self.first_failure is not None

    def failed_within(self, seconds: float) -> bool:
        """A failure was seen in the last `seconds`: export is failing now, not only once."""
        last = self.last_failure_at
        return last is not None and time.monotonic() - last <= seconds

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        if record.msg == _QUEUE_FULL and isinstance(record.args, tuple) and record.args:
            self._dropped_by_queue(str(record.args[0]))
            return False
        message = record.getMessage()
        named = _NAMED_TARGET.search(message)
        if (
            named is not None
            and self._address is not None
            and named["address"].rsplit("@", 1)[-1].lower() != self._address
        ):
            return True  # another exporter's (a provider of the user's, an earlier run's): not ours
        self.report(message)
        return False

    def _dropped_by_queue(self, signal: str) -> None:
        """The SDK's batch queue was full: this process produced faster than its processor
        exports (the collector may be healthy). Counted per signal; said once now, and with
        the counts when the reporter is uninstalled (the run's end)."""
        with self._lock:
            first = not self.dropped
            self.dropped[signal] = self.dropped.get(signal, 0) + 1
        if first and self.announce:
            _logger.warning(
                "otel_mindformers: the OpenTelemetry SDK's queue for %s records is full, so records are dropped "
                "in this process before export (to %s); training continues; the count is given at the end. "
                "A larger queue (monitor_config otlp.logs_queue_size, OTEL_BLRP_MAX_QUEUE_SIZE, "
                "OTEL_BSP_MAX_QUEUE_SIZE), or fewer records (logs.level, logs.rate_limit_per_logger), helps.",
                signal,
                self.destination,
            )

    def say_dropped(self) -> None:
        """One warning with what full queues dropped, per signal, if anything."""
        with self._lock:
            dropped, self.dropped = dict(self.dropped), {}
        if dropped and self.announce:
            counts = ", ".join(f"{count} {signal} record(s)" for signal, count in sorted(dropped.items()))
            _logger.warning(
                "otel_mindformers: full SDK queues dropped %s in this run before export (in this process, "
                "not at the collector)",
                counts,
            )

    def report(self, failure: str) -> None:
        """Record a failure; the first one is announced (one warning), the rest are dropped."""
        failure = self._redact(failure)
        with self._lock:
            self.last_failure_at = time.monotonic()
            first = self.first_failure is None
            if first:
                self.first_failure = failure
        if first and self.announce:
            _logger.warning(
                "otel_mindformers: OTLP export to %s is failing or too slow (%s). Training "
                "continues; telemetry that cannot be delivered is dropped and further export "
                "errors are not logged.",
                self.destination,
                failure,
            )

    def install(self) -> ExportErrorReporter:
        """Attach to every export logger that exists now (the exporters are imported)."""
        for logger in _export_loggers():
            # In front of the SDK's own DuplicateFilter, which lets a repeated message through
            # once: every "Queue full" must be counted.
            if self not in logger.filters:
                logger.filters.insert(0, self)
            self._loggers.append(logger)
        return self

    def uninstall(self) -> None:
        self.say_dropped()
        for logger in self._loggers:
            logger.removeFilter(self)
        self._loggers.clear()

    def __enter__(self) -> ExportErrorReporter:
        return self.install()

    def __exit__(self, *exc_info: object) -> None:
        self.uninstall()

    @classmethod
    def installed(cls) -> ExportErrorReporter | None:
        """The reporter that announces for the export loggers now, if any (the one
        `opentelemetry-instrument`'s process keeps for the SDK's exporters)."""
        for logger in _export_loggers():
            for attached in logger.filters:
                if isinstance(attached, cls) and attached.announce:
                    return attached
        return None
