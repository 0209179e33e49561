"""A run's parts, in the order they start (`PARTS`); the run ends and closes them in reverse.

Each entry starts one part from the shared RunContext, may add what it made to the context
for the parts after it, and returns its `RunPart` (core/run_part.py), or None when it has
nothing to end or close. The order is the dependency order, and its reverse is the shutdown
order:

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
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.metrics import NoOpMeter

from otel_mindformers.captures.controller import CaptureController
from otel_mindformers.cluster.part import start_cluster
from otel_mindformers.compat import mindspore_model
from otel_mindformers.config import GradNorm
from otel_mindformers.core.guarded_log import get_logger
from otel_mindformers.core.run_part import Remaining, RunEnding, RunPart
from otel_mindformers.flight_recorder import recorder as flight_recorder
from otel_mindformers.hangs.dumps import StackDumper
from otel_mindformers.hangs.heartbeat_gauges import Heartbeat
from otel_mindformers.model_state.grad_norm_probe import install_probes, remove_probes
from otel_mindformers.model_state.grad_norm_reader import GradNormReader
from otel_mindformers.model_state.inbox import INBOX
from otel_mindformers.names import semconv
from otel_mindformers.nonfinite.first_nonfinite import FirstNonFinite
from otel_mindformers.outputs import SinkFanout, build_sinks
from otel_mindformers.outputs.diagnosis_file import diagnosis_path
from otel_mindformers.outputs.runs import set_aside_unless_resumed
from otel_mindformers.restarts import run_attempt
from otel_mindformers.runtime.extract import watch_lr_schedulers
from otel_mindformers.runtime.pipeline import SampledStepPipeline
from otel_mindformers.runtime.run_context import RunContext
from otel_mindformers.runtime.state_reader import StateReader
from otel_mindformers.stragglers.rank_signal import RankSections
from otel_mindformers.telemetry.export_ranks import RankExports
from otel_mindformers.telemetry.job_info import JobInfo
from otel_mindformers.telemetry.log_bridge import LogBridge, RunCorrelation
from otel_mindformers.telemetry.providers import build_telemetry, service_name
from otel_mindformers.telemetry.step_ids import StepSpanIds, job_trace_key
from otel_mindformers.timing.accounting import StepAccounting
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


def start_ledger_entry(ctx: RunContext) -> RunPart | None:
    """restarts/: the run's entry in the job's ledger; the identity takes its job and attempt,
    and the config the paths it writes at (another folder when another job's run lives there)."""
    # The config may come back writing elsewhere: another job's run lives at its paths.
    tracker, ctx.config = run_attempt.begin_attempt(
        ctx.config, ctx.identity, ctx.first_step, ctx.clock, ctx.wall_clock, []
    )
    if tracker is None:
        return None
    ctx.ledger_entry = entry = run_attempt.LedgerEntry(tracker)
    ctx.identity = dataclasses.replace(
        ctx.identity,
        job_id=tracker.job_id,
        job_id_from_ledger=not ctx.identity.job_id,
        attempt=tracker.attempt,
        attempt_id=tracker.attempt_id,
    )
    return entry


def start_telemetry(ctx: RunContext) -> RunPart:
    """telemetry/: the providers (or the process's own), what this rank sends, and the step
    spans' ids: in the job step's trace, from the job id and attempt the ledger entry gave."""
    ctx.telemetry = telemetry = build_telemetry(ctx.config.telemetry, ctx.identity, **ctx.providers)
    ctx.exports = RankExports.of(ctx.config, ctx.identity)
    identity = ctx.identity
    job_key = job_trace_key(identity.job_id, identity.attempt)
    if job_key is None and identity.distributed:
        _logger.warning(
            "otel_mindformers: rank %d's step spans start traces of their own: without %s no rank can name "
            "the job step's trace (keep monitor_config.restarts on: its ledger numbers the attempts)",
            identity.rank,
            "a job id" if not identity.job_id else "an attempt number",
        )
    ctx.step_ids = StepSpanIds.install(telemetry.tracer, job_key)
    # Every rank's heartbeat, read by the metric reader's thread from the clock; the layout,
    # where the resource could not carry it. Both end with the telemetry's observables.
    Heartbeat.start(telemetry.observables, ctx.clock, ctx.point_attributes())
    JobInfo(telemetry.observables, ctx.identity)
    return Closes(telemetry.close, timed=True)


def start_flight_recorder(ctx: RunContext) -> RunPart:
    """flight_recorder/: the tails of this job's dead runs on this rank go to the outputs
    before any line of this run (and before its outputs set an earlier run's files aside);
    then this run's own ring, which the step hook writes the finished step into."""
    attempt = ctx.attempt
    ctx.flight = flight = flight_recorder.start(
        ctx.config, ctx.identity, ctx.wall_clock, ctx.telemetry.tracer, attempt.history if attempt else None
    )
    flight.attach(ctx.clock)
    return flight


def start_devices(ctx: RunContext) -> RunPart | None:
    """devices/: the poll thread and its gauges, with `device_monitor` on."""
    if not ctx.config.device_monitor:
        return None
    from otel_mindformers.devices import DeviceTelemetry

    ctx.devices = devices = DeviceTelemetry.start(ctx.config.device_config, ctx.identity, ctx.telemetry.observables)
    return Closes(devices.shutdown) if devices is not None else None


def start_stacks(ctx: RunContext) -> RunPart:
    """hangs/: every monitored run answers SIGUSR1 with a stack dump (the stall runbook's
    advice), alerts on or off. Started on the training thread: the thread the dumps watch."""
    # The previous run's stack dumps and first non-finite value are not this run's.
    set_aside_unless_resumed(diagnosis_path(ctx.config.json_log_path, ctx.identity.rank), ctx.first_step)
    ctx.stacks = stacks = StackDumper.start(ctx.config.json_log_path, ctx.identity, ctx.telemetry.logger, ctx.clock)
    return Closes(stacks.stop)


def start_captures(ctx: RunContext) -> RunPart:
    """captures/: evidence when a rule fires or on demand; the training thread reads `active`."""
    config, telemetry = ctx.config, ctx.telemetry
    ctx.captures = captures = CaptureController.start(
        config.alert_config.capture, ctx.identity, telemetry, ctx.cb_params, ctx.clock
    )
    return Closes(captures.close)


class _Alerts(RunPart):
    def __init__(self, engine: Any) -> None:
        self._engine = engine

    def end(self, ending: RunEnding) -> None:
        self._engine.notify_run_end(ending.outcome, ending.reason, ending.last_step, job=ending.job_line)

    def close(self, remaining: Remaining) -> None:
        self._engine.shutdown(remaining())


def start_alerts(ctx: RunContext) -> RunPart | None:
    """alerts/: the rules, the notifiers and the stall watchdog, with `enable_alert` on.
    After the clock is set: the stall watchdog arms at the first step finished after it."""
    from otel_mindformers.alerts import AlertEngine

    config = ctx.config
    ignored = config.alert_config.ignored_while_off(stall_used=config.cluster.tell)
    if ignored:
        _logger.warning("otel_mindformers: %s", ignored)
    ctx.alerts = engine = AlertEngine.start(
        config.alert_config,
        ctx.identity,
        ctx.telemetry,
        ctx.clock,
        job=service_name(config.telemetry),
        reports_training=ctx.reports_training,
        json_log_path=config.json_log_path,
        captures=ctx.captures,
        stacks=ctx.stacks,
    )
    return _Alerts(engine) if engine is not None else None


def start_logs(ctx: RunContext) -> RunPart | None:
    """telemetry/log_bridge.py: Python logging as OTel log records, with `logs` on."""
    # A rank that sends no step spans names none on its records.
    step_ids = ctx.step_ids if ctx.exports.spans else None
    correlation = RunCorrelation(ctx.identity.rank, ctx.clock, ctx.cadence, step_ids)
    logs = LogBridge.start(ctx.config.logs, ctx.telemetry.logger_provider, correlation)
    return Closes(logs.close) if logs is not None else None


class _RunSpan(RunPart):
    def __init__(self, ctx: RunContext) -> None:
        self._ctx = ctx

    def end(self, ending: RunEnding) -> None:
        ctx = self._ctx
        span = ctx.run_span
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


def start_run_span(ctx: RunContext) -> RunPart:
    """The run span: under the launcher's context, linked to the previous attempt's."""
    attempt = ctx.attempt
    ctx.run_span = span = ctx.telemetry.tracer.start_span(
        semconv.SPAN_RUN,
        context=ctx.run_context,
        attributes={
            **ctx.identity.attributes(),
            "training.epochs": int(ctx.cb_params.get("epoch_num") or 0),
            **(run_attempt.run_span_attributes(attempt) if attempt is not None else {}),
        },
        links=run_attempt.previous_attempt_link(attempt),
    )
    ctx.run_context = trace.set_span_in_context(span)
    ctx.stacks.attach_run_span(span)
    return _RunSpan(ctx)


def start_attempt(ctx: RunContext) -> RunPart | None:
    """restarts/: the run as an attempt of its job, once the run span exists."""
    if ctx.attempt is None:
        return None
    return run_attempt.AttemptPart(
        ctx.ledger_entry, ctx.telemetry, ctx.step_ids, ctx.run_span, ctx.alerts, ctx.point_attributes(),
        ctx.config.restarts.no_progress_attempts,
    )  # fmt: skip


def start_grad_norm_probe(ctx: RunContext) -> RunPart | None:
    """model_state/grad_norm_probe.py: with `grad_monitor: True`, the global gradient norm of
    a train cell that does not return it (MindFormers' cells do), measured in the step on
    every rank (their graphs stay alike; data-parallel ranks wait for the slowest anyway)."""
    network = ctx.cb_params.get("train_network")
    if ctx.config.grad_norm is not GradNorm.MEASURED or type(network).__module__.startswith("mindformers."):
        return None
    probed, why_not = install_probes(network)
    if not probed:
        _logger.warning("otel_mindformers: grad_monitor cannot measure the gradient norm: %s", why_not)
        return None
    reader = GradNormReader([one.probe for one in probed], [one.name for one in probed], ctx.clock, ctx.first_step)
    ctx.grad_norm_probe = ctx.reader.grad_norm_probe = reader

    def close() -> None:
        reader.close()
        remove_probes(probed)

    return Closes(close)


def start_model_state(ctx: RunContext) -> RunPart | None:
    """model_state/: MindFormers' training-state readings and the 7-tuple's local norms,
    on the reporting ranks; `nonfinite_check: all_ranks`: each rank's first NaN/Inf."""
    config = ctx.config
    if config.nonfinite_check == "all_ranks":
        telemetry = ctx.telemetry
        ctx.first_nonfinite = FirstNonFinite(telemetry.meter, telemetry.logger, ctx.identity, config.json_log_path)
    if not ctx.reports_training:
        return None
    ctx.state_reader = reader = StateReader.start(config.mindformers_native, config.grad_norm)
    INBOX.step_offset = ctx.step_offset
    return Closes(reader.close)


def start_timeline(ctx: RunContext) -> RunPart:
    """timing/: phases (start-up, data wait, evaluation, checkpoints, `otel_mindformers.phase`)
    from the training thread's clock reads. Their spans carry the rank only (the rest of the
    identity is the resource's): a user phase is paid for on the training thread, by the attribute."""
    telemetry = ctx.telemetry
    # `export_ranks.metrics`: a rank that sends no training metrics sends no phase durations either.
    meter = telemetry.meter if ctx.exports.metrics else NoOpMeter(semconv.INSTRUMENTATION_NAME)
    ctx.timeline = timeline = RunTimeline(
        tracer=telemetry.tracer, meter=meter, parent_span=ctx.phase_parent,
        span_attributes=ctx.point_attributes(), point_attributes=ctx.point_attributes(),
        clock=ctx.clock, on_charged=ctx.phase_charged, callbacks=mindspore_model.callbacks(ctx.cb_params),
    )  # fmt: skip
    if ctx.attempt is not None:
        ctx.attempt.note_checkpoint_load(
            sum(p.seconds for p in timeline.before if p.name == run_attempt.PHASE_CHECKPOINT_LOAD)
        )
    # The rate a LearningRateScheduler listed before us replaces at the step's end.
    unwatch = watch_lr_schedulers(mindspore_model.callbacks(ctx.cb_params), ctx.reader)

    def close() -> None:
        timeline.close()  # already done by the pipeline's end, unless the pipeline never started
        unwatch()

    return Closes(close)


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


def start_pipeline(ctx: RunContext) -> RunPart:
    """runtime/pipeline.py: the sampled step's worker, its accounting and outputs."""
    config, identity, cb_params, telemetry = ctx.config, ctx.identity, ctx.cb_params, ctx.telemetry
    # Every rank times its steps; goodput, MFU and ETA are the reporting rank's.
    monitored = config.monitored_metrics if ctx.reports_training else []
    efficiency = StepEfficiency(monitored, config, cb_params, identity.device_target)
    accounting = StepAccounting(
        wall_clock=ctx.wall_clock, monitored=config.monitored_metrics, efficiency=efficiency,
        batch_size=_batch_size(cb_params), tokens_per_sample=efficiency.tokens_per_sample,
        before=ctx.timeline.before,
    )  # fmt: skip
    sinks = SinkFanout(build_sinks(config.outputs, identity, ctx.reports_training, ctx.first_step))
    # Every rank's section times and straggler signal, whatever `report_ranks` says.
    sections = RankSections(telemetry.meter, telemetry.logger, identity, config.stragglers)
    ctx.pipeline = pipeline = SampledStepPipeline(ctx, accounting=accounting, sinks=sinks, sections=sections)
    ctx.timeline.defer_to(pipeline, ctx.step_ids)
    return _Pipeline(pipeline, ctx.timeline)


def _batch_size(cb_params: Any) -> int | None:
    """Samples per step from the dataset's metadata (no readback); None when it has none."""
    dataset = cb_params.get("train_dataset")
    try:
        return int(dataset.get_batch_size()) if dataset is not None else None
    except Exception:  # a dataset without batch metadata: no throughput, not a failure
        return None


PARTS: tuple[Callable[[RunContext], RunPart | None], ...] = (
    start_ledger_entry,
    start_telemetry,
    start_flight_recorder,
    start_devices,
    start_stacks,
    start_captures,
    start_alerts,
    start_logs,
    start_run_span,
    start_attempt,
    start_cluster,
    start_grad_norm_probe,
    start_model_state,
    start_timeline,
    start_pipeline,
)

__all__ = ["LOCAL_DRAIN_SECONDS", "PARTS", "Closes", "launcher_context"]
