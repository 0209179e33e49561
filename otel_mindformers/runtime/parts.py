"""A run's parts, one starter each; runtime/assembly.py calls them in the order they start,
and the run ends and closes them in reverse.

Each starter takes what it needs as typed arguments (the parts it depends on among them) and
returns what it made and its `RunPart` (core/run_part.py), or None when it has nothing to end
or close. The order is the dependency order, and its reverse is the shutdown order:

- the ledger entry first: the job id and the attempt are the telemetry's resource; its end
  is the last (it closes an entry that no later part closed);
- telemetry next, so it closes last: its close removes the run's observable sources, which
  on a borrowed provider would otherwise report this run after it ended;
- the flight recorder before any output: a dead run's tail goes to its outputs (and OTLP)
  before this run writes a line; its ring closes once the pipeline drained;
- devices, stacks, captures before the alerts that use them; logs after the alerts, so a
  warning of the alerts' shutdown still goes out; the run span after them, so it ends
  before the notice; the attempt after the run span, so its totals land on it; MindCluster
  (cluster/) after both: a fault ClusterD reports goes on the run span and into the attempt's
  ledger entry, and its pre-flight check runs before the first step;
- the pipeline last: its end drains what the training thread handed over (and what the
  timeline still holds) before the attempt, the run span and the notice are closed.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypedDict

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.metrics import NoOpMeter
from opentelemetry.trace import Span

from otel_mindformers.captures.controller import CaptureController, NoCaptures
from otel_mindformers.config import GradNorm, MonitorConfig
from otel_mindformers.core.clock import StepClock, WallClock
from otel_mindformers.core.guarded_log import get_logger
from otel_mindformers.core.run_part import Remaining, RunEnding, RunPart
from otel_mindformers.flight_recorder import recorder as flight_recorder
from otel_mindformers.flight_recorder.recorder import FlightRecorder, NoRecorder
from otel_mindformers.hangs.dumps import StackDumper
from otel_mindformers.hangs.heartbeat_gauges import Heartbeat
from otel_mindformers.job.identity import Identity
from otel_mindformers.model_state.grad_norm_probe import install_probes, remove_probes
from otel_mindformers.model_state.grad_norm_reader import GradNormReader
from otel_mindformers.model_state.inbox import INBOX
from otel_mindformers.names import semconv
from otel_mindformers.nonfinite.first_nonfinite import FirstNonFinite
from otel_mindformers.outputs import SinkFanout, build_sinks
from otel_mindformers.outputs.diagnosis_file import diagnosis_path
from otel_mindformers.outputs.runs import set_aside_unless_resumed
from otel_mindformers.restarts import run_attempt
from otel_mindformers.restarts.attempt_tracker import AttemptTracker
from otel_mindformers.runtime.cadence import Cadence
from otel_mindformers.runtime.extract import OutputReader, watch_lr_schedulers
from otel_mindformers.runtime.pipeline import SampledStepPipeline
from otel_mindformers.runtime.state_reader import StateReader
from otel_mindformers.runtime.training_loop import TrainingLoop
from otel_mindformers.stragglers.rank_signal import RankSections
from otel_mindformers.telemetry.export_ranks import RankExports
from otel_mindformers.telemetry.job_info import JobInfo
from otel_mindformers.telemetry.log_bridge import LogBridge, RunCorrelation
from otel_mindformers.telemetry.providers import OtlpExporters, Telemetry, build_telemetry, service_name
from otel_mindformers.telemetry.step_ids import StepSpanIds, job_trace_key
from otel_mindformers.timing.accounting import StepAccounting
from otel_mindformers.timing.efficiency import StepEfficiency
from otel_mindformers.timing.timeline import RunTimeline

if TYPE_CHECKING:  # imported where they start: their import is paid only when they are on
    from otel_mindformers.alerts import AlertEngine
    from otel_mindformers.devices import DeviceTelemetry

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
    launcher = propagate.extract(carrier)
    if "traceparent" in carrier and not trace.get_current_span(launcher).get_span_context().is_valid:
        _say_launcher_span_unread(carrier["traceparent"])
    return launcher


def _say_launcher_span_unread(traceparent: str) -> None:
    """Once: the launcher named its span and the run spans will not be its children."""
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    readable = trace.get_current_span(TraceContextTextMapPropagator().extract({"traceparent": traceparent}))
    why = (
        "the configured propagators do not read it (OTEL_PROPAGATORS, or the `propagator` section of "
        "OTEL_CONFIG_FILE, which without one has none): add tracecontext"
        if readable.get_span_context().is_valid
        else "it is not a W3C traceparent (00-<32 hex trace id>-<16 hex span id>-<2 hex flags>)"
    )
    _logger.warning_once(
        "TRACEPARENT",
        "otel_mindformers: TRACEPARENT=%s is ignored: %s; the run spans start traces of their own",
        # Escaped: a line break or terminal control in it would forge the log's next lines.
        traceparent[:60].encode("unicode_escape").decode("ascii"),
        why,
    )


class Providers(TypedDict):
    """The caller's tracer / meter / logger providers (None: the global ones, else the config's),
    and our OTLP exporters where the check before training built them (None: built at start)."""

    tracer_provider: Any
    meter_provider: Any
    logger_provider: Any
    checked_exporters: OtlpExporters | None


class Closes(RunPart):
    """A part whose only duty at the end is one call: `close()`, or `close(seconds)` with
    the deadline's remaining seconds when `timed`."""

    def __init__(self, close: Callable[..., Any], timed: bool = False) -> None:
        self._close = close
        self._timed = timed

    def close(self, remaining: Remaining) -> None:
        if self._timed:
            self._close(remaining())
        else:
            self._close()


