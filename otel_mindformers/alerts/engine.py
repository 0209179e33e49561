"""AlertEngine: runs the rules on sampled steps, records what fires, notifies, and decides
when training should stop.

`evaluate` runs on the sampled-step pipeline's worker thread and does no I/O: rule checks, a
counter add, span events, and (rate-limited) a log record and an Alert put on the delivery
queue. Network
I/O happens on the delivery thread; stall detection and its stack dumps on the watchdog
thread.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from opentelemetry import trace
from opentelemetry._logs import SeverityNumber
from opentelemetry.trace import Span, Status, StatusCode

from otel_mindformers.alerts.alert import CRITICAL, FIRING, INFO, RESOLVED, WARNING, Alert
from otel_mindformers.alerts.delivery import NotificationDelivery
from otel_mindformers.alerts.notifiers import build_notifiers
from otel_mindformers.alerts.rules import NO_DATA, NONFINITE, STALL, Finding, build_rules
from otel_mindformers.captures.controller import NO_CAPTURES
from otel_mindformers.config import AlertConfig
from otel_mindformers.core.deadline import Deadline
from otel_mindformers.core.guarded_log import get_logger
from otel_mindformers.core.step_record import StepRecord
from otel_mindformers.hangs.dumps import StackDump, StackDumper
from otel_mindformers.hangs.stall_watchdog import StallWatchdog, StepProgress
from otel_mindformers.job.identity import Identity
from otel_mindformers.names import capture_names, diagnosis, semconv
from otel_mindformers.names import training as metrics
from otel_mindformers.telemetry.training_instruments import create_instrument

_logger = get_logger(__name__)

EARLY_STOP = "early_stop"
RUN_END = "run_end"
SEVERITIES = (WARNING, CRITICAL)

# Run-end outcomes (`notify_run_end`): the notice's status, and its severity.
COMPLETED, STOPPED, CRASHED = "completed", "stopped", "crashed"
_RUN_END_SEVERITY = {COMPLETED: INFO, STOPPED: WARNING, CRASHED: CRITICAL}

# Severity → OTel severity number and text, Python logging level. A notice that reports
# good news (resolved, completed) is INFO in OTel, but logged at WARNING in Python: the
# default (last-resort) handler prints WARNING and above, so the console shows it next to
# the firing line it closes, as docs/alerts.md promises.
_LOG_SEVERITY = {
    CRITICAL: (SeverityNumber.ERROR, "CRITICAL", logging.ERROR),
    WARNING: (SeverityNumber.WARN, "WARNING", logging.WARNING),
    INFO: (SeverityNumber.INFO, "INFO", logging.WARNING),
}


class TelemetryHandles(Protocol):
    """What the engine records through (the callback's Telemetry)."""

    meter: Any  # opentelemetry.metrics.Meter
    logger: Any  # opentelemetry._logs.Logger


class RateLimiter:
    """`alert_interval` as the monitor_config article defines it: at least `interval` steps between two
    notifications of the same rule. A rule that was notified and stops firing gets one
    resolved notice."""

    def __init__(self, interval: int) -> None:
        self._interval = interval
        self._last_notified: dict[str, int] = {}
        self._open: set[str] = set()

    def fire(self, rule: str, step: int) -> bool:
        """True when this firing should be notified."""
        last = self._last_notified.get(rule)
        if last is not None and step - last < self._interval:
            return False
        self._last_notified[rule] = step
        self._open.add(rule)
        return True

    def clear(self, rule: str) -> bool:
        """True when the rule was notified and a resolved notice is due."""
        if rule in self._open:
            self._open.discard(rule)
            return True
        return False


def _attribute(value: float | None) -> bool:
    """Numbers OTel attributes keep: infinities are meaningful (threshold=inf), NaN is not."""
    return value is not None and not math.isnan(value)


def as_number(value: Any) -> float | None:
    """A user-supplied alert value as a float: numbers, numpy scalars, one-element arrays
    and Tensors, numeric strings; None for anything else (never an exception)."""
    if value is None or isinstance(value, str) and not value.strip():
        return None
    try:
        if hasattr(value, "asnumpy"):  # a MindSpore Tensor: this reads it back (user's choice)
            value = value.asnumpy()
        if hasattr(value, "size") and hasattr(value, "reshape"):  # numpy array or scalar
            if value.size != 1:
                return None
            value = value.reshape(-1)[0]
        return float(value)
    except (TypeError, ValueError, OverflowError, AttributeError):
        return None


_Method = TypeVar("_Method", bound=Callable[..., Any])


def _serialized(method: _Method) -> _Method:
    """Runs the method under the engine's lock (see AlertEngine.__init__)."""

    @functools.wraps(method)
    def locked(self: AlertEngine, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            return method(self, *args, **kwargs)

    return locked  # type: ignore[return-value]


class AlertEngine:
    """In-process anomaly alerts for one rank. Build with `AlertEngine.start(...)`."""

    @classmethod
    def start(
        cls,
        alerts: AlertConfig,
        identity: Identity,
        telemetry: TelemetryHandles,
        progress: StepProgress,
        *,
        job: str,
        reports_training: bool,
        json_log_path: str,
        captures: Any = NO_CAPTURES,
        stacks: StackDumper | None = None,
    ) -> AlertEngine | None:
        """The running engine, or None when `alert_config.enable_alert` is off.

        `progress` is read by the stall watchdog; its current `last_step_end` is taken as
        "training started", so the watchdog arms at the first step that finishes after it.
        `job` names the job in notifications (the identity's job id wins); `reports_training`
        says whether this rank sends run-completed notices; stall dumps go through `stacks`
        (the run's dumper, which the caller stops), else through a dumper of the engine's own
        beside `json_log_path`; `captures` (captures/controller.py) takes evidence when a rule fires.
        """
        if not alerts.enable_alert:
            return None
        return cls(
            alerts,
            identity,
            telemetry,
            progress,
            job=job,
            reports_training=reports_training,
            json_log_path=json_log_path,
            captures=captures,
            stacks=stacks,
        )

    def __init__(
        self,
        alerts: AlertConfig,
        identity: Identity,
        telemetry: TelemetryHandles,
        progress: StepProgress,
        *,
        job: str,
        reports_training: bool,
        json_log_path: str,
        captures: Any = NO_CAPTURES,
        stacks: StackDumper | None = None,
    ) -> None:
        # evaluate() runs on the pipeline's worker thread, raise_alert() on the training
        # thread and the stall callbacks on the watchdog's: one lock keeps the rate limiter
        # and the streak consistent.
        self._lock = threading.RLock()
        self._identity = identity
        self._job = identity.job_id or job
        self._progress = progress
        self._captures = captures
        self._point_attributes = identity.point_attributes()
        spike_score = create_instrument(telemetry.meter, capture_names.LOSS_SPIKE_SCORE)
        self._rules = build_rules(alerts, lambda score: spike_score.set(score, self._point_attributes))
        self._limiter = RateLimiter(alerts.alert_interval)
        self._stop_on_nonfinite = alerts.stop_on_nonfinite
        self._stop_after = alerts.stop_after_anomalous_steps
        self._anomalous_streak = 0
        self._stop_reason: str | None = None
        self._otel_logger = telemetry.logger
        self._counter = create_instrument(telemetry.meter, semconv.ALERTS)
        self._counter_attributes: dict[tuple[str, str], dict[str, Any]] = {}
        notifiers = build_notifiers(alerts.notifiers)
        self._delivery = (
            NotificationDelivery(
                notifiers,
                timeout=alerts.notify_timeout,
                retries=alerts.notify_retries,
                counter=create_instrument(telemetry.meter, semconv.ALERT_NOTIFICATIONS),
                attributes=self._point_attributes,
            )
            if notifiers
            else None
        )
        self._notify_run_end = alerts.notify_run_end
        self._reports_training = reports_training
        self._stall_timeout = alerts.stall_timeout
        # Built here, on the training thread: the dumper marks it as the thread to watch.
        self._owns_stacks = stacks is None
        self.stacks = (
            stacks if stacks is not None else StackDumper.start(json_log_path, identity, telemetry.logger, progress)
        )
        self._stall_dump: StackDump | None = None
        self._watchdog = (
            StallWatchdog(progress, alerts.stall_timeout, self._on_stall, self._on_resume).start()
            if alerts.stall_timeout is not None
            else None
        )

    # --- pipeline worker thread ----------------------------------------------------------
    @_serialized
    def evaluate(self, record: StepRecord, step_span: Span | None) -> str | None:
        """Run every rule on a sampled step; return a stop reason, or None to carry on."""
        fired: list[str] = []
        reason = None
        for rule in self._rules:
            finding = rule.check(record)
            if finding is NO_DATA:
                continue
            if finding is None:
                if self._limiter.clear(rule.name):
                    self._notify(
                        self._alert(rule.name, rule.severity, RESOLVED, record.step, f"{rule.name} no longer firing")
                    )
                continue
            fired.append(f"{rule.name}: {finding.detail}")
            record.alerts.append(rule.name)  # the step's JSON line names it, for plot/report
            self._fire(rule.name, rule.severity, finding, record.step, step_span)
            if rule.name == NONFINITE and finding.metric == metrics.LOSS and self._stop_on_nonfinite:
                reason = f"non-finite loss ({finding.value}) at step {record.step}"
        if fired and step_span is not None and step_span.is_recording():
            step_span.set_status(Status(StatusCode.ERROR, "; ".join(fired)))
        self._anomalous_streak = self._anomalous_streak + 1 if fired else 0
        if reason is None and self._stop_after and self._anomalous_streak >= self._stop_after:
            reason = f"{self._anomalous_streak} consecutive anomalous sampled steps, the last at step {record.step}"
        if reason is not None and self._stop_reason is None:
            self._stop_reason = reason
            self._notify(self._alert(EARLY_STOP, CRITICAL, FIRING, record.step, f"requesting early stop: {reason}"))
        return self._stop_reason

    @_serialized
    def raise_alert(
        self,
        rule: str,
        message: str,
        *,
        value: float | None = None,
        threshold: float | None = None,
        severity: str = WARNING,
    ) -> None:
        """An alert from user code (BaseMonitor.raise_alert), at the last finished step.

        Rate-limited like the built-in rules; it is a one-off event, so no resolved notice.
        """
        if severity not in SEVERITIES:
            raise ValueError(f"severity must be one of {SEVERITIES}, got {severity!r}")
        finding = Finding(rule, as_number(value), as_number(threshold), str(message))
        self._fire(rule, severity, finding, self._progress.step, trace.get_current_span())

    def attach_run_span(self, span: Span) -> None:
        """Stack dumps become events of the run span (created after the engine)."""
        if self._owns_stacks:
            self.stacks.attach_run_span(span)

    def notify_run_end(self, outcome: str, reason: str | None, last_step: int, job: str | None = None) -> None:
        """The run ended: `completed`, `stopped` (early, `reason` says why) or `crashed`
        (`reason`: the exception type and message). A notice when `notify_run_end` is on:
        from the ranks that report training metrics, and from any rank that crashed. `job`:
        a line about the job across its attempts (its goodput, lost steps, downtime)."""
        if outcome not in _RUN_END_SEVERITY:
            raise ValueError(f"outcome must be one of {tuple(_RUN_END_SEVERITY)}, got {outcome!r}")
        if not self._notify_run_end or (outcome != CRASHED and not self._reports_training):
            return
        detail = {
            COMPLETED: f"run completed after step {last_step}",
            STOPPED: f"run stopped early after step {last_step}: {reason}",
            CRASHED: f"run crashed after step {last_step}: {reason}",
        }[outcome]
        if job:
            detail = f"{detail}; {job}"
        self._notify(self._alert(RUN_END, _RUN_END_SEVERITY[outcome], outcome, last_step, detail))

    def shutdown(self, timeout: float) -> None:
        """Stop the watchdog (after its last check), then deliver queued notifications
        within `timeout` seconds."""
        deadline = Deadline(timeout)
        if self._watchdog is not None:
            self._watchdog.stop(timeout)
        if self._owns_stacks:
            self.stacks.stop()
        if self._delivery is not None:
            self._delivery.close(deadline.remaining())

    # --- recording -----------------------------------------------------------------------
    def _fire(self, rule: str, severity: str, finding: Finding, step: int, span: Span | None) -> None:
        self._count(rule, severity)
        capture = self._captures.on_alert(rule, step, span)
        if span is not None and span.is_recording():
            attributes: dict[str, Any] = {
                semconv.ATTR_ALERT_RULE: rule,
                semconv.ATTR_ALERT_SEVERITY: severity,
                "message": finding.detail,
            }
            if _attribute(finding.value):
                attributes[semconv.ATTR_ALERT_VALUE] = finding.value
            if _attribute(finding.threshold):
                attributes[semconv.ATTR_ALERT_THRESHOLD] = finding.threshold
            attributes.update(finding.attributes)  # e.g. the layer a grad-norm spike came from
            if capture:
                attributes[capture_names.ATTR_CAPTURE_PATH] = capture
            span.add_event(semconv.EVENT_ALERT, attributes)
        if self._limiter.fire(rule, step):
            alert = self._alert(rule, severity, FIRING, step, finding.detail, finding.value, finding.threshold)
            self._notify(dataclasses.replace(alert, capture=capture) if capture else alert)

    def _count(self, rule: str, severity: str) -> None:
        attributes = self._counter_attributes.get((rule, severity))
        if attributes is None:
            attributes = {
                **self._point_attributes,
                semconv.ATTR_ALERT_RULE: rule,
                semconv.ATTR_ALERT_SEVERITY: severity,
            }
            self._counter_attributes[(rule, severity)] = attributes
        self._counter.add(1, attributes)

    def _alert(
        self,
        rule: str,
        severity: str,
        status: str,
        step: int,
        detail: str,
        value: float | None = None,
        threshold: float | None = None,
    ) -> Alert:
        identity = self._identity
        return Alert(
            rule=rule,
            severity=severity,
            status=status,
            step=step,
            detail=detail,
            job=self._job,
            rank=identity.rank,
            world_size=identity.world_size,
            host=identity.host_name,
            time_stamp=time.time(),
            value=value,
            threshold=threshold,
        )

    def _notify(self, alert: Alert) -> None:
        """Log it (OTel log record + a local log line) and queue it for the notifiers."""
        otel_severity, severity_text, level = _LOG_SEVERITY[INFO if alert.status == RESOLVED else alert.severity]
        attributes: dict[str, Any] = {
            **self._point_attributes,
            semconv.ATTR_ALERT_RULE: alert.rule,
            semconv.ATTR_ALERT_SEVERITY: alert.severity,
            semconv.ATTR_ALERT_STATUS: alert.status,
            semconv.ATTR_STEP: alert.step,
        }
        if _attribute(alert.value):
            attributes[semconv.ATTR_ALERT_VALUE] = alert.value
        if _attribute(alert.threshold):
            attributes[semconv.ATTR_ALERT_THRESHOLD] = alert.threshold
        self._otel_logger.emit(
            severity_number=otel_severity,
            severity_text=severity_text,
            body=alert.text(),
            attributes=attributes,
            event_name=semconv.EVENT_ALERT,
        )
        _logger.log(level, "otel_mindformers alert: %s", alert.text().replace("\n", " | "))
        if self._delivery is not None:
            self._delivery.submit(alert)

    # --- watchdog thread -----------------------------------------------------------------
    # A stall is measured in seconds, not steps: no step passes while it lasts, so it is
    # exempt from the step-based rate limit (the watchdog fires once per threshold anyway).
    @_serialized
    def _on_stall(self, last_step: int, idle: float, threshold: int) -> None:
        if threshold > 1:
            # The second dump only tells stuck from slow; the notice went out at the first.
            self.stacks.dump(diagnosis.REASON_STALL_AGAIN, idle_seconds=idle, earlier=self._stall_dump)
            return
        self._stall_dump = dump = self.stacks.dump(diagnosis.REASON_STALL, idle_seconds=idle)
        rank = self._identity.rank
        self._count(STALL, CRITICAL)
        capture = self._captures.on_alert(STALL, last_step, None)
        alert = self._alert(
            STALL,
            CRITICAL,
            FIRING,
            last_step,
            f"rank {rank}: no training step finished for {idle:.1f} s; "
            f"stalled after step {last_step}; {dump.headline()}",
            idle,
            self._stall_timeout,
        )
        self._notify(dataclasses.replace(alert, capture=capture) if capture else alert)

    @_serialized
    def _on_resume(self, step: int) -> None:
        self._stall_dump = None
        self._notify(
            self._alert(
                STALL, CRITICAL, RESOLVED, step, f"rank {self._identity.rank}: training resumed, step {step} finished"
            )
        )
