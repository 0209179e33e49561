"""Python logging as OTel log records, joined to the run's rank, step and spans.

While a run goes on (`monitor_config.logs.enable`, or the standard
OTEL_PYTHON_LOGGING_AUTO_INSTRUMENTATION_ENABLED under zero-code) one handler sits on the
root logger and on the loggers that do not propagate to it (MindFormers' `mindformers<log
path>`, MindSpore's `ME.mindspore.log.<pid>`), and turns each record into an OTel log record
of the run's logger provider, the one its spans and metrics go through. Each carries:

- `training.rank`, `training.step` (the last step the run saw finish: `StepClock.step`) and
  `training.phase`;
- trace and span ids: the current span's, when one is current on the emitting thread (a
  phase span, a span of the user or another instrumentation); else, on the training thread
  during a step that will be sampled and get a span, that step span's (known in advance, see
  telemetry/step_ids.py); else none.

A level threshold and a fixed-window rate limit per logger keep a chatty logger from
flooding the collector; what the limit dropped is said in one record per logger and
window. The emitting thread does no I/O: the record goes on the SDK's batch processor queue.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import traceback
from collections.abc import Iterable
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry._logs import LogRecord, SeverityNumber

from otel_mindformers.config import LogsConfig
from otel_mindformers.core.guarded_log import get_logger
from otel_mindformers.names import semconv
from otel_mindformers.names.phase_names import ATTR_PHASE

_logger = get_logger(__name__)

# The standard switch of the SDK's own logging handler under `opentelemetry-instrument`.
AUTO_INSTRUMENTATION_VARIABLE = "OTEL_PYTHON_LOGGING_AUTO_INSTRUMENTATION_ENABLED"

# Never shipped: the SDK's and exporters' own messages (an export failure would become a
# record to export), as the SDK's handler does too.
_OWN_LOGGERS = ("opentelemetry",)
# Nor anything logged on the SDK's export threads (`OtelBatch…RecordProcessor`,
# `OtelPeriodicExportingMetricReader`): the HTTP exporter's `urllib3.connectionpool` "POST
# /v1/logs 200" lines at DEBUG, each export making the next one's record, and whatever
# else a transport logs while it exports.
_EXPORT_THREAD_PREFIX = "Otel"

# Bounds of one shipped record, well under gRPC's 4 MiB message limit (a batch holds up to
# 512 records, so one oversized record must not cost the batch): the body and each string
# attribute are cut, and `training.logs.truncated_chars` says how much was left out. The
# stack dumps use the same body bound (hangs/dumps.py).
MAX_BODY_CHARS = 32_000
MAX_ATTRIBUTE_CHARS = 4_096

# Attributes every LogRecord has; anything else in `vars(record)` came from `extra=`.
_STANDARD_FIELDS = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime", "taskName"}

_SEVERITIES = (
    (logging.CRITICAL, SeverityNumber.FATAL, "FATAL"),
    (logging.ERROR, SeverityNumber.ERROR, "ERROR"),
    (logging.WARNING, SeverityNumber.WARN, "WARN"),
    (logging.INFO, SeverityNumber.INFO, "INFO"),
    (logging.DEBUG, SeverityNumber.DEBUG, "DEBUG"),
)


def logs_enabled(config: LogsConfig) -> bool:
    """`logs.enable`, or when unset, the standard OTEL_PYTHON_LOGGING_AUTO_INSTRUMENTATION_ENABLED."""
    if config.enable is not None:
        return config.enable
    return os.environ.get(AUTO_INSTRUMENTATION_VARIABLE, "").strip().lower() == "true"


def severity(levelno: int) -> tuple[SeverityNumber, str]:
    """The OTel severity of a Python level (custom levels between two fall in the lower's range)."""
    for base, number, text in _SEVERITIES:
        if levelno >= base:
            return SeverityNumber(number.value + min(levelno - base, 3)), text
    return SeverityNumber.TRACE, "TRACE"


class RateLimit:
    """At most `limit` records per logger in each `window` seconds (fixed windows)."""

    def __init__(self, limit: int, window: float) -> None:
        self.limit, self.window = limit, window
        self._windows: dict[str, list] = {}  # logger name -> [window start, admitted, dropped]

    def admit(self, name: str, now: float) -> tuple[bool, int]:
        """(send this record?, records dropped in the window that just closed)."""
        state = self._windows.get(name)
        if state is None or now - state[0] >= self.window:
            self._windows[name] = [now, 1, 0]
            return True, state[2] if state is not None else 0
        if state[1] < self.limit:
            state[1] += 1
            return True, 0
        state[2] += 1
        return False, 0

    def drain(self) -> dict[str, int]:
        """Dropped counts of the open windows (at the end of a run); resets them."""
        dropped = {name: state[2] for name, state in self._windows.items() if state[2]}
        self._windows.clear()
        return dropped


class RunCorrelation:
    """What a record made now belongs to: rank, step, phase, and the span ids to carry."""

    def __init__(self, rank: int, clock: Any, cadence: Any, step_ids: Any) -> None:
        self.rank = rank
        self.clock = clock
        self.cadence = cadence
        self.step_ids = step_ids  # telemetry.step_ids.StepSpanIds, or None
        self.training_thread = threading.get_ident()

    def attributes(self) -> dict[str, Any]:
        return {semconv.ATTR_RANK: self.rank, semconv.ATTR_STEP: self.clock.step, ATTR_PHASE: self.clock.phase}

    def context(self) -> otel_context.Context:
        current = otel_context.get_current()
        if trace.get_current_span(current).get_span_context().is_valid:
            return current
        # The step in progress is the one after the last finished; only the training thread
        # reads clock and cadence consistently (it is the one that writes them).
        if self.step_ids is None or threading.get_ident() != self.training_thread:
            return current
        cadence, upcoming = self.cadence, self.clock.step + 1
        if upcoming >= cadence.next_sample and cadence.wants_span(upcoming, cadence.window_step, False):
            return self.step_ids.context_of(cadence.window_step)
        return current


class TrainingLogHandler(logging.Handler):
    """A `logging.Handler` that emits OTel log records through `provider`."""

    def __init__(self, provider: Any, correlation: RunCorrelation, config: LogsConfig) -> None:
        super().__init__(logging.getLevelName(config.level))
        self._provider = provider
        self._correlation = correlation
        self._limit = RateLimit(config.rate_limit_per_logger, config.rate_limit_window)
        self._loggers: dict[str, Any] = {}
        self._local = threading.local()
        self._failed = False

    def handle(self, record: logging.LogRecord) -> bool:
        local = self._local
        # A record reaches us once per logger we sit on along its way up (a non-propagating
        # logger inside another); and emitting must not log into itself.
        if getattr(local, "last", None) is record or getattr(local, "busy", False):
            return False
        local.last = record
        thread = record.threadName  # None when logging.logThreads is off
        if record.name.startswith(_OWN_LOGGERS) or (thread is not None and thread.startswith(_EXPORT_THREAD_PREFIX)):
            return False
        local.busy = True
        try:
            return super().handle(record)
        finally:
            local.busy = False

    def emit(self, record: logging.LogRecord) -> None:
        try:
            admitted, dropped = self._limit.admit(record.name, time.monotonic())
            if dropped:
                self._emit_dropped(record.name, dropped)
            if admitted:
                self._logger(record.name).emit(self._translate(record))
        except Exception as exc:  # telemetry never breaks the caller's logging; said once
            if not self._failed:
                self._failed = True
                _logger.warning(
                    "otel_mindformers: shipping log records failed, further failures are not reported: %s", exc
                )

    def close_run(self) -> None:
        """Say what the rate limit dropped in the windows still open."""
        for name, dropped in self._limit.drain().items():
            self._emit_dropped(name, dropped)

    def _logger(self, name: str) -> Any:
        logger = self._loggers.get(name)
        if logger is None:
            logger = self._loggers[name] = self._provider.get_logger(name)
        return logger

    def _translate(self, record: logging.LogRecord) -> LogRecord:
        number, text = severity(record.levelno)
        cut = _Cut()
        attributes = {
            key: cut(value, MAX_ATTRIBUTE_CHARS) if isinstance(value, str) else value
            for key, value in vars(record).items()
            if key not in _STANDARD_FIELDS and isinstance(value, (str, bool, int, float))
        }
        attributes.update(
            {
                "code.file.path": record.pathname,
                "code.function.name": record.funcName,
                "code.line.number": record.lineno,
                **self._correlation.attributes(),
            }
        )
        if record.threadName is not None:  # None when logging.logThreads is off: no attribute
            attributes["thread.name"] = record.threadName
        if record.exc_info and record.exc_info[1] is not None:  # the SDK's exception.* keys, bounded
            error = record.exc_info[1]
            attributes["exception.type"] = type(error).__name__
            attributes["exception.message"] = cut(str(error), MAX_ATTRIBUTE_CHARS)
            trace_text = "".join(traceback.format_exception(*record.exc_info))
            attributes["exception.stacktrace"] = cut(trace_text, MAX_BODY_CHARS, keep_end=True)
        body = cut(record.getMessage(), MAX_BODY_CHARS)
        if cut.dropped:
            attributes[semconv.ATTR_LOG_TRUNCATED] = cut.dropped
        return LogRecord(
            timestamp=int(record.created * 1e9),
            context=self._correlation.context(),
            severity_number=number,
            severity_text=text,
            body=body,
            attributes=attributes,
        )

    def _emit_dropped(self, name: str, dropped: int) -> None:
        limit = self._limit
        self._logger(name).emit(
            LogRecord(
                timestamp=time.time_ns(),
                context=otel_context.Context(),
                severity_number=SeverityNumber.WARN,
                severity_text="WARN",
                body=(
                    f"otel_mindformers: {dropped} record(s) of logger {name!r} dropped by "
                    f"monitor_config.logs.rate_limit_per_logger ({limit.limit} per {limit.window:g} s)"
                ),
                attributes={**self._correlation.attributes(), semconv.ATTR_LOGS_DROPPED: dropped},
            )
        )


class _Cut:
    """Cuts strings to a bound, counting what it left out."""

    def __init__(self) -> None:
        self.dropped = 0

    def __call__(self, text: str, limit: int, *, keep_end: bool = False) -> str:
        if len(text) <= limit:
            return text
        self.dropped += len(text) - limit
        marker = f" … [{len(text) - limit} characters cut] … "
        keep = max(0, limit - len(marker))
        return marker + text[-keep:] if keep_end else text[:keep] + marker


def _reaches_root(logger: logging.Logger) -> bool:
    node: Any = logger
    while node is not None and node is not logging.root:
        if not node.propagate:
            return False
        node = node.parent
    return True


def _matches(name: str, prefixes: Iterable[str]) -> bool:
    return any(name == p or name.startswith((f"{p}.", f"{p}/")) for p in prefixes)


def isolated_loggers(prefixes: Iterable[str]) -> list[logging.Logger]:
    """Existing loggers named by `prefixes` (`name`, `name.*`, `name/*`) whose records never
    reach the root logger."""
    prefixes = list(prefixes)
    return [
        logger
        for name, logger in list(logging.root.manager.loggerDict.items())
        if isinstance(logger, logging.Logger) and _matches(name, prefixes) and not _reaches_root(logger)
    ]


def _is_sdk_handler(handler: logging.Handler) -> bool:
    """The SDK's own handler, which OTEL_PYTHON_LOGGING_AUTO_INSTRUMENTATION_ENABLED puts on the root."""
    from opentelemetry.sdk._logs import LoggingHandler

    return isinstance(handler, LoggingHandler)


class LogBridge:
    """The handler of one run: on its loggers from `start` to `close`."""

    def __init__(
        self,
        handler: TrainingLogHandler,
        loggers: list[logging.Logger],
        displaced: list[logging.Handler],
        last_resort: list[logging.Logger],
    ) -> None:
        self.handler = handler
        self._loggers = loggers
        self._displaced = displaced
        self._last_resort = last_resort

    @classmethod
    def start(cls, config: LogsConfig, provider: Any, correlation: RunCorrelation) -> LogBridge | None:
        """None when logs are off, or there is no logger provider to send them through."""
        if not logs_enabled(config) or provider is None:
            return None
        handler = TrainingLogHandler(provider, correlation, config)
        root = logging.getLogger()
        # Under zero-code the SDK's handler already ships the root's records: ours stands
        # in for it during the run (same provider, plus rank, step, ids and the limits).
        displaced = [h for h in root.handlers if _is_sdk_handler(h)]
        for sdk_handler in displaced:
            root.removeHandler(sdk_handler)
        loggers = [root, *isolated_loggers(config.loggers)]
        # Where Python's last resort printed warnings to stderr, ours would silence it (a
        # handler was found): the console keeps them, as without the bridge.
        last_resort = [lg for lg in loggers if not lg.hasHandlers()] if logging.lastResort is not None else []
        for logger in loggers:
            logger.addHandler(handler)
        for logger in last_resort:
            logger.addHandler(logging.lastResort)  # type: ignore[arg-type]  # checked above
        wanted = logging.getLevelName(config.level)
        if root.getEffectiveLevel() > wanted:  # records below the root's level are never made
            _logger.warning(
                "otel_mindformers: logs.level is %s, but the root logger's level is %s: records below %s are "
                "not created, so not shipped; set logging.getLogger().setLevel(logging.%s) (or logging.basicConfig)",
                config.level, logging.getLevelName(root.getEffectiveLevel()),
                logging.getLevelName(root.getEffectiveLevel()), config.level,
            )  # fmt: skip
        _logger.debug("otel_mindformers: shipping log records of %s", [lg.name for lg in loggers])
        return cls(handler, loggers, displaced, last_resort)

    def close(self) -> None:
        for logger in self._loggers:
            logger.removeHandler(self.handler)
        for logger in self._last_resort:
            logger.removeHandler(logging.lastResort)  # type: ignore[arg-type]  # added at start
        root = logging.getLogger()
        for sdk_handler in self._displaced:
            root.addHandler(sdk_handler)
        self.handler.close_run()