def start_ledger_entry(
    config: MonitorConfig, identity: Identity, first_step: int, clock: StepClock, wall_clock: WallClock
) -> tuple[run_attempt.LedgerEntry | None, MonitorConfig, Identity]:
    """restarts/: the run's entry in the job's ledger; the identity takes its job and attempt,
    and the config the paths it writes at (another folder when another job's run lives there)."""
    # The config may come back writing elsewhere: another job's run lives at its paths.
    tracker, config = run_attempt.begin_attempt(config, identity, first_step, clock, wall_clock, [])
    if tracker is None:
        return None, config, identity
    identity = dataclasses.replace(
        identity,
        job_id=tracker.job_id,
        job_id_from_ledger=not identity.job_id,
        attempt=tracker.attempt,
        attempt_id=tracker.attempt_id,
    )
    return run_attempt.LedgerEntry(tracker), config, identity


def start_telemetry(
    config: MonitorConfig, identity: Identity, providers: Providers, clock: StepClock
) -> tuple[Telemetry, RankExports, StepSpanIds | None, RunPart]:
    """telemetry/: the providers (or the process's own), what this rank sends, and the step
    spans' ids: in the job step's trace, from the job id and attempt the ledger entry gave."""
    telemetry = build_telemetry(config.telemetry, identity, **providers)
    exports = RankExports.of(config, identity)
    job_key = job_trace_key(identity.job_id, identity.attempt)
    if job_key is None and identity.distributed:
        _logger.warning(
            "otel_mindformers: rank %d's step spans start traces of their own: without %s no rank can name "
            "the job step's trace (keep monitor_config.restarts on: its ledger numbers the attempts)",
            identity.rank,
            "a job id" if not identity.job_id else "an attempt number",
        )
    step_ids = StepSpanIds.install(telemetry.tracer, job_key)
    # Every rank's heartbeat, read by the metric reader's thread from the clock; the layout,
    # where the resource could not carry it. Both end with the telemetry's observables.
    Heartbeat.start(telemetry.observables, clock, identity.point_attributes())
    JobInfo(telemetry.observables, identity)
    return telemetry, exports, step_ids, Closes(telemetry.close, timed=True)


def start_flight_recorder(
    config: MonitorConfig,
    identity: Identity,
    wall_clock: WallClock,
    clock: StepClock,
    telemetry: Telemetry,
    attempt: AttemptTracker | None,
) -> FlightRecorder | NoRecorder:
    """flight_recorder/: the tails of this job's dead runs on this rank go to the outputs
    before any line of this run (and before its outputs set an earlier run's files aside);
    then this run's own ring, which the step hook writes the finished step into."""
    flight = flight_recorder.start(config, identity, wall_clock, telemetry.tracer, attempt.history if attempt else None)
    flight.attach(clock)
    return flight


