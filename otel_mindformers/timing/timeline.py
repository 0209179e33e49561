"""One run's timeline on the training thread: the clock reads that phases are made from.

The hot path touches two fields of the run's StepClock: the step-begin hook stores
`step_begin` and adds the gap since the previous step's end to `data_wait` (a clock read and
an addition). A sampled step takes both into its `SampledStep` and zeroes `data_wait`
(runtime/run.py `sample`); the
pipeline's worker turns them into phases and the time ledger (accounting.py). Phases that end on the training thread
(evaluation, checkpoint saves, user phases) are taken out of the data wait here (`_charged`)
and their seconds reach the ledger on the worker: through the pipeline's queue, with the
phase itself once `defer_to` has run (a `phase()`), else as a lost-time item.
"""

from __future__ import annotations

import dataclasses
import numbers
from collections.abc import Callable
from typing import Any

from opentelemetry.trace import Span

from otel_mindformers.core.clock import StepClock
from otel_mindformers.core.step_record import PhaseInterval
from otel_mindformers.names import phase_names
from otel_mindformers.names.phase_names import PHASE_DURATION
from otel_mindformers.names.training import STEP_DURATION_BUCKETS
from otel_mindformers.telemetry.training_instruments import create_instrument
from otel_mindformers.timing.callback_phases import instrument_callbacks
from otel_mindformers.timing.phases import PhaseRecorder, phase

# Phase buckets reach further than steps': checkpoints and evaluations take minutes.
PHASE_BUCKETS = STEP_DURATION_BUCKETS + (1200.0, 1800.0, 3600.0)


class RunTimeline:
    def __init__(
        self,
        *,
        tracer: Any,
        meter: Any,
        run_span: Span,
        parent_span: Callable[[], Span],
        span_attributes: dict[str, Any],
        point_attributes: dict[str, Any],
        clock: StepClock,
        on_charged: Callable[[str, float], None],
        callbacks: Any = (),
    ) -> None:
        self._clock = clock
        self._on_charged = on_charged
        self._ledger: Callable[[str, float], None] = _nowhere  # the pipeline's `lost` (defer_to)
        histogram = create_instrument(meter, PHASE_DURATION, explicit_bucket_boundaries_advisory=list(PHASE_BUCKETS))
        self.recorder = PhaseRecorder(
            tracer=tracer, histogram=histogram, parent_span=parent_span, span_attributes=span_attributes,
            point_attributes=point_attributes, clock=clock, on_lost=self._lost,
        )  # fmt: skip
        # Phases that ended before the run (a checkpoint load): start-up's share of the ledger.
        # (Named by their ledger keys: a user phase under `user.`.)
        self.before: list[PhaseInterval] = [
            dataclasses.replace(done, name=self.recorder.ledger_key(done.name))
            for done in self.recorder.activate(run_span)
        ]
        self._undo_hooks = instrument_callbacks(callbacks, self.recorder)
        self._evaluation: phase | None = None
        # Phase seconds charged in the gap after the step that ended at `_trailing_after`:
        # after a run's last step (Model.fit's last evaluation, a save at train end), they
        # are outside the window that ends there (`leave_out_trailing`).
        self._trailing = 0.0
        self._trailing_after = float("nan")

    def defer_to(self, pipeline: Any, step_ids: Any) -> None:
        """The run's pipeline is up: lost time goes to its worker's ledger, and so do the
        `phase()` objects themselves, span and all, when the tracer takes preset ids
        (`step_ids` not None; PhaseRecorder.defer)."""
        self._ledger = pipeline.lost
        if step_ids is not None:
            self.recorder.defer(pipeline.submit, step_ids.preset_ids, self._charged)

    def _charged(self, phase: str, seconds: float) -> None:
        """An outermost phase ended on the training thread: its part there."""
        # Between a step's end and the next one's begin: not data wait, though the gap holds it.
        clock = self._clock
        clock.phases += seconds  # not step time (sample() takes the window's)
        if clock.step_begin <= clock.last_step_end:
            clock.data_wait -= seconds
            after = clock.last_step_end
            self._trailing = seconds + self._trailing if self._trailing_after == after else seconds
            self._trailing_after = after
        self._on_charged(phase, seconds)

    def leave_out_trailing(self) -> None:
        """Train end, before the last step is sampled (training thread): the phases charged
        since that step lie outside its window. Undo what `_charged` did with them on the
        clock: they are no phase of the window, and no next step's gap will hold them, so
        they are not taken out of its data wait either."""
        clock = self._clock
        if self._trailing_after == clock.last_step_end:
            clock.phases -= self._trailing
            clock.data_wait += self._trailing

    def _lost(self, phase: str, seconds: float) -> None:
        """An outermost phase ended on the training thread, not deferred: its part there,
        and its seconds to the ledger (`phase` is its ledger key)."""
        self._charged(phase, seconds)
        self._ledger(phase, seconds)

    # --- evaluation inside Model.fit (on_eval_begin / on_eval_end, training thread) ---------
    def begin_evaluation(self) -> None:
        if self._evaluation is None:
            self._evaluation = phase(phase_names.PHASE_EVALUATION)
            self._evaluation.__enter__()

    def end_evaluation(self, results: Any) -> None:
        evaluation, self._evaluation = self._evaluation, None
        if evaluation is None:
            return
        if isinstance(results, dict):
            evaluation.set_attributes(
                **{
                    f"training.eval.{key}": float(value)
                    for key, value in results.items()
                    if isinstance(value, numbers.Real) and not isinstance(value, bool)
                }
            )
        evaluation.__exit__(None, None, None)

    def close(self) -> None:
        self.end_evaluation(None)
        self._undo_hooks()
        self.recorder.deactivate()


def _nowhere(phase: str, seconds: float) -> None:
    """Lost time before the run's pipeline exists (none is measured then)."""
