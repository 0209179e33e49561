"""`MonitorRun`: everything one monitored training run owns, from its first step to its end.

It exists only while a run does (MonitorCallback creates it at train begin and drops it at
train end), so no hook asks "is a run going on?" beyond one `None` check. It starts the
subsystems (telemetry, outputs, the sampled-step pipeline, devices, alerts, the run span),
tears down whatever it started if a later one fails, builds each sampled step's
StepRecord on the training thread (the readback, the clock readings, one put: the rest is
the pipeline worker's), and closes everything within one deadline.
"""

from __future__ import annotations

import dataclasses
import math
import os
import signal
import time
from collections.abc import Callable
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.trace import Status, StatusCode

from otel_mindformers.captures.controller import NO_CAPTURES, CaptureController
from otel_mindformers.config import MonitorConfig
from otel_mindformers.core.clock import StepClock, WallClock
from otel_mindformers.core.deadline import Deadline
from otel_mindformers.core.guarded_log import get_logger
from otel_mindformers.core.step_record import StepRecord
from otel_mindformers.hangs.diagnosis_file import diagnosis_path
from otel_mindformers.hangs.dumps import StackDumper
from otel_mindformers.hangs.heartbeat_gauges import Heartbeat
from otel_mindformers.job.identity import Identity, detect_identity
from otel_mindformers.job.resume import step_offset
from otel_mindformers.model_state.inbox import INBOX
from otel_mindformers.names import semconv
from otel_mindformers.names import training as tm
from otel_mindformers.names.phase_names import PHASE_DATA_WAIT
from otel_mindformers.nonfinite.first_nonfinite import FirstNonFinite
from otel_mindformers.outputs import SinkFanout, build_sinks
from otel_mindformers.outputs.paths import prepare_output_paths
from otel_mindformers.outputs.runs import set_aside_unless_resumed
from otel_mindformers.restarts import run_attempt as job_attempt
from otel_mindformers.runtime.cadence import Cadence
from otel_mindformers.runtime.extract import OutputReader, ScheduledRate, watch_lr_schedulers
from otel_mindformers.runtime.pipeline import SampledStepPipeline
from otel_mindformers.runtime.state_reader import StateReader
from otel_mindformers.stragglers.rank_signal import RankSections
from otel_mindformers.telemetry.job_info import JobInfo
from otel_mindformers.telemetry.log_bridge import LogBridge, RunCorrelation
from otel_mindformers.telemetry.providers import build_telemetry, service_name
from otel_mindformers.telemetry.step_ids import StepSpanIds
from otel_mindformers.telemetry.training_instruments import TrainingInstruments
from otel_mindformers.timing.accounting import StepAccounting, Window
from otel_mindformers.timing.efficiency import StepEfficiency
from otel_mindformers.timing.timeline import RunTimeline

_logger = get_logger(__name__)

# Local outputs get at least this long to write what is queued at train end, whatever
# `shutdown_timeout` says: the deadline is for the network, and the last line is on disk first.
LOCAL_DRAIN_SECONDS = 10.0


def launcher_context() -> otel_context.Context:
    """W3C trace context handed down by the launcher in TRACEPARENT/TRACESTATE/BAGGAGE
    (the OTel environment-carrier convention; msrun passes its environment to workers)."""
    carrier = {
        header: os.environ[var]
        for header, var in (("traceparent", "TRACEPARENT"), ("tracestate", "TRACESTATE"), ("baggage", "BAGGAGE"))
        if var in os.environ
    }
    return propagate.extract(carrier)


