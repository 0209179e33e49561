"""The run as an attempt of its job (docs/restarts.md): MonitorRun's hooks into restarts/attempt_tracker.py.

- at start: the ledger entry (job id, attempt number and id), the resource attributes, the
  link from this run span to the previous attempt's, and the job gauges
  (`mindformers.job.goodput`, `.attempt`, `.no_progress_attempts`);
- at the first step: the downtime since the previous attempt, on the run span;
- on a checkpoint save: the durable step;
- at the end: how the attempt ended, the job's totals on the run span, and the
  no-progress alert when `restarts.no_progress_attempts` attempts in a row ended without
  passing the furthest step reached before.
"""

from __future__ import annotations

import os
import re
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.trace import Link, SpanContext, TraceFlags
from opentelemetry.util.types import AttributeValue

from otel_mindformers.config import ConfigError, MonitorConfig
from otel_mindformers.core.clock import StepClock, WallClock
from otel_mindformers.core.guarded_log import get_logger
from otel_mindformers.core.process_start import process_start
from otel_mindformers.core.run_part import RunEnding, RunPart
from otel_mindformers.core.step_record import PhaseInterval, StepRecord
from otel_mindformers.flight_recorder.recovery import finished_steps_of
from otel_mindformers.job.identity import Identity, launcher_restart_count
from otel_mindformers.names import job as names
from otel_mindformers.names import phase_names
from otel_mindformers.outputs.paths import prepare_output_paths
from otel_mindformers.outputs.runs import folder_beside, is_resumed, paths_in
from otel_mindformers.restarts.attempt_tracker import AttemptTracker, LedgerInUse
from otel_mindformers.restarts.ledger_file import ledger_path
from otel_mindformers.telemetry.observables import RunObservables

_logger = get_logger(__name__)

PHASE_CHECKPOINT_SAVE = phase_names.PHASE_CHECKPOINT_SAVE
PHASE_CHECKPOINT_LOAD = phase_names.PHASE_CHECKPOINT_LOAD

_previous_run_end: float | None = None  # a later run of the same process starts at its begin


def _process_start() -> float:
    """When this process began (core/process_start.py); a later run of the same process: now."""
    now = time.time()
    return now if _previous_run_end is not None else process_start(now)


def begin_attempt(
    config: MonitorConfig,
    identity: Identity,
    first_step: int,
    clock: StepClock,
    wall_clock: WallClock,
    before: list[PhaseInterval],
) -> tuple[AttemptTracker | None, MonitorConfig]:
    """This run's entry in the job's ledger, or None (`restarts.enable: false`, or the
    ledger cannot be written: one warning); and the config the run goes on with: its own,
    or, when another job's run lives at its paths, one that writes elsewhere (one warning)."""
    if not config.enable or not config.restarts.enable:
        return None, config

    def begin(at: MonitorConfig) -> AttemptTracker:
        return _begin(at, identity, first_step, clock, wall_clock, before)

    try:
        try:
            return begin(config), config
        except LedgerInUse as busy:
            return _begin_elsewhere(config, identity, busy, begin)
    except Exception as exc:  # the ledger is telemetry: the run goes on without it
        _no_ledger(exc)
        return None, config


def _begin(
    config: MonitorConfig,
    identity: Identity,
    first_step: int,
    clock: StepClock,
    wall_clock: WallClock,
    before: list[PhaseInterval],
) -> AttemptTracker:
    flown = finished_steps_of(config.json_log_path, identity.rank)
    return AttemptTracker.begin(
        path=ledger_path(config.json_log_path, identity.rank),
        job_id=config.job_id or identity.job_id,
        continues=is_resumed(first_step) or bool(launcher_restart_count()),
        rank=identity.rank,
        resume_step=first_step,
        process_start=_process_start(),
        checkpoint_load_seconds=sum(p.seconds for p in before if p.name == phase_names.PHASE_CHECKPOINT_LOAD),
        clock=clock,
        wall_clock=wall_clock,
        heartbeat_interval=config.restarts.heartbeat_interval,
        finished={attempt_id: (far.step, far.last_sample) for attempt_id, far in flown.items()},
        running=frozenset(attempt_id for attempt_id, far in flown.items() if far.alive),
    )