def start_devices(
    config: MonitorConfig, identity: Identity, telemetry: Telemetry
) -> tuple[DeviceTelemetry | None, RunPart | None]:
    """devices/: the poll thread and its gauges, with `device_monitor` on."""
    if not config.device_monitor:
        return None, None
    from otel_mindformers.devices import DeviceTelemetry

    devices = DeviceTelemetry.start(config.device_config, identity, telemetry.observables)
    return devices, (Closes(devices.shutdown) if devices is not None else None)


def start_stacks(
    config: MonitorConfig, identity: Identity, first_step: int, telemetry: Telemetry, clock: StepClock
) -> tuple[StackDumper, RunPart]:
    """hangs/: every monitored run answers SIGUSR1 with a stack dump (the stall runbook's
    advice), alerts on or off. Started on the training thread: the thread the dumps watch."""
    # The previous run's stack dumps and first non-finite value are not this run's.
    set_aside_unless_resumed(diagnosis_path(config.json_log_path, identity.rank), first_step)
    stacks = StackDumper.start(config.json_log_path, identity, telemetry.logger, clock)
    return stacks, Closes(stacks.stop)


def start_captures(
    config: MonitorConfig, identity: Identity, telemetry: Telemetry, loop: TrainingLoop, clock: StepClock
) -> tuple[CaptureController | NoCaptures, RunPart]:
    """captures/: evidence when a rule fires or on demand; the training thread reads `active`."""
    captures = CaptureController.start(config.alert_config.capture, identity, telemetry, loop.step_view, clock)
    return captures, Closes(captures.close)


class _Alerts(RunPart):
    def __init__(self, engine: AlertEngine) -> None:
        self._engine = engine

    def end(self, ending: RunEnding) -> None:
        self._engine.notify_run_end(ending.outcome, ending.reason, ending.last_step, job=ending.job_line)

    def close(self, remaining: Remaining) -> None:
        self._engine.shutdown(remaining())


def start_alerts(
    config: MonitorConfig,
    identity: Identity,
    telemetry: Telemetry,
    clock: StepClock,
    reports_training: bool,
    captures: CaptureController | NoCaptures,
    stacks: StackDumper,
) -> tuple[AlertEngine | None, RunPart | None]:
    """alerts/: the rules, the notifiers and the stall watchdog, with `enable_alert` on.
    After the clock is set: the stall watchdog arms at the first step finished after it."""
    from otel_mindformers.alerts import AlertEngine

    ignored = config.alert_config.ignored_while_off(stall_used=config.cluster.tell)
    if ignored:
        _logger.warning("otel_mindformers: %s", ignored)
    engine = AlertEngine.start(
        config.alert_config,
        identity,
        telemetry,
        clock,
        job=service_name(config.telemetry),
        reports_training=reports_training,
        json_log_path=config.json_log_path,
        captures=captures,
        stacks=stacks,
    )
    return engine, (_Alerts(engine) if engine is not None else None)


def start_logs(
    config: MonitorConfig,
    identity: Identity,
    telemetry: Telemetry,
    exports: RankExports,
    step_ids: StepSpanIds | None,
    clock: StepClock,
    cadence: Cadence,
) -> RunPart | None:
    """telemetry/log_bridge.py: Python logging as OTel log records, with `logs` on."""
    # A rank that sends no step spans names none on its records.
    correlation = RunCorrelation(identity.rank, clock, cadence, step_ids if exports.spans else None)
    logs = LogBridge.start(config.logs, telemetry.logger_provider, correlation)
    return Closes(logs.close) if logs is not None else None


class _RunSpan(RunPart):
    def __init__(self, span: Span) -> None:
        self._span = span

    def end(self, ending: RunEnding) -> None:
        span = self._span
        stop = ending.stop_reason()  # honoured, or asked for too late to be
        if stop is not None:
            span.set_attribute(semconv.ATTR_STOP_REASON, stop)
        elif ending.error is not None and ending.outcome == "stopped":  # Ctrl-C, a signal's exit
            span.set_attribute(semconv.ATTR_STOP_REASON, ending.reason)
        if ending.error is not None:
            span.record_exception(ending.error)
            span.set_status(trace.Status(trace.StatusCode.ERROR, f"{type(ending.error).__name__}: {ending.error}"))
        span.set_attribute(semconv.ATTR_STEP, ending.last_step)
        span.end()


