"""The sampled step's work off the training thread.

The training thread puts a StepRecord and its window's clock readings on a bounded queue
and returns. One worker thread then, per record: completes it (host-computed values,
phases, the time breakdown, the device readings; accounting.py), starts the step span
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

from collections.abc import Callable, Mapping
from contextlib import nullcontext
from typing import Any, NamedTuple

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Link, Span, StatusCode

from otel_mindformers.captures.controller import NO_CAPTURES
from otel_mindformers.core import measurements
from otel_mindformers.core.guarded_log import get_logger
from otel_mindformers.core.step_record import StepRecord
from otel_mindformers.core.workers import BoundedWorker
from otel_mindformers.outputs.sink import SinkFanout
from otel_mindformers.telemetry.lazy_span import LazySpan
from otel_mindformers.telemetry.step_ids import StepSpanIds
from otel_mindformers.telemetry.training_instruments import TrainingInstruments
from otel_mindformers.timing.accounting import StepAccounting, Window
from otel_mindformers.timing.phases import PhaseRecorder, phase

_logger = get_logger(__name__)

# Seconds the worker rests between batches of records: at interval 1 it wakes about twenty
# times a second instead of once per step, and a batch's gauges and counters cost one SDK
# call each.
BATCH_INTERVAL = 0.05
MAX_BATCH = 64  # records taken off the queue at once (the queue's bound, plus this)
# A record that arrives alone, within MAX_DELAY of the previous one, waits for company at
# most MAX_DELAY seconds (outputs and alert rules see it that much later): at interval 10 on
# 5 ms steps a lone record cost the worker 1.1 ms of CPU, one in a batch of eight 0.4 ms.
# Records further apart (slow steps) go at once.
MIN_BATCH = 8
MAX_DELAY = 0.5
MAX_QUIET = 0.1  # nothing queued for this long: training paused (a hang, a save, a kill coming)


def _ns(seconds: float) -> int:
    return int(seconds * 1e9)


class _Lost(NamedTuple):
    phase: str
    seconds: float


class _RunEnd(NamedTuple):
    end: float  # perf_counter seconds


class SampledStepPipeline(BoundedWorker[object]):
    """`alerts` is an AlertEngine or None; `on_stop_request(reason)` is called (worker
    thread) the first time a rule asks training to stop; `devices()` returns the latest
    device readings (cached, never polls)."""

    def __init__(
        self,
        *,
        tracer: trace.Tracer,
        instruments: TrainingInstruments,
        run_span: Span,
        accounting: StepAccounting,
        devices: Callable[[], dict[str, float]] | None,
        point_attributes: Mapping[str, Any],
        wants_span: Callable[[int, bool], bool],
        alerts: Any,
        sinks: SinkFanout,
        on_stop_request: Callable[[str], None],
        complete: Callable[[tuple], tuple[StepRecord, Window]],
        phases: PhaseRecorder | None = None,
        step_ids: StepSpanIds | None = None,
        captures: Any = NO_CAPTURES,
        sections: Any = None,
        job_progress: Callable[[StepRecord], None] | None = None,
        max_queue: int = 1024,
    ) -> None:
        self._tracer = tracer
        self._instruments = instruments
        self._run_span = run_span
        self._run_link = [Link(run_span.get_span_context())]
        self._accounting = accounting
        self._devices = devices
        self._point_attributes = dict(point_attributes)
        self._wants_span = wants_span
        self._alerts = alerts
        self._sinks = sinks
        self._on_stop_request = on_stop_request
        self._phases = phases
        self._step_ids = step_ids
        self._captures = captures
        self._sections = sections  # RankSections (stragglers/rank_signal.py) or None
        self._complete = complete  # a sampled step's tuple -> (StepRecord, Window): MonitorRun's
        self._job_progress = job_progress  # the attempt's share of a completed record (MonitorRun's)
        self._stop_requested = False
        self._unwritten: list[StepRecord] = []  # this batch's records, for the outputs at its end
        self.dropped = 0
        self.dropped_phases = 0
        self._phase_failed = False
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
        if type(item) is tuple:
            self._handle_step(*self._complete(item))
        elif type(item) is phase:
            self._handle_phase(item)
        elif type(item) is _Lost:
            self._accounting.lost(*item)
        elif type(item) is _RunEnd:
            self._end_run(item.end)

    def _handle_phase(self, marked: phase) -> None:
        try:
            charge = self._phases.record_deferred(marked)  # type: ignore[union-attr]  # it submitted the phase
        except Exception as exc:  # its span or observation: telemetry, the ledger still counts it
            share = marked._charge
            charge = None if share is None else (self._phases.ledger_key(marked.name), share)  # type: ignore[union-attr]
            if not self._phase_failed:
                self._phase_failed = True
                _logger.warning("otel_mindformers: recording phase %r failed: %s", marked.name, exc)
        if charge is not None:
            self._accounting.lost(*charge)

    def _handle_step(self, record: StepRecord, window: Window) -> None:
        try:
            self._accounting.complete(record, window)
            if self._job_progress is not None:
                self._job_progress(record)
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

        def start_span() -> Span:
            # The ids that records made during the step already carry (telemetry/step_ids.py).
            with self._step_ids.preset(record.step - record.steps_in_window) if self._step_ids else nullcontext():
                return self._tracer.start_span(
                    fields.name,
                    # A trace per step, linked to the run span: traces stay small and tail
                    # sampling can keep anomalous steps without buffering a whole run.
                    context=otel_context.Context(),
                    links=self._run_link,
                    start_time=_ns(fields.start_time),
                    attributes=fields.attributes,
                )

        # Steps that `step_spans` skips still get their span if an anomaly is recorded on them.
        span = start_span() if self._wants_span(record.step, record.is_last) else LazySpan(start_span)
        with trace.use_span(span, end_on_exit=False):
            self._instruments.apply(measurements.measurements(record, self._point_attributes))
            if self._sections is not None:  # the rank's section series and straggler signal
                self._sections.observe(record, span, self._instruments.coalesced)
            if fields.status.status_code is StatusCode.ERROR:  # a fault, not loss scaling
                span.set_status(fields.status)
            reason = self._alerts.evaluate(record, span) if self._alerts is not None else None
            self._captures.on_sampled_step(record.step, span, record.time_stamp)  # an on-demand request: one stat
        span.end(end_time=_ns(fields.end_time))
        if self._phases is not None:
            for interval in record.phases:  # start-up, compile, data wait: spans from timestamps
                self._phases.record(interval)
        if reason and not self._stop_requested:
            self._stop_requested = True
            self._on_stop_request(reason)

    def _end_run(self, end: float) -> None:
        try:
            for interval in self._accounting.settle_compile():  # runs shorter than STEADY_SAMPLES samples
                if self._phases is not None:
                    self._phases.record(interval)
            # The whole run's breakdown, past the last sampled step.
            self._run_span.set_attributes(self._accounting.summary(end))
        except Exception as exc:
            _logger.warning("otel_mindformers: the run's time breakdown failed: %s", exc)

    def end_batch(self) -> None:
        self._instruments.flush()  # the batch's gauges and counters, one SDK call each
        if self._unwritten:  # the batch's lines: one write per output
            self._sinks.write(self._unwritten)
            self._unwritten = []  # only now: `close` counts a stuck write's records as not written

    def on_stop(self) -> None:
        self._sinks.close()

    # --- caller side (training thread) -------------------------------------------------------
    # A sampled step as the training thread knows it (a tuple; `complete` builds its
    # record): `submit` itself, without a frame of its own on the sampled step.
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
            if type(item) is tuple:
                left.append(self._complete(item)[0])
        if left:
            _logger.warning(
                "otel_mindformers: sampled steps did not drain within %.1f s; %d record(s) not written",
                timeout,
                len(left),
            )
        return left
