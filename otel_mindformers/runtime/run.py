"""`MonitorRun`: one monitored training run, from its first step to its end.

It exists only while a run does (a door creates it at the run's begin and drops it at its
end: MonitorCallback at train begin and end, the run API at `start()` and `end()`), so no hook
asks "is a run going on?" beyond one `None` check. It starts the run's parts through the
composition root (runtime/assembly.py) from the door's TrainingLoop, tears down what started
if a later one fails, hands each sampled step's readings to the pipeline worker (the readback,
the window's clock readings, one put: the StepRecord is built on the worker), and at the end
ends and closes its parts within one deadline (core/run_part.py).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from otel_mindformers.captures.controller import NO_CAPTURES, CaptureController, NoCaptures
from otel_mindformers.compat import releases
from otel_mindformers.config import GradNorm, MonitorConfig
from otel_mindformers.core.clock import StepClock, WallClock
from otel_mindformers.core.deadline import Deadline
from otel_mindformers.core.guarded_log import get_logger
from otel_mindformers.core.run_part import RunEnding, RunPart, defines
from otel_mindformers.core.sampled_step import SampledStep
from otel_mindformers.job.identity import detect_identity
from otel_mindformers.model_state.inbox import INBOX
from otel_mindformers.names import phase_names, semconv
from otel_mindformers.names import training as tm
from otel_mindformers.outputs.paths import prepare_output_paths
from otel_mindformers.runtime.assembly import RunInputs, StartedRun, assemble
from otel_mindformers.runtime.cadence import cadence_for
from otel_mindformers.runtime.extract import OutputReader
from otel_mindformers.runtime.parts import Providers, launcher_context
from otel_mindformers.runtime.training_loop import TrainingLoop

if TYPE_CHECKING:
    from otel_mindformers.alerts import AlertEngine

_logger = get_logger(__name__)


class MonitorRun:
    """Start with `MonitorRun.start(...)`; the training thread reads `clock`, `cadence` and
    `stop_pending` on every step and calls `sample` on sampled ones."""

    def __init__(
        self, config: MonitorConfig, providers: Providers, loop: TrainingLoop, clock: StepClock | None = None
    ) -> None:
        """What the run knows before any part starts; `start` brings them up. `clock`: the
        hot path's, where the door's step scope is one (the run API's `Step`: one object
        touched per step); else a new one."""
        identity = detect_identity()
        if config.job_id:
            identity = dataclasses.replace(identity, job_id=config.job_id)
        prepare_output_paths(config, identity)
        reports_training = config.reports_training_metrics(identity.rank)
        # `nonfinite_check: all_ranks`: the ranks that do not report still read their own
        # loss and grad norm on sampled steps, only to name the first rank that goes bad, and
        # the overflow flag, which says when an infinite grad norm is loss scaling at work.
        self._local_reader: Any = (
            OutputReader([tm.LOSS, tm.GRAD_NORM, tm.OVERFLOW], GradNorm.IF_RETURNED)
            if config.nonfinite_check == "all_ranks" and not reports_training
            else None
        )
        alerts_config = config.alert_config
        # A NaN/Inf loss stops the run before the next step starts: checked where it is read.
        self._stop_on_nonfinite_loss = bool(
            alerts_config.enable_alert and alerts_config.nonfinite and alerts_config.stop_on_nonfinite
        )
        # The job's step: MindSpore's count starts again at 1 after a resume (job/resume.py).
        first_step = loop.first_step
        # One clock for the hot path; wall time derived from it only on sampled steps.
        wall_clock = WallClock()
        clock = clock if clock is not None else StepClock()
        clock.step, clock.last_step_end = first_step, wall_clock.perf0
        clock.step_begin, clock.step_offset = wall_clock.perf0, loop.step_offset
        self.clock = clock
        self.loop = loop
        self.cadence = cadence_for(
            config.interval, config.step_spans, first_step, wall_clock.perf0, clock, loop.last_step
        )
        self.inputs = RunInputs(
            config=config, identity=identity, loop=loop, clock=clock, wall_clock=wall_clock, cadence=self.cadence,
            reader=OutputReader(config.monitored_metrics if reports_training else [], config.grad_norm),
            reports_training=reports_training, providers=providers, launcher=launcher_context(),
            request_stop=self._request_stop, phase_parent=self._phase_parent, phase_charged=self._phase_charged,
        )  # fmt: skip
        self.config = config
        self.stop_pending: str | None = None  # set by the pipeline's worker thread (with clock.wake)
        self.stop_reason: str | None = None
        self.parts: list[RunPart] = []  # the started ones, in start order
        self._first_step_hooks: list[RunPart] = []  # parts told of the first step, once
        self._checkpoint_hooks: list[RunPart] = []
        self._epoch_span: Any = None
        # What the sampled step reads, once the parts started: its own attributes, no hop.
        self._reader: Any = self.inputs.reader  # an OutputReader, or the run API's LoggedReader
        self._state_reader: Any = None
        self._first_nonfinite: Any = None
        self._run_span: Any = None  # the run span, once started (phases before it have no parent)
        self._submit: Any = None  # the pipeline's submit_sample
        self._keep: Any = None  # the flight recorder's write (flight_recorder/)
        # What the doors read: `captures` on sampled steps, the rest at train or eval begin.
        self.captures: CaptureController | NoCaptures = NO_CAPTURES
        self.identity = identity
        self.alerts: AlertEngine | None = None
        self.timeline: Any = None
        self.started: StartedRun | None = None

    @property
    def parts_started(self) -> StartedRun:
        """The started parts (after `start`)."""
        assert self.started is not None, "MonitorRun.start has not finished"
        return self.started

    @classmethod
    def start(
        cls, config: MonitorConfig, loop: TrainingLoop, providers: Providers, clock: StepClock | None = None
    ) -> MonitorRun:
        """Bring every part up (`clock`: as `__init__`'s). A bad setting raises ConfigError
        (before the first step); anything else that fails ends and closes what started and is
        raised to the caller."""
        run = cls(config, providers, loop, clock)
        try:
            started = assemble(run.inputs, run.parts)
        except BaseException:
            run._close(error=None, timeout=1.0, ended_at=None)
            raise
        run.started = started
        run._first_step_hooks = [part for part in run.parts if defines(part, "on_first_step")]
        run._checkpoint_hooks = [part for part in run.parts if defines(part, "on_checkpoint")]
        started.pipeline.record_hooks = [part.on_record for part in run.parts if defines(part, "on_record")]
        run.config, run.identity = started.config, started.identity
        run.captures, run.alerts, run.timeline = started.captures, started.alerts, started.timeline
        run._state_reader, run._first_nonfinite, run._run_span = (
            started.state_reader, started.first_nonfinite, started.run_span
        )  # fmt: skip
        run._submit, run._keep = started.pipeline.submit_sample, started.flight.write
        if run._local_reader is not None:  # the first bad rank's grad norm, where it is measured
            run._local_reader.grad_norm_probe = started.grad_norm_probe
        run.clock.phase = "step"
        _logger.info("otel_mindformers: rank %d monitoring on %s", run.identity.rank, releases.found())
        for outside in releases.first_warning():
            _logger.warning("otel_mindformers: %s", outside)
        return run

    def read_with(self, make_reader: Callable[[frozenset[str], bool], Any]) -> None:
        """The run API's door: sampled steps read what `run.log` was given, through readers
        `make_reader(wanted, local)` builds for the keys the callback's readers would read
        (`local`: the first bad rank's reader of a rank that does not report)."""
        self._reader = make_reader(self._reader.wanted, False)
        if self._local_reader is not None:
            self._local_reader = make_reader(self._local_reader.wanted, True)

    # --- epochs (training thread, once per epoch) ---------------------------------------------
    def begin_epoch(self, epoch: int) -> None:
        started = self.parts_started
        self._epoch_span = started.telemetry.tracer.start_span(
            semconv.SPAN_EPOCH, context=started.run_span_context, attributes={semconv.ATTR_EPOCH: epoch}
        )

    def _phase_parent(self) -> Any:
        """Phases are children of the epoch span while one is open, else of the run span."""
        epoch = self._epoch_span
        return epoch if epoch is not None else self._run_span

    def end_epoch(self) -> None:
        if self._epoch_span is not None:
            self._epoch_span.end()
            self._epoch_span = None

    # --- sampled steps (training thread) -------------------------------------------------------
    def sample(
        self, cb_params: Any, step: int, previous_end: float, end: float, *, is_last: bool = False,
        breakdown_at: float = 0.0,
    ) -> None:  # fmt: skip
        """Hand the pipeline what only the training thread knows, in one SampledStep: the
        step's outputs and the window's clock readings. Inside Model.train every object this
        path touches is cold after the compiled step (docs/performance.md): it touches few."""
        steps, elapsed = self.cadence.close_window(step, end)
        values = self._reader.read(cb_params, step) if self._reader.reads_anything else {}
        model_state = None
        state_reader = self._state_reader
        if state_reader is not None and (state_reader.reads_outputs or INBOX.written):
            routed, model_state = state_reader.read(cb_params, step - steps)
            if routed:
                values.update(routed)
        if self._first_nonfinite is not None:
            local = self._local_reader.read(cb_params, step) if self._local_reader is not None else values
            self._first_nonfinite.check(step, local, self._run_span)
        captures = self.captures
        if captures.notes_batches:  # read only where a batch capture may want it
            captures.note_batch(cb_params, step)
        if self._stop_on_nonfinite_loss:
            loss = values.get(tm.LOSS)
            if loss is not None and not math.isfinite(loss):
                self.stop_pending = f"non-finite loss ({loss}) at step {step}"
        clock = self.clock
        if self._first_step_hooks:  # the run's first step, once
            hooks, self._first_step_hooks = self._first_step_hooks, []
            for part in hooks:
                part.on_first_step(clock.step_begin, end)
        data_wait, clock.data_wait = clock.data_wait, 0.0  # the window's data wait, taken in this frame
        phases, clock.phases = clock.phases, 0.0  # the window's evaluations, saves: not step time
        # SampledStep's fields in order, without a Python frame (core/sampled_step.py).
        sampled = tuple.__new__(SampledStep, (
            step, cb_params.get("cur_epoch_num"), values, model_state, is_last,
            steps, elapsed, previous_end, clock.step_begin, end, data_wait, phases, breakdown_at,
        ))  # fmt: skip
        self._keep(sampled)  # into the flight ring: this process's death cannot lose it
        self._submit(sampled)

    def _phase_charged(self, phase: str, seconds: float) -> None:
        """An outermost phase ended on the training thread (its seconds reach the pipeline
        worker's ledger through the timeline); a checkpoint save is the parts' to hear of."""
        if phase == phase_names.PHASE_CHECKPOINT_SAVE and self._checkpoint_hooks:
            step = self.loop.checkpoint_step()
            for part in self._checkpoint_hooks:
                part.on_checkpoint(step, seconds)

    def checkpoint_saved(self, step: int, seconds: float) -> None:
        """A checkpoint holding job step `step` was saved (the run API says so; the callback
        hears it as a save phase): the parts that count lost steps from it hear of it."""
        for part in self._checkpoint_hooks:
            part.on_checkpoint(step, seconds)

    def _request_stop(self, reason: str) -> None:
        """A rule asked to stop (worker thread): honoured at the next step boundary."""
        if self.stop_pending is None and self.stop_reason is None:
            self.stop_pending = reason
            self.clock.wake = True  # the training thread honours it at the next step end

    def honour_stop(self, run_context: Any) -> None:
        """Training thread: stop after this step, once, and say why."""
        reason, self.stop_pending = self.stop_pending, None
        if self.stop_reason is not None or reason is None:
            return
        self.stop_reason = reason
        run_span = self._run_span
        run_span.add_event("early_stop", {"reason": reason, semconv.ATTR_STEP: self.clock.step})
        run_span.set_attribute(semconv.ATTR_STOP_REASON, reason)
        _logger.warning("otel_mindformers: stopping training at step %d: %s", self.clock.step, reason)
        run_context.request_stop()

    # --- end ---------------------------------------------------------------------------------
    def finish(self, cb_params: Any, error: BaseException | None) -> None:
        """Sample the last step if the cadence has not, then end and close every part within
        `shutdown_timeout` (local outputs: parts.LOCAL_DRAIN_SECONDS)."""
        self.clock.phase = "outside"
        step = self.clock.step
        if error is None and self.cadence.unsampled_last(step):
            try:
                # Taken now, after what ran since the last step (Model.fit's last evaluation,
                # a save at train end): its time breakdown holds them, so its wall does too;
                # its window ends at the last step, without them.
                self.timeline.leave_out_trailing()
                self.sample(
                    cb_params, step, self.cadence.window_start, self.clock.last_step_end, is_last=True,
                    breakdown_at=time.perf_counter(),
                )  # fmt: skip
            except Exception as exc:  # the last record is telemetry: never fail the run's end
                _logger.warning("otel_mindformers: could not sample the last step %d: %s", step, exc)
        self._close(error, self.config.shutdown_timeout, ended_at=time.perf_counter())

    def _close(self, error: BaseException | None, timeout: float, ended_at: float | None) -> None:
        """Every started part's `end`, then its `close`, last started first, within one
        deadline. One that raises is warned about and the next goes on (core/run_part.py)."""
        _quietly(self.end_epoch)
        ending = RunEnding(
            error=error, last_step=self.clock.step, ended_at=ended_at, remaining=Deadline(timeout).remaining,
            stop_reason=self._stop_reason_now,
        )  # fmt: skip
        for part in reversed(self.parts):
            _quietly(part.end, ending)
        for part in reversed(self.parts):
            _quietly(part.close, ending.remaining)

    def _stop_reason_now(self) -> str | None:
        """The stop this run honoured, else one a rule asked for too late to be honoured."""
        if self.stop_reason is None and self.stop_pending is not None:
            self.stop_reason, self.stop_pending = self.stop_pending, None
        return self.stop_reason


def _quietly(call: Any, *args: Any) -> None:
    try:
        call(*args)
    except Exception as exc:  # shutting down telemetry must not mask the run's outcome
        _logger.warning("otel_mindformers: shutting down monitoring failed: %s", exc)


__all__ = ["MonitorRun"]