def _begin_elsewhere(
    config: MonitorConfig, identity: Identity, busy: LedgerInUse, begin: Callable[[MonitorConfig], AttemptTracker]
) -> tuple[AttemptTracker | None, MonitorConfig]:
    """Another job's run lives at the run's paths: its files (ledger, JSON log, TensorBoard
    folder, flight ring, diagnosis file) are never taken over. The run writes in a folder
    beside the log's, named after its job id (every rank of the job finds the same) or its
    pid, or, where that cannot be (not writable, or a live run's too), in a new temporary
    folder; one warning names it."""
    job_id = config.job_id or identity.job_id
    token = re.sub(r"[^A-Za-z0-9._-]+", "_", job_id)[:64] if job_id else f"pid{os.getpid()}"

    def moved_into(folder: Path) -> MonitorConfig:
        json_log_path, tensorboard_path = paths_in(folder, config.json_log_path, config.tensorboard_path)
        moved = config.with_overrides(json_log_path=json_log_path, tensorboard_path=tensorboard_path)
        prepare_output_paths(moved, identity)
        return moved

    def fresh() -> tuple[Path, MonitorConfig]:
        folder = Path(tempfile.mkdtemp(prefix=f"otel_mindformers.{token}."))
        return folder, moved_into(folder)

    folder = folder_beside(config.json_log_path, token)
    try:
        moved = moved_into(folder)
    except ConfigError:  # not writable there
        folder, moved = fresh()
    tracker: AttemptTracker | None = None
    try:
        tracker = begin(moved)
    except LedgerInUse:  # a live run's too
        folder, moved = fresh()
        try:
            tracker = begin(moved)
        except Exception as exc:
            _no_ledger(exc)
    except Exception as exc:  # its ledger cannot be kept there: its outputs still go there
        _no_ledger(exc)
    _logger.warning(
        "otel_mindformers: %s: this run writes its files in %s instead (two runs share this output "
        "folder; give each its own json_log_path)",
        busy, folder,
    )  # fmt: skip
    return tracker, moved


def _no_ledger(exc: Exception) -> None:
    _logger.warning("otel_mindformers: cannot keep the job's ledger (%s); attempts are not tracked", exc)


def previous_attempt_link(tracker: AttemptTracker | None) -> list[Link]:
    """A link to the previous attempt's run span, when its ids are in the ledger."""
    return _link_to(tracker.previous if tracker is not None else None)


def _link_to(previous: dict[str, Any] | None) -> list[Link]:
    if not previous or not previous.get("trace_id") or not previous.get("span_id"):
        return []
    try:
        context = SpanContext(
            int(previous["trace_id"], 16),
            int(previous["span_id"], 16),
            is_remote=True,
            trace_flags=TraceFlags(TraceFlags.SAMPLED),
        )
    except (TypeError, ValueError):
        return []
    attributes: dict[str, AttributeValue] = {
        names.ATTR_ATTEMPT: int(previous.get("attempt") or 0),
        "link.type": "previous_attempt",
    }
    return [Link(context, attributes)]


def record_killed_attempt(telemetry: Any, step_ids: Any, tracker: AttemptTracker | None) -> None:
    """The previous attempt's run span, when it was killed (its own never ended, so it was
    never exported): recorded now with its ids, from its train begin to its last heartbeat,
    so the link from this run span resolves in the trace backend."""
    if tracker is None or step_ids is None:
        return
    previous = tracker.previous
    if not previous or previous.get("outcome") != names.OUTCOME_KILLED:
        return
    try:
        trace_id, span_id = int(previous["trace_id"], 16), int(previous["span_id"], 16)
    except (KeyError, TypeError, ValueError):
        return
    from opentelemetry.trace import Status, StatusCode

    from otel_mindformers.names import semconv
    from otel_mindformers.restarts.goodput import attempt_end

    with step_ids.preset_ids(trace_id, span_id):
        span = telemetry.tracer.start_span(
            semconv.SPAN_RUN,
            context=_parent_of(previous, trace_id),
            links=_link_to(tracker.history[-2] if len(tracker.history) > 1 else None),
            start_time=int(float(previous.get("train_begin") or previous["process_start"]) * 1e9),
            attributes={
                names.ATTR_ATTEMPT: int(previous["attempt"]),
                names.ATTR_ATTEMPT_ID: str(previous.get("attempt_id")),
                semconv.ATTR_JOB_ID: tracker.job_id,
                semconv.ATTR_RANK: int(previous.get("rank") or 0),
                semconv.ATTR_STEP: int(previous.get("last_step") or 0),
                "training.job.attempt.outcome": names.OUTCOME_KILLED,
                "training.job.attempt.recorded_by": tracker.attempt_id,
            },
        )
    span.set_status(Status(StatusCode.ERROR, f"{names.OUTCOME_KILLED}: {names.INFERRED_KILL}"))
    span.end(end_time=int(attempt_end(previous) * 1e9))
    telemetry.flush_soon()  # this attempt may be killed too before the batch goes out