def start_run_span(
    identity: Identity,
    loop: TrainingLoop,
    telemetry: Telemetry,
    launcher: otel_context.Context,
    attempt: AttemptTracker | None,
    stacks: StackDumper,
) -> tuple[Span, otel_context.Context, RunPart]:
    """The run span: under the launcher's context, linked to the previous attempt's. Returns
    it with its context (the parent of the epochs and phases)."""
    span = telemetry.tracer.start_span(
        semconv.SPAN_RUN,
        context=launcher,
        attributes={
            **identity.attributes(),
            "training.epochs": loop.epochs,
            **(run_attempt.run_span_attributes(attempt) if attempt is not None else {}),
        },
        links=run_attempt.previous_attempt_link(attempt),
    )
    stacks.attach_run_span(span)
    return span, trace.set_span_in_context(span), _RunSpan(span)


def start_attempt(
    config: MonitorConfig,
    identity: Identity,
    ledger_entry: run_attempt.LedgerEntry | None,
    telemetry: Telemetry,
    step_ids: StepSpanIds | None,
    run_span: Span,
    alerts: AlertEngine | None,
) -> RunPart | None:
    """restarts/: the run as an attempt of its job, once the run span exists."""
    if ledger_entry is None:
        return None
    return run_attempt.AttemptPart(
        ledger_entry, telemetry, step_ids, run_span, alerts, identity.point_attributes(),
        config.restarts.no_progress_attempts,
    )  # fmt: skip


def start_grad_norm_probe(
    config: MonitorConfig,
    loop: TrainingLoop,
    clock: StepClock,
    first_step: int,
    reader: OutputReader,
    reports_training: bool,
) -> tuple[GradNormReader | None, RunPart | None]:
    """model_state/grad_norm_probe.py: with `grad_monitor: True`, the global gradient norm of
    a train cell that does not return it (MindFormers' cells do), measured in the step on
    every rank (their graphs stay alike; data-parallel ranks wait for the slowest anyway).
    Only `report_ranks` read it, and say why it is not reported: the other ranks never read
    it back. A custom loop has no train cell: its norm is the one `run.log` takes or computes."""
    network = loop.train_network
    if config.grad_norm is not GradNorm.MEASURED or network is None:
        return None, None
    if type(network).__module__.startswith("mindformers."):
        return None, None
    probed, why_not = install_probes(network)
    if not probed:
        if reports_training:
            _logger.warning("otel_mindformers: grad_monitor cannot measure the gradient norm: %s", why_not)
        return None, None
    if not reports_training:
        return None, Closes(lambda: remove_probes(probed))
    probe = GradNormReader([one.probe for one in probed], [one.name for one in probed], clock, first_step)
    reader.grad_norm_probe = probe

    def close() -> None:
        probe.close()
        remove_probes(probed)

    return probe, Closes(close)


def start_model_state(
    config: MonitorConfig, identity: Identity, telemetry: Telemetry, reports_training: bool, loop: TrainingLoop
) -> tuple[FirstNonFinite | None, StateReader | None, RunPart | None]:
    """model_state/: MindFormers' training-state readings and the 7-tuple's local norms (a
    train cell's), on the reporting ranks; `nonfinite_check: all_ranks`: each rank's first NaN/Inf."""
    first_nonfinite = None
    if config.nonfinite_check == "all_ranks":
        first_nonfinite = FirstNonFinite(telemetry.meter, telemetry.logger, identity, config.json_log_path)
    if not reports_training:
        return first_nonfinite, None, None
    reader = StateReader.start(config.mindformers_native, config.grad_norm, loop.train_network is not None)
    INBOX.step_offset = loop.step_offset
    return first_nonfinite, reader, Closes(reader.close)