class MonitorRun:
    """Start with `MonitorRun.start(...)`; the training thread reads `clock`, `cadence` and
    `stop_pending` on every step and calls `sample` on sampled ones."""

    def __init__(self, config: MonitorConfig, providers: dict[str, Any], identity: Identity, cb_params: Any) -> None:
        """What the run knows before any subsystem starts; `start` brings them up."""
        self.config = config
        self.identity = identity
        self._providers = providers
        reports_training = config.reports_training_metrics(identity.rank)
        self._reports_training = reports_training
        self._reader = OutputReader(config.monitored_metrics if reports_training else [], config.grad_monitor)
        # `nonfinite_check: all_ranks`: the ranks that do not report still read their own
        # loss and grad norm on sampled steps, only to name the first rank that goes bad, and
        # the overflow flag, which says when an infinite grad norm is loss scaling at work.
        self._local_reader = (
            OutputReader([tm.LOSS, tm.GRAD_NORM, tm.OVERFLOW], None)
            if config.nonfinite_check == "all_ranks" and not reports_training
            else None
        )
        self._epoch_steps = int(cb_params.get("batch_num") or 0)
        alerts_config = config.alert_config
        # A NaN/Inf loss stops the run before the next step starts: checked where it is read.
        self._stop_on_nonfinite_loss = bool(
            alerts_config.enable_alert and alerts_config.nonfinite and alerts_config.stop_on_nonfinite
        )
        # The job's step: MindSpore's count starts again at 1 after a resume (job/resume.py).
        self.step_offset = step_offset(cb_params)
        first_step = int(cb_params.get("cur_step_num") or 0) + self.step_offset
        self._first_step = first_step
        self._cb_params = cb_params  # one object for the whole run: the step of a checkpoint save
        # One clock for the hot path; wall time derived from it only on sampled steps.
        self.wall_clock = WallClock()
        self.clock = StepClock()
        self.clock.step, self.clock.last_step_end = first_step, self.wall_clock.perf0
        self.clock.step_begin, self.clock.step_offset = self.wall_clock.perf0, self.step_offset
        self.cadence = Cadence(config.interval, config.step_spans, first_step, self.wall_clock.perf0, self.clock)
        self.stop_pending: str | None = None  # set by the pipeline's worker thread (with clock.wake)
        # Captures (captures/controller.py): the training thread reads `captures.active`.
        self.captures: Any = NO_CAPTURES
        self.stop_reason: str | None = None
        # What has started, so a failed start or the end closes exactly that.
        self.telemetry: Any = None
        self.devices: Any = None
        self.alerts: Any = None
        self.stacks: StackDumper | None = None
        self.run_span: Any = None
        # Phases parent on the run span once it exists (the launcher's context before).
        self._run_context: otel_context.Context = launcher_context()
        self.pipeline: SampledStepPipeline | None = None
        self.logs: LogBridge | None = None
        self._epoch_span: Any = None
        self.timeline: RunTimeline | None = None
        self._unwatch_lr: Callable[[], None] | None = None  # LearningRateScheduler instances' (extract.py)
        self._first_nonfinite: FirstNonFinite | None = None
        self._state_reader: StateReader | None = None
        self._ended_at: float | None = None  # perf seconds at train end (finish)
        self.attempt: Any = None  # this run's entry in the job's ledger (restarts/run_attempt.py)
        self._attempt_first_step = True

    @classmethod
    def start(cls, config: MonitorConfig, cb_params: Any, providers: dict[str, Any]) -> MonitorRun:
        """Bring every subsystem up. A bad setting raises ConfigError (before the first step);
        anything else that fails tears down what started and is raised to the caller."""
        identity = detect_identity()
        if config.job_id:
            identity = dataclasses.replace(identity, job_id=config.job_id)
        prepare_output_paths(config, identity)
        run = cls(config, providers, identity, cb_params)
        try:
            run._start(cb_params)
        except BaseException:
            run._close(error=None, timeout=1.0)
            raise
        return run

    def _start(self, cb_params: Any) -> None:
        self.attempt = attempt = job_attempt.begin_attempt(
            self.config, self.identity, self._first_step, self.clock, self.wall_clock, []
        )
        self._attempt_first_step = attempt is not None
        if attempt is not None:
            self.identity = dataclasses.replace(
                self.identity,
                job_id=attempt.job_id,
                job_id_from_ledger=not self.identity.job_id,
                attempt=attempt.attempt,
                attempt_id=attempt.attempt_id,
            )
        config, identity = self.config, self.identity
        reports_training = self._reports_training
        # The previous run's stack dumps and first non-finite value are not this run's.
        set_aside_unless_resumed(diagnosis_path(config.json_log_path, identity.rank), self._first_step)
        self.telemetry = telemetry = build_telemetry(config.telemetry, identity, **self._providers)
        # MindFormers' training-state readings and the 7-tuple's local norms (model_state/).
        if reports_training:
            self._state_reader = StateReader.start(config.mindformers_native, config.grad_monitor)
            INBOX.step_offset = self.step_offset
        if config.nonfinite_check == "all_ranks":
            self._first_nonfinite = FirstNonFinite(telemetry.meter, telemetry.logger, identity, config.json_log_path)
        first_step, wall_clock = self._first_step, self.wall_clock

        self.devices = self._start_devices()
        self.captures = CaptureController.start(config.alert_config.capture, identity, telemetry, cb_params, self.clock)
        # Every monitored run answers SIGUSR1 with a stack dump (the stall runbook's advice),
        # alerts on or off. Started here, on the training thread: the thread the dumps watch.
        self.stacks = StackDumper.start(config.json_log_path, identity, telemetry.logger, self.clock)
        # After the clock is set: the stall watchdog arms at the first step finished after it.
        self.alerts = self._start_alerts()
        self.run_span = telemetry.tracer.start_span(
            semconv.SPAN_RUN,
            context=launcher_context(),
            attributes={
                **identity.attributes(),
                "training.epochs": int(cb_params.get("epoch_num") or 0),
                **(job_attempt.run_span_attributes(attempt) if attempt is not None else {}),
            },
            links=job_attempt.previous_attempt_link(attempt),
        )
        self._run_context = trace.set_span_in_context(self.run_span)
        self.stacks.attach_run_span(self.run_span)
        if attempt is not None:
            span_context = self.run_span.get_span_context()
            parent = getattr(self.run_span, "parent", None)  # an SDK span's parent SpanContext
            attempt.link_run_span(span_context.trace_id, span_context.span_id, parent.span_id if parent else None)
            job_attempt.JobGauges(telemetry.observables, attempt, identity.point_attributes())
        # Phases (start-up, data wait, evaluation, checkpoints, `otel_mindformers.phase`): the
        # training thread's clock reads; their time goes to the pipeline worker's ledger. Their
        # spans carry the rank only (the rest of the identity is the resource's): a user phase
        # is paid for on the training thread, by the attribute.
        self.timeline = RunTimeline(
            tracer=telemetry.tracer, meter=telemetry.meter, parent_span=self._phase_parent,
            span_attributes=identity.point_attributes(), point_attributes=identity.point_attributes(),
            clock=self.clock, on_charged=self._phase_charged,
            callbacks=cb_params.get("list_callback"),
        )  # fmt: skip
        # The rate a LearningRateScheduler listed before us replaces at the step's end.
        self._unwatch_lr = watch_lr_schedulers(cb_params.get("list_callback"), self._reader)
        if attempt is not None:
            attempt.note_checkpoint_load(
                sum(p.seconds for p in self.timeline.before if p.name == job_attempt.PHASE_CHECKPOINT_LOAD)
            )
        # Every rank times its steps; goodput, MFU and ETA are the reporting rank's.
        efficiency = StepEfficiency(
            config.monitored_metrics if reports_training else [], config, cb_params, identity.device_target
        )
        accounting = StepAccounting(
            wall_clock=wall_clock, monitored=config.monitored_metrics, efficiency=efficiency,
            batch_size=_batch_size(cb_params), tokens_per_sample=efficiency.tokens_per_sample,
            before=self.timeline.before,
        )  # fmt: skip
        # Every rank's heartbeat, read by the metric reader's thread from the clock.
        Heartbeat.start(telemetry.observables, self.clock, identity.point_attributes())
        JobInfo(telemetry.observables, identity)  # the layout, where the resource could not carry it
        step_ids = StepSpanIds.install(telemetry.tracer)
        job_attempt.record_killed_attempt(telemetry, step_ids, attempt)
        self.pipeline = SampledStepPipeline(
            tracer=telemetry.tracer,
            instruments=TrainingInstruments(telemetry.meter),
            run_span=self.run_span,
            accounting=accounting,
            devices=self.devices.snapshot if self.devices is not None else None,
            point_attributes=identity.point_attributes(),
            wants_span=self.cadence.wants_span,
            alerts=self.alerts,
            sinks=SinkFanout(build_sinks(config.outputs, identity, reports_training, first_step)),
            on_stop_request=self._request_stop,
            phases=self.timeline.recorder,
            step_ids=step_ids,
            captures=self.captures,
            # Every rank's section times and straggler signal, whatever `report_ranks` says.
            sections=RankSections(telemetry.meter, telemetry.logger, identity, config.stragglers),
            complete=self.complete_sample,
            job_progress=self._job_progress if attempt is not None else None,
        )
        self.timeline.defer_to(self.pipeline, step_ids)
        self.logs = LogBridge.start(
            config.logs, telemetry.logger_provider, RunCorrelation(identity.rank, self.clock, self.cadence, step_ids)
        )
        self.clock.phase = "step"

    def _start_devices(self) -> Any:
        if not self.config.device_monitor:
            return None
        from otel_mindformers.devices import DeviceTelemetry

        return DeviceTelemetry.start(self.config.device_config, self.identity, self.telemetry.observables)

    def _start_alerts(self) -> Any:
        from otel_mindformers.alerts import AlertEngine

        config = self.config
        ignored = config.alert_config.ignored_while_off()
        if ignored:
            _logger.warning("otel_mindformers: %s", ignored)
        return AlertEngine.start(
            config.alert_config,
            self.identity,
            self.telemetry,
            self.clock,
            job=service_name(config.telemetry),
            reports_training=config.reports_training_metrics(self.identity.rank),
            json_log_path=config.json_log_path,
            captures=self.captures,
            stacks=self.stacks,
        )

    # --- epochs (training thread, once per epoch) ---------------------------------------------
    def begin_epoch(self, epoch: int) -> None:
        self._epoch_span = self.telemetry.tracer.start_span(
            semconv.SPAN_EPOCH, context=self._run_context, attributes={semconv.ATTR_EPOCH: epoch}
        )

    def _phase_parent(self) -> Any:
        """Phases are children of the epoch span while one is open, else of the run span."""
        epoch = self._epoch_span
        return epoch if epoch is not None else self.run_span

    def end_epoch(self) -> None:
        if self._epoch_span is not None:
            self._epoch_span.end()
            self._epoch_span = None

    # --- sampled steps (training thread) -------------------------------------------------------
    def sample(
        self,
        cb_params: Any,
        step: int,
        previous_end: float,
        end: float,
        *,
        is_last: bool = False,
        breakdown_at: float = 0.0,
    ) -> None:
        """Read the step's outputs and hand them to the pipeline with the window's clock
        readings: what only the training thread can know, in one tuple. The StepRecord is
        built on the worker (`complete_sample`), the rest of it there too (accounting.py):
        inside Model.train every object this path touches is cold after the compiled step
        (docs/performance.md), so it touches few."""
        steps, elapsed = self.cadence.close_window(step, end)
        values = self._reader.read(cb_params, step) if self._reader.reads_anything else {}
        model_state = None
        if self._state_reader is not None:
            routed, model_state = self._state_reader.read(cb_params, step - steps)
            if routed:
                values.update(routed)
        if self._first_nonfinite is not None:
            local = self._local_reader.read(cb_params, step) if self._local_reader is not None else values
            self._first_nonfinite.check(step, local, self.run_span)
        captures = self.captures
        if captures.notes_batches:  # read only where a batch capture may want it
            captures.note_batch(cb_params, step)
        if self._stop_on_nonfinite_loss:
            loss = values.get(tm.LOSS)
            if loss is not None and not math.isfinite(loss):
                self.stop_pending = f"non-finite loss ({loss}) at step {step}"
        clock = self.clock
        if self._attempt_first_step:  # the attempt's first step, once (False without an attempt)
            self._attempt_first_step = False
            job_attempt.first_step(self.attempt, self.run_span, clock.step_begin, end)
        data_wait, clock.data_wait = clock.data_wait, 0.0  # the window's data wait, taken in this frame
        phases, clock.phases = clock.phases, 0.0  # the window's evaluations, saves: not step time
        self.pipeline.submit_sample(  # type: ignore[union-attr]  # set by start(), before any step
            (
                step, cb_params.get("cur_epoch_num"), values, model_state, is_last,
                steps, elapsed, previous_end, clock.step_begin, end, data_wait, phases, breakdown_at,
            )
        )  # fmt: skip

    def complete_sample(self, sampled: tuple) -> tuple[StepRecord, Window]:
        """The pipeline worker's half of `sample`: the StepRecord and its Window."""
        step, epoch, values, model_state, is_last, *readings = sampled
        window = Window(*readings)
        wall = self.wall_clock.wall
        record = StepRecord(
            step=step,
            epoch=int(epoch) if epoch else self._epoch_of_step(step),
            rank=self.identity.rank,
            time_stamp=wall(window.end),
            steps_in_window=window.steps,
            values=values,
            is_last=is_last,
            started_at=wall(window.previous_end),
            model_state=model_state or None,
        )
        return record, window

    def _job_progress(self, record: StepRecord) -> None:
        """The pipeline worker's, once the record's time is accounted: the run's data wait
        goes to the attempt's ledger (badput for the job), and the job's fields to the line."""
        attempt = self.attempt  # passed to the pipeline only with an attempt
        attempt.note_data_wait(record.time_breakdown.get(PHASE_DATA_WAIT, 0.0), record.step)
        record.job = attempt.line_fields()

    def _phase_charged(self, phase: str, seconds: float) -> None:
        """An outermost phase ended on the training thread (its seconds reach the pipeline
        worker's ledger through the timeline)."""
        if phase == job_attempt.PHASE_CHECKPOINT_SAVE and self.attempt is not None:
            # The step the checkpoint holds: the callback saving it may run before ours.
            self.attempt.checkpoint_saved(int(self._cb_params.get("cur_step_num") or 0) + self.step_offset, seconds)

    def _request_stop(self, reason: str) -> None:
        """A rule asked to stop (worker thread): honoured at the next step boundary."""
        if self.stop_pending is None and self.stop_reason is None:
            self.stop_pending = reason
            self.clock.wake = True  # the training thread honours it at the next step end

    @property
    def scheduled_rate(self) -> ScheduledRate | None:
        """What the run's LearningRateScheduler instances noted (None without one): custom
        monitors' `cb_params.learning_rate` reads it as the sampled step does."""
        return self._reader.scheduled

    def honour_stop(self, run_context: Any) -> None:
        """Training thread: stop after this step, once, and say why."""
        reason, self.stop_pending = self.stop_pending, None
        if self.stop_reason is not None or reason is None:
            return
        self.stop_reason = reason
        self.run_span.add_event("early_stop", {"reason": reason, semconv.ATTR_STEP: self.clock.step})
        self.run_span.set_attribute(semconv.ATTR_STOP_REASON, reason)
        _logger.warning("otel_mindformers: stopping training at step %d: %s", self.clock.step, reason)
        run_context.request_stop()

    def _epoch_of_step(self, step: int) -> int:
        """The epoch when cb_params has none: from the step and the epoch's length."""
        return (step - 1) // self._epoch_steps + 1 if self._epoch_steps else 1

    # --- end ---------------------------------------------------------------------------------
    def finish(self, cb_params: Any, error: BaseException | None) -> None:
        """Sample the last step if the cadence has not, then close everything within
        `shutdown_timeout` (local outputs: see LOCAL_DRAIN_SECONDS)."""
        self.clock.phase = "outside"
        step = self.clock.step
        if error is None and self.cadence.unsampled_last(step):
            try:
                # Taken now, after what ran since the last step (Model.fit's last evaluation,
                # a save at train end): its time breakdown holds them, so its wall does too;
                # its window ends at the last step, without them.
                if self.timeline is not None:
                    self.timeline.leave_out_trailing()
                self.sample(
                    cb_params,
                    step,
                    self.cadence.window_start,
                    self.clock.last_step_end,
                    is_last=True,
                    breakdown_at=time.perf_counter(),
                )
            except Exception as exc:  # the last record is telemetry: never fail the run's end
                _logger.warning("otel_mindformers: could not sample the last step %d: %s", step, exc)
        self._ended_at = time.perf_counter()
        self._close(error, self.config.shutdown_timeout)

    def _close(self, error: BaseException | None, timeout: float) -> None:
        """Close what started, in dependency order, within one deadline. Telemetry closes
        last and whatever failed before it: its close removes the run's observable sources,
        which on a borrowed provider would otherwise report this run after it ended."""
        remaining = Deadline(timeout).remaining
        try:
            self._close_subsystems(error, remaining)
        finally:
            if self.telemetry is not None:
                _quietly(self.telemetry.close, remaining())

    def _close_subsystems(self, error: BaseException | None, remaining: Callable[[], float]) -> None:
        """Each closer runs whatever the one before it did: a run span whose `end` raises (a
        broken tracer) still leaves no SIGUSR1 handler, log handler or thread behind."""
        if self.timeline is not None:
            _quietly(self.timeline.close)
        if self._unwatch_lr is not None:
            _quietly(self._unwatch_lr)
        _quietly(self.end_epoch)
        # The pipeline drains first, so a rule's stop reason and the last lines land before
        # the run span ends and the providers flush.
        if self.pipeline is not None:
            if self._ended_at is not None:  # compile settled, the run's time breakdown
                self.pipeline.end_run(self._ended_at)
            _quietly(self.pipeline.close, max(remaining(), LOCAL_DRAIN_SECONDS))
        _quietly(self.captures.close)  # after the pipeline: no request comes in behind it
        if self._state_reader is not None:
            _quietly(self._state_reader.close)
            self._state_reader = None
        job_line = _quietly(self._end_attempt, error)
        if self.run_span is not None:
            _quietly(self._end_run_span, error)
        if self.alerts is not None:
            _quietly(self._notify_run_end, error, job_line)
        if self.logs is not None:
            _quietly(self.logs.close)
        if self.alerts is not None:
            _quietly(self.alerts.shutdown, remaining())
        if self.stacks is not None:
            _quietly(self.stacks.stop)
        if self.devices is not None:
            _quietly(self.devices.shutdown)

    def _outcome(self, error: BaseException | None) -> tuple[str, str | None]:
        if error is not None:
            return outcome_of_error(error)
        reason = self.stop_reason or self.stop_pending
        if reason is not None:
            return "stopped", reason
        return "completed", None

    def _end_attempt(self, error: BaseException | None) -> str | None:
        """The attempt's end in the job's ledger; the notice's line about the job."""
        attempt, self.attempt = self.attempt, None
        if attempt is None:
            return None
        outcome, reason = self._outcome(error)
        try:
            return job_attempt.end_attempt(
                attempt, outcome, reason, self.clock.step, self.run_span, self.alerts,
                self.config.restarts.no_progress_attempts,
            )  # fmt: skip
        except Exception as exc:  # the ledger is telemetry: never mask the run's outcome
            _logger.warning("otel_mindformers: closing the job's attempt failed: %s", exc)
            return None

    def _notify_run_end(self, error: BaseException | None, job_line: str | None = None) -> None:
        outcome, reason = self._outcome(error)
        try:
            self.alerts.notify_run_end(outcome, reason, self.clock.step, job=job_line)
        except Exception as exc:  # a notice must not mask the run's outcome
            _logger.warning("otel_mindformers: run-end notice failed: %s", exc)

    def _end_run_span(self, error: BaseException | None) -> None:
        span, self.run_span = self.run_span, None
        if self.stop_reason is None and self.stop_pending is not None:
            self.stop_reason = self.stop_pending
            span.set_attribute(semconv.ATTR_STOP_REASON, self.stop_reason)
        if error is not None:
            outcome, reason = outcome_of_error(error)
            if outcome == "stopped" and self.stop_reason is None:  # Ctrl-C, a signal's exit
                span.set_attribute(semconv.ATTR_STOP_REASON, reason)
            span.record_exception(error)
            span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"))
        span.set_attribute(semconv.ATTR_STEP, self.clock.step)
        span.end()