def _parent_of(previous: dict[str, Any], trace_id: int) -> Any:
    """The context the killed attempt's run span started in: its launcher's span (from the
    ledger), else none."""
    from opentelemetry import context as otel_context
    from opentelemetry import trace

    try:
        parent = int(previous["parent_span_id"], 16)
    except (KeyError, TypeError, ValueError):
        return otel_context.Context()
    launcher = SpanContext(trace_id, parent, is_remote=True, trace_flags=TraceFlags(TraceFlags.SAMPLED))
    return trace.set_span_in_context(trace.NonRecordingSpan(launcher))


def run_span_attributes(tracker: AttemptTracker) -> dict[str, Any]:
    """What the run span says about the attempt at its start."""
    attributes: dict[str, Any] = {names.ATTR_RESUME_STEP: int(tracker.entry["resume_step"])}
    rows = tracker.timeline["attempts"]
    if len(rows) > 1:
        previous = rows[-2]
        attributes[names.ATTR_LOST_STEPS] = previous["lost_steps"]
        attributes[names.ATTR_PREVIOUS_OUTCOME] = previous["outcome"]
    return attributes


class JobGauges:
    """The job gauges' sources for the run (until `observables` closes), read by the metric
    reader's thread from the tracker's last write."""

    def __init__(self, observables: RunObservables, tracker: AttemptTracker, point_attributes: dict[str, Any]) -> None:
        self._tracker = tracker
        self._attributes = dict(point_attributes)
        observables.observe(names.JOB_GOODPUT, self._goodput)
        observables.observe(names.JOB_ATTEMPT, self._attempt)
        observables.observe(names.JOB_NO_PROGRESS_ATTEMPTS, self._no_progress)

    def _goodput(self, _options: CallbackOptions) -> Iterator[Observation]:
        value = self._tracker.job_goodput
        if value is not None:
            yield Observation(value, self._attributes)

    def _attempt(self, _options: CallbackOptions) -> Iterator[Observation]:
        yield Observation(self._tracker.attempt, self._attributes)

    def _no_progress(self, _options: CallbackOptions) -> Iterator[Observation]:
        yield Observation(self._tracker.no_progress_attempts, self._attributes)


def first_step(tracker: AttemptTracker, run_span: Any, begin: float, end: float) -> None:
    """The attempt's first step (training thread, once): the downtime goes on the run span."""
    tracker.first_step(begin, end)
    previous = tracker.previous
    if previous is not None and run_span is not None:
        from otel_mindformers.restarts.goodput import attempt_end

        run_span.set_attribute(names.ATTR_DOWNTIME, tracker.entry["first_step_end"] - attempt_end(previous))


