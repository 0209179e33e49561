"""The sampled step's work off the training thread.

The training thread puts a SampledStep (its read-back values and the window's clock
readings: core/sampled_step.py) on a bounded queue and returns. One worker thread then,
per sampled step: builds its StepRecord and completes it (host-computed values,
phases, the time breakdown, the device readings; accounting.py; the run's parts' shares), starts the step span
with the step's real start and end times, applies
the step's measurements inside the span's context (so the step-duration histogram's
exemplar points at the span), runs the alert rules (which may add span events, name the
fired rules in the record, and ask training to stop) and ends the span. At the end of a
batch of records (core/workers.py: a record that arrives alone waits up to MAX_DELAY for
others) it hands them to the local outputs at once: one write per output for the batch. A full queue drops the record (counted, reported once) rather than
block a step. Time lost to training-thread phases comes through the same queue, so the time
ledger sees it in order: a `phase()` object itself (its span is started and ended here, with
the ids it had while it ran; PhaseRecorder.record_deferred), else its seconds (`lost`). A
full queue drops a phase too (reported once). The run's end (`end_run`) settles the compile phase and
puts the run's time breakdown on the run span.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, NamedTuple

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Link, Span, StatusCode

from otel_mindformers.core import measurements
from otel_mindformers.core.clock import WallClock
from otel_mindformers.core.guarded_log import get_logger
from otel_mindformers.core.sampled_step import SampledStep
from otel_mindformers.core.step_record import StepRecord
from otel_mindformers.core.workers import BoundedWorker
from otel_mindformers.flight_recorder.recorder import FlightRecorder, NoRecorder
from otel_mindformers.job.identity import Identity
from otel_mindformers.names import job as job_names
from otel_mindformers.names import semconv
from otel_mindformers.names.phase_names import PHASE_DATA_WAIT
from otel_mindformers.outputs.sink import SinkFanout
from otel_mindformers.runtime.cadence import Cadence
from otel_mindformers.stragglers.rank_signal import RankSections
from otel_mindformers.telemetry.export_ranks import RankExports
from otel_mindformers.telemetry.lazy_span import LazySpan
from otel_mindformers.telemetry.providers import Telemetry
from otel_mindformers.telemetry.step_ids import StepSpanIds
from otel_mindformers.telemetry.training_instruments import TrainingInstruments
from otel_mindformers.timing.accounting import StepAccounting
from otel_mindformers.timing.phases import PhaseRecorder, phase

_logger = get_logger(__name__)

# Seconds the worker rests between batches of records: at interval 1 it wakes about twenty
# times a second instead of once per step, and a batch's gauges and counters cost one SDK
# call each.
BATCH_INTERVAL = 0.05
MAX_BATCH = 64  # records taken off the queue at once (the queue's bound, plus this)
# A record that arrives alone, within MAX_DELAY of the previous one, waits for company at
# most MAX_DELAY seconds (outputs and alert rules see it that much later): a lone record costs
# the worker about three times the CPU of one in a batch of eight (docs/performance.md, the
# pipeline worker). Records further apart (slow steps) go at once.
MIN_BATCH = 8
MAX_DELAY = 0.5
MAX_QUIET = 0.1  # nothing queued for this long: training paused (a hang, a save, a kill coming)


def _ns(seconds: float) -> int:
    return int(seconds * 1e9)


def _no_span(step: int, window_start: int, is_last: bool) -> bool:
    return False


class _Lost(NamedTuple):
    phase: str
    seconds: float


class _RunEnd(NamedTuple):
    end: float  # perf_counter seconds


class SampledStepPipeline(BoundedWorker[object]):
    """The run's sampled-step worker. From the started parts: the tracer, the run span, the
    device readings' cache (`snapshot()` never polls), the alerts (an AlertEngine or None),
    the captures, the phase recorder, and `request_stop(reason)`, called (worker thread)
    the first time a rule asks training to stop. `record_hooks`: the run's parts that take
    a share of each completed record (core/run_part.py `on_record`), set once they started."""

    def __init__(
        self,
        *,
        telemetry: Telemetry,
        identity: Identity,
        wall_clock: WallClock,
        cadence: Cadence,
        exports: RankExports,
        step_ids: StepSpanIds | None,
        run_span: Span,
        devices: Any,
        alerts: Any,
        captures: Any,
        phases: PhaseRecorder,
        flight: FlightRecorder | NoRecorder,
        request_stop: Callable[[str], None],
        epoch_steps: int,
        accounting: StepAccounting,
        sinks: SinkFanout,
        sections: RankSections | None = None,
        max_queue: int = 1024,
    ) -> None:
        self._tracer = telemetry.tracer
        self._instruments = TrainingInstruments(telemetry.meter)
        self._run_span = run_span
        self._run_link = [Link(run_span.get_span_context())]
        self._accounting = accounting
        self._devices = devices.snapshot if devices is not None else None
        self._point_attributes = identity.point_attributes()
        # `export_ranks`: a rank outside `spans` makes a step span only for an anomaly
        # (LazySpan); one outside `metrics` applies no training measurement.
        self._sends_spans = exports.spans
        self._wants_span = cadence.wants_span if exports.spans else _no_span
        self._sends_metrics = exports.metrics
        self._alerts = alerts
        self._sinks = sinks
        self._on_stop_request = request_stop
        self._phases: PhaseRecorder = phases
        self._step_ids: StepSpanIds | None = step_ids
        # This rank emits the job step's root span (telemetry/step_ids.py, export_ranks.py).
        self._emits_root = bool(exports.job_root and step_ids is not None and step_ids.job_key is not None)
        self._root_attributes: dict[str, Any] = {
            semconv.ATTR_JOB_ID: identity.job_id or "",
            job_names.ATTR_ATTEMPT: identity.attempt or 0,
            semconv.ATTR_WORLD_SIZE: identity.world_size,
        }
        self._captures = captures
        self._sections = sections  # RankSections (stragglers/rank_signal.py) or None
        self._rank = identity.rank
        self._world_size = identity.world_size
        self._wall = wall_clock.wall
        self._epoch_steps = epoch_steps
        self.record_hooks: list[Callable[[StepRecord], None]] = []
        # The outputs wrote up to this step: the flight ring's mark (flight_recorder/).
        self._written: Callable[[int], None] = flight.written
        self._stop_requested = False
        self._unwritten: list[StepRecord] = []  # this batch's records, for the outputs at its end
        self.dropped = 0
        self.dropped_phases = 0
        self._phase_failed = False
        self._capture_failed = False
        # The latest sampled step whose span `step_spans` skipped: the run's end gives it one if
        # it was the last step (only then is that known: a sampled last step is not marked last).
        self._skipped_span: tuple[Callable[[], Span], int, int, measurements.StepSpanFields] | None = None
        super().__init__(
            "otel-mindformers-steps",
            max_queue,
            BATCH_INTERVAL,
            MAX_BATCH,
            min_batch=MIN_BATCH,
            max_delay=MAX_DELAY,
            max_quiet=MAX_QUIET,
        )

    # --- worker thread ---------------------------------------------------------------------
    def handle(self, item: object) -> None:
        if type(item) is SampledStep:
            self._handle_step(self._record(item), item)
        elif type(item) is phase:
            self._handle_phase(item)
        elif type(item) is _Lost:
            self._accounting.lost(*item)
        elif type(item) is _RunEnd:
            self._end_run(item.end)

    def _handle_phase(self, marked: phase) -> None:
        try:
            charge = self._phases.record_deferred(marked)
        except Exception as exc:  # its span or observation: telemetry, the ledger still counts it
            share = marked._charge
            charge = None if share is None else (self._phases.ledger_key(marked.name), share)
            if not self._phase_failed:
                self._phase_failed = True
                _logger.warning("otel_mindformers: recording phase %r failed: %s", marked.name, exc)
        if charge is not None:
            self._accounting.lost(*charge)

    def _record(self, sampled: SampledStep) -> StepRecord:
        """The StepRecord of what the training thread handed over."""
        wall = self._wall
        return StepRecord(
            step=sampled.step,
            epoch=int(sampled.epoch) if sampled.epoch else self._epoch_of_step(sampled.step),
            rank=self._rank,
            time_stamp=wall(sampled.end),
            steps_in_window=sampled.steps,
            values=sampled.values,
            is_last=sampled.is_last,
            started_at=wall(sampled.previous_end),
            model_state=sampled.model_state or None,
            world_size=self._world_size,
        )

    def _epoch_of_step(self, step: int) -> int:
        """The epoch when cb_params has none: from the step and the epoch's length."""
        return (step - 1) // self._epoch_steps + 1 if self._epoch_steps else 1

    def _handle_step(self, record: StepRecord, sampled: SampledStep) -> None:
        try:
            self._accounting.complete(record, sampled)
            for hook in self.record_hooks:
                hook(record)
            if self._devices is not None:
                record.device = self._devices()
        except Exception as exc:  # a half-completed record is still worth its line
            _logger.warning("otel_mindformers: completing step %d failed: %s", record.step, exc)
        try:
            self._record_telemetry(record)
        except Exception as exc:  # telemetry must never cost the local outputs their line
            _logger.warning("otel_mindformers: recording step %d failed: %s", record.step, exc)
        self._unwritten.append(record)

    def _record_telemetry(self, record: StepRecord) -> None:
        fields = measurements.step_span(record)
        step_ids, window = self._step_ids, record.step - record.steps_in_window

        def start_span() -> Span:
            if step_ids is None:  # a tracer that takes no preset ids: a trace of its own
                return self._tracer.start_span(
                    fields.name, context=otel_context.Context(), links=self._run_link,
                    start_time=_ns(fields.start_time), attributes=fields.attributes,
                )  # fmt: skip
            # The job step's trace, shared by every rank (under its root), or one of its own;
            # linked to the run span. The ids are those records made during the step carry.
            parent = step_ids.parent(window)
            with step_ids.preset(window):
                return self._tracer.start_span(
                    fields.name, context=parent, links=self._run_link,
                    start_time=_ns(fields.start_time), attributes=fields.attributes,
                )  # fmt: skip

        # Steps that `step_spans` (or `export_ranks.spans`) skips still get their span if an
        # anomaly is recorded on them.
        span = start_span() if self._wants_span(record.step, window, record.is_last) else LazySpan(start_span)
        with trace.use_span(span, end_on_exit=False):
            if self._sends_metrics:
                self._instruments.apply(measurements.measurements(record, self._point_attributes))
            if self._sections is not None:  # the rank's section series and straggler signal
                self._sections.observe(record, span, self._instruments.coalesced)
            if fields.status.status_code is StatusCode.ERROR:  # a fault, not loss scaling
                span.set_status(fields.status)
            reason = self._alerts.evaluate(record, span) if self._alerts is not None else None
            try:  # an on-demand request: one stat. A failure there costs the step neither its span nor a stop.
                self._captures.on_sampled_step(record.step, span, record.time_stamp)
            except Exception as exc:
                if not self._capture_failed:
                    self._capture_failed = True
                    _logger.warning("otel_mindformers: checking for a capture request failed: %s", exc)
        span.end(end_time=_ns(fields.end_time))
        started = not isinstance(span, LazySpan) or span.started
        if started and self._emits_root:
            self._emit_root(window, record.step, fields)
        self._skipped_span = None if started else (start_span, window, record.step, fields)
        for interval in record.phases:  # start-up, compile, data wait: spans from timestamps
            if interval.name != PHASE_DATA_WAIT:
                self._phases.record(interval)
            elif started:  # the step's own wait for data, in its trace
                self._phases.record(interval, parent=span)
            else:  # a step without a span: its wait under the epoch, unless the rank sends no step spans
                self._phases.record(interval if self._sends_spans else dataclasses.replace(interval, traced=False))
        if reason and not self._stop_requested:
            self._stop_requested = True
            self._on_stop_request(reason)

    def _emit_root(self, window: int, step: int, fields: measurements.StepSpanFields) -> None:
        """The job step's root span, with this rank's step times: the span every rank's step
        span of this sampled step names as its parent."""
        with self._step_ids.preset_root(window):  # type: ignore[union-attr]  # _emits_root: there are ids
            root = self._tracer.start_span(
                semconv.SPAN_JOB_STEP, context=otel_context.Context(), start_time=_ns(fields.start_time),
                attributes={semconv.ATTR_STEP: step, **self._root_attributes},
            )  # fmt: skip
        root.end(end_time=_ns(fields.end_time))

    def _end_run(self, end: float) -> None:
        skipped, self._skipped_span = self._skipped_span, None
        if skipped is not None and self._wants_span(skipped[2], skipped[1], True):  # "every N-th step plus the last"
            start_span, window, step, fields = skipped
            start_span().end(end_time=_ns(fields.end_time))
            if self._emits_root:
                self._emit_root(window, step, fields)
        try:
            for interval in self._accounting.settle_compile():  # runs shorter than STEADY_SAMPLES samples
                self._phases.record(interval)
            # The whole run's breakdown, past the last sampled step.
            self._run_span.set_attributes(self._accounting.summary(end))
        except Exception as exc:
            _logger.warning("otel_mindformers: the run's time breakdown failed: %s", exc)

    def end_batch(self) -> None:
        self._instruments.flush()  # the batch's gauges and counters, one SDK call each
        if self._unwritten:  # the batch's lines: one write per output
            if self._sinks.write(self._unwritten):  # every output wrote it: the ring need not keep it
                self._written(self._unwritten[-1].step)
            self._unwritten = []  # only now: `close` counts a stuck write's records as not written

    def on_stop(self) -> None:
        self._sinks.close()

    # --- caller side (training thread) -------------------------------------------------------
    # A sampled step as the training thread knows it (a SampledStep; `_record` builds its
    # record here): `submit` itself, without a frame of its own on the sampled step.
    submit_sample = BoundedWorker.submit

    def lost(self, phase: str, seconds: float) -> None:
        """An outermost phase ended on the training thread: its time goes to the ledger."""
        self.submit(_Lost(phase, seconds))

    def end_run(self, end: float) -> None:
        """The run ended at `end` (perf seconds), after everything submitted so far."""
        self.put(_RunEnd(end))

    def on_drop(self, item: object) -> None:
        if type(item) is _Lost:
            return  # a lost phase's seconds: the ledger is short by it, as by a dropped record
        if type(item) is phase:  # its span and observation; the ledger is short by its seconds
            self.dropped_phases += 1
            if self.dropped_phases == 1:
                _logger.warning(
                    "otel_mindformers: sampled-step queue full (%d items); dropping phase %r and any "
                    "further phase that does not fit rather than slowing training",
                    self.max_queue,
                    item.name,
                )
            return
        self.dropped += 1
        if self.dropped == 1:
            _logger.warning(
                "otel_mindformers: sampled-step queue full (%d records); dropping records "
                "rather than slowing training. Raise `interval` or check the outputs.",
                self.max_queue,
            )

    def close(self, timeout: float = 5.0) -> list[StepRecord]:  # type: ignore[override]  # the records, not the queue items
        """Drain what is queued and close every output, within `timeout` seconds; return
        the records not written."""
        queued = super().close(timeout)
        # Past the deadline: the batch's records, handled or in a write that is stuck, are not written either.
        left = list(self._unwritten) if self._thread.is_alive() else []
        for item in queued:
            if type(item) is SampledStep:
                left.append(self._record(item))
        if left:
            _logger.warning(
                "otel_mindformers: sampled steps did not drain within %.1f s; %d record(s) not written",
                timeout,
                len(left),
            )
        return left