def outcome_of_error(error: BaseException) -> tuple[str, str]:
    """How a run that an exception ended is written down: Ctrl-C, and an exit on purpose (a
    scheduler's SIGTERM whose handler saves a checkpoint and calls `sys.exit(143)`, or
    `sys.exit(0)`), stopped the run; anything else crashed it."""
    if isinstance(error, KeyboardInterrupt):
        return "stopped", "interrupted (KeyboardInterrupt: Ctrl-C or SIGINT)"
    if isinstance(error, SystemExit):
        code = error.code
        if code is None or code == 0:
            return "stopped", f"the process exited (sys.exit({code!r}))"
        # A shell's convention: 128 + N is "ended by signal N".
        if isinstance(code, int) and 128 < code < 128 + signal.NSIG:
            try:
                name = signal.Signals(code - 128).name
            except ValueError:  # a number no signal has
                pass
            else:
                return "stopped", f"the process exited on {name} (sys.exit({code}))"
    return "crashed", f"{type(error).__name__}: {error}"


def _quietly(close: Callable[..., Any], *args: Any) -> Any:
    """`close(*args)`'s result, or None when it raised (warned)."""
    try:
        return close(*args)
    except Exception as exc:  # shutting down telemetry must not mask the run's outcome
        _logger.warning("otel_mindformers: shutting down monitoring failed: %s", exc)
        return None


def _batch_size(cb_params: Any) -> int | None:
    """Samples per step from the dataset's metadata (no readback); None when it has none."""
    dataset = cb_params.get("train_dataset")
    try:
        return int(dataset.get_batch_size()) if dataset is not None else None
    except Exception:  # a dataset without batch metadata: no throughput, not a failure
        return None


__all__ = ["MonitorRun", "launcher_context"]