def end_attempt(
    tracker: AttemptTracker, outcome: str, reason: str | None, step: int, run_span: Any, alerts: Any, threshold: int
) -> str:
    """Close the attempt; the job's totals on the run span; the no-progress alert. Returns
    the end-of-run notice's line about the job."""
    global _previous_run_end
    _previous_run_end = time.time()
    tracker.end(outcome, reason, step)
    totals = tracker.timeline["totals"]
    if run_span is not None:
        attributes = {
            "training.job.attempts": totals["attempts"],
            "training.job.lost_steps_total": totals["lost_steps"],
            "training.job.downtime_total": totals["downtime_seconds"],
        }
        if totals["goodput"] is not None:
            attributes["training.job.goodput"] = totals["goodput"]
        run_span.set_attributes(attributes)
    streak = totals["no_progress_attempts"]
    if streak >= threshold:
        message = (
            f"{streak} attempts in a row ended without passing step {totals['furthest_step']} "
            f"(job {tracker.job_id}, attempt {tracker.attempt})"
        )
        _logger.warning("otel_mindformers: no progress across restarts: %s", message)
        if alerts is not None:
            try:
                alerts.raise_alert(
                    names.RULE_NO_PROGRESS, message, value=streak, threshold=threshold, severity="critical"
                )
            except Exception as exc:
                _logger.warning("otel_mindformers: the no-progress alert failed: %s", exc)
    goodput = totals["goodput"]
    share = "-" if goodput is None else f"{goodput:.1%}"
    return (
        f"job {tracker.job_id}: attempt {tracker.attempt}, job goodput {share}, "
        f"{totals['lost_steps']} lost steps, {totals['downtime_seconds']:.1f} s down"
    )


def phases_between_steps(breakdown: dict[str, float]) -> tuple[float, float]:
    """(evaluation, user phases) seconds of a record's time breakdown (timing/time_ledger.py)."""
    user = sum(seconds for key, seconds in breakdown.items() if key.startswith(phase_names.USER_PHASE_PREFIX))
    return breakdown.get(phase_names.PHASE_EVALUATION, 0.0), user


class LedgerEntry(RunPart):
    """The run's entry in the job's ledger, begun before any other part (the job id and the
    attempt are the telemetry's resource). Its `end` is the last: it closes the entry only
    when the attempt's part (below) did not start."""

    def __init__(self, tracker: AttemptTracker) -> None:
        self.tracker = tracker
        self.ended = False

    def end(self, ending: RunEnding) -> None:
        if not self.ended:
            self.ended = True
            self.tracker.end(ending.outcome, ending.reason, ending.last_step)


class AttemptPart(RunPart):
    """The run as an attempt of its job, once the run span exists: the link to the previous
    attempt, the job gauges, the downtime at the first step, checkpoint saves, each
    record's share, and the attempt's end (before the run span ends and the notice goes)."""

    def __init__(
        self,
        entry: LedgerEntry,
        telemetry: Any,
        step_ids: Any,
        run_span: Any,
        alerts: Any,
        point_attributes: dict[str, Any],
        no_progress_attempts: int,
    ) -> None:
        self._entry = entry
        self._tracker = tracker = entry.tracker
        self._run_span = run_span
        self._alerts = alerts
        self._no_progress_attempts = no_progress_attempts
        span_context = run_span.get_span_context()
        parent = getattr(run_span, "parent", None)  # an SDK span's parent SpanContext
        tracker.link_run_span(span_context.trace_id, span_context.span_id, parent.span_id if parent else None)
        JobGauges(telemetry.observables, tracker, point_attributes)
        record_killed_attempt(telemetry, step_ids, tracker)

    def on_first_step(self, begin: float, end: float) -> None:
        first_step(self._tracker, self._run_span, begin, end)

    def on_record(self, record: StepRecord) -> None:
        """The run's data wait, evaluations and user phases go to the attempt's ledger
        (badput for the job, as for the run), and the job's fields to the line."""
        breakdown = record.time_breakdown
        self._tracker.note_data_wait(breakdown.get(phase_names.PHASE_DATA_WAIT, 0.0), record.step)
        # A last step sampled at train end: its breakdown holds what ran after the step
        # (Model.fit's last evaluation), which the job counts after the steps (`other`).
        if not record.is_last:
            self._tracker.note_phases(*phases_between_steps(breakdown))
        record.job = self._tracker.line_fields()

    def on_checkpoint(self, step: int, seconds: float) -> None:
        self._tracker.checkpoint_saved(step, seconds)

    def end(self, ending: RunEnding) -> None:
        self._entry.ended = True
        ending.job_line = end_attempt(
            self._tracker, ending.outcome, ending.reason, ending.last_step, self._run_span, self._alerts,
            self._no_progress_attempts,
        )  # fmt: skip


__all__ = [
    "AttemptPart", "JobGauges", "LedgerEntry", "begin_attempt", "end_attempt", "first_step", "phases_between_steps",
    "previous_attempt_link", "record_killed_attempt", "run_span_attributes",
]  # fmt: skip
