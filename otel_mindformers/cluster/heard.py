"""What a fault ClusterD sent becomes: telemetry, and a line in the attempt's ledger entry.

Per fault of a `fault` signal (one per node and device): a `mindcluster.fault` event on the
run span and an OTel log record with the level, codes, node, device and time, and the
counter `mindformers.cluster.faults` by level. The signal's most severe fault goes into this
attempt's ledger entry (restarts/: `cluster_fault`), written at once: if ClusterD then
stops the job, `report` says which fault ended the attempt. A `normal` signal (the job's
faults are gone) is a `mindcluster.fault.cleared` event and marks that entry cleared.
Runs on the listener's thread.
"""

from __future__ import annotations

from typing import Any

from opentelemetry._logs import SeverityNumber

from otel_mindformers.cluster.fault_levels import severity
from otel_mindformers.cluster.signals import SIGNAL_FAULT, SIGNAL_NORMAL, Signal
from otel_mindformers.core.guarded_log import get_logger
from otel_mindformers.names import cluster_names as names
from otel_mindformers.telemetry.events import record_event
from otel_mindformers.telemetry.training_instruments import create_instrument

_logger = get_logger(__name__)

# A level that restarts or isolates (ClusterD's UnHealthy) is an error; the rest a warning.
_ERROR_FROM = severity("RestartRequest")
MAX_EVENTS_PER_SIGNAL = 64  # one event per fault up to this; the counter counts them all


class HeardFaults:
    """Callable with each Signal the listener reads."""

    def __init__(self, telemetry: Any, run_span: Any, attempt: Any, point_attributes: dict[str, Any]) -> None:
        self._logger = telemetry.logger
        self._span = run_span
        self._attempt = attempt  # restarts' AttemptTracker, or None (restarts off)
        self._points = dict(point_attributes)
        self._counter = create_instrument(telemetry.meter, names.CLUSTER_FAULTS)

    def __call__(self, signal: Signal) -> None:
        if signal.kind == SIGNAL_NORMAL or (signal.kind == SIGNAL_FAULT and not signal.faults):
            self._cleared(signal)
            return
        common = {names.ATTR_SIGNAL_TYPE: signal.kind, names.ATTR_SIGNAL_UUID: signal.uuid}
        for index, fault in enumerate(signal.faults):
            self._counter.add(1, {**self._points, names.ATTR_FAULT_LEVEL: fault.level})
            if index >= MAX_EVENTS_PER_SIGNAL:
                continue
            level = SeverityNumber.ERROR if severity(fault.level) >= _ERROR_FROM else SeverityNumber.WARN
            attributes = {**self._points, **common, **fault.attributes(), "time": fault.time}
            record_event(
                self._span, self._logger, names.EVENT_FAULT, f"ClusterD: {fault.describe()}", attributes, level
            )
        worst = signal.worst
        assert worst is not None  # a fault signal with faults (the empty one is handled above)
        more = f" (and {len(signal.faults) - 1} more)" if len(signal.faults) > 1 else ""
        _logger.warning(
            "otel_mindformers: ClusterD reports a fault of job %s: %s%s", signal.job_id, worst.describe(), more
        )
        if self._attempt is not None:
            self._attempt.note_cluster_fault(worst.ledger_fields())

    def _cleared(self, signal: Signal) -> None:
        attributes = {**self._points, names.ATTR_SIGNAL_TYPE: signal.kind, names.ATTR_SIGNAL_UUID: signal.uuid}
        record_event(
            self._span, self._logger, names.EVENT_FAULT_CLEARED, "ClusterD: the job's faults cleared", attributes,
            SeverityNumber.INFO,
        )  # fmt: skip
        _logger.info("otel_mindformers: ClusterD reports job %s without faults", signal.job_id)
        if self._attempt is not None:
            self._attempt.note_cluster_fault(None)


__all__ = ["HeardFaults"]