def start_timeline(
    identity: Identity,
    telemetry: Telemetry,
    exports: RankExports,
    clock: StepClock,
    loop: TrainingLoop,
    reader: OutputReader,
    attempt: AttemptTracker | None,
    run_span: Span,
    phase_parent: Callable[[], Any],
    phase_charged: Callable[[str, float], None],
) -> tuple[RunTimeline, RunPart]:
    """timing/: phases (start-up, data wait, evaluation, checkpoints, `otel_mindformers.phase`)
    from the training thread's clock reads; those that ended before the run (a checkpoint
    load) go under the run span. Their spans carry the rank only (the rest of the identity is
    the resource's): a user phase is paid for on the training thread, by the attribute."""
    # `export_ranks.metrics`: a rank that sends no training metrics sends no phase durations either.
    meter = telemetry.meter if exports.metrics else NoOpMeter(semconv.INSTRUMENTATION_NAME)
    timeline = RunTimeline(
        tracer=telemetry.tracer, meter=meter, run_span=run_span, parent_span=phase_parent,
        span_attributes=identity.point_attributes(), point_attributes=identity.point_attributes(),
        clock=clock, on_charged=phase_charged, callbacks=loop.callbacks,
    )  # fmt: skip
    if attempt is not None:
        attempt.note_checkpoint_load(
            sum(p.seconds for p in timeline.before if p.name == run_attempt.PHASE_CHECKPOINT_LOAD)
        )
    # The rate a LearningRateScheduler listed before us replaces at the step's end.
    unwatch = watch_lr_schedulers(loop.callbacks, reader)

    def close() -> None:
        timeline.close()  # already done by the pipeline's end, unless the pipeline never started
        unwatch()

    return timeline, Closes(close)


class _Pipeline(RunPart):
    def __init__(self, pipeline: SampledStepPipeline, timeline: RunTimeline) -> None:
        self._pipeline = pipeline
        self._timeline = timeline

    def end(self, ending: RunEnding) -> None:
        """What the timeline still holds (an evaluation open at a crash, user phases still
        open) goes on the queue, then the queue drains and the outputs close: a rule's stop
        reason and the last lines land before the attempt, the run span and the notice end."""
        self._timeline.close()
        if ending.ended_at is not None:  # compile settled, the run's time breakdown
            self._pipeline.end_run(ending.ended_at)
        self._pipeline.close(max(ending.remaining(), LOCAL_DRAIN_SECONDS))


def start_pipeline(
    config: MonitorConfig,
    identity: Identity,
    loop: TrainingLoop,
    first_step: int,
    reports_training: bool,
    wall_clock: WallClock,
    cadence: Cadence,
    request_stop: Callable[[str], None],
    telemetry: Telemetry,
    exports: RankExports,
    step_ids: StepSpanIds | None,
    flight: FlightRecorder | NoRecorder,
    devices: DeviceTelemetry | None,
    captures: CaptureController | NoCaptures,
    alerts: AlertEngine | None,
    run_span: Span,
    timeline: RunTimeline,
) -> tuple[SampledStepPipeline, RunPart]:
    """runtime/pipeline.py: the sampled step's worker, its accounting and outputs."""
    # Every rank times its steps; goodput, MFU and ETA are the reporting rank's.
    monitored = config.monitored_metrics if reports_training else []
    network = loop.train_network if loop.train_network is not None else loop.network
    efficiency = StepEfficiency(monitored, config, network, loop.known_last_step, identity.device_target)
    accounting = StepAccounting(
        wall_clock=wall_clock, monitored=config.monitored_metrics, efficiency=efficiency,
        batch_size=loop.batch_size, tokens_per_sample=efficiency.tokens_per_sample, before=timeline.before,
    )  # fmt: skip
    sinks = SinkFanout(build_sinks(config.outputs, identity, reports_training, first_step))
    # Every rank's section times and straggler signal, whatever `report_ranks` says.
    sections = RankSections(telemetry.meter, telemetry.logger, identity, config.stragglers)
    pipeline = SampledStepPipeline(
        telemetry=telemetry, identity=identity, wall_clock=wall_clock, cadence=cadence, exports=exports,
        step_ids=step_ids, run_span=run_span, devices=devices, alerts=alerts, captures=captures,
        phases=timeline.recorder, flight=flight, request_stop=request_stop, epoch_steps=loop.steps_per_epoch,
        accounting=accounting, sinks=sinks, sections=sections,
    )  # fmt: skip
    timeline.defer_to(pipeline, step_ids)
    return pipeline, _Pipeline(pipeline, timeline)


__all__ = ["LOCAL_DRAIN_SECONDS", "Closes", "Providers", "launcher_context"]
