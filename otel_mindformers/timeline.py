"""One run's timeline: which phase each second of its wall time went to.

`RunTimeline` lives on the training thread. The hot path touches two fields: the step-begin
hook stores `step_begin` and adds the gap since the previous step's end to `data_wait` (a
clock read and an addition). A sampled step then turns what accumulated into phases:

- `startup`: the interpreter's start (first run of a process; else the run's start) to the
  first step's begin, less the phases inside it (a checkpoint load, user phases);
- `compile`: the first step's duration beyond the median of the next sampled steps' own
  durations (what graph compilation costs MindFormers users), once `STEADY_SAMPLES` are known;
- `data_wait`: the gaps between steps of the window, less the phases inside them
  (evaluation, a checkpoint saved by a callback that runs after ours, user phases).

Their spans are made on the pipeline's worker thread from the timestamps in the record
(`StepRecord.phases`); the time ledger (goodput) is updated here.
"""

from __future__ import annotations

import numbers
import statistics
from typing import Any, Callable

import psutil
from opentelemetry import context as otel_context

from otel_mindformers.cadence import WallClock
from otel_mindformers.diagnosis import names
from otel_mindformers.goodput import TimeLedger
from otel_mindformers.phase_hooks import instrument_callbacks
from otel_mindformers.phases import (
    PHASE_COMPILE, PHASE_DURATION, PHASE_STARTUP, PhaseInterval, PhaseRecorder, phase,
)  # fmt: skip
from otel_mindformers.telemetry.instruments import create_instrument
from otel_mindformers.training_metrics import STEP_DURATION_BUCKETS

# Sampled steps whose own duration makes the steady-state median the first step is compared to.
STEADY_SAMPLES = 3
# Phase buckets reach further than steps': checkpoints and evaluations take minutes.
PHASE_BUCKETS = STEP_DURATION_BUCKETS + (1200.0, 1800.0, 3600.0)

_process_started = False  # the first run of a process counts start-up from the interpreter's start


def _origin(run_start_wall: float) -> float:
    global _process_started
    if _process_started:
        return run_start_wall
    _process_started = True
    try:
        return min(psutil.Process().create_time(), run_start_wall)
    except (psutil.Error, OSError):  # no process table: start-up is unknown, count from the run
        return run_start_wall


class RunTimeline:
    def __init__(
        self,
        *,
        tracer: Any,
        meter: Any,
        parent: Callable[[], otel_context.Context],
        span_attributes: dict[str, Any],
        point_attributes: dict[str, Any],
        clock: Any,
        wall_clock: WallClock,
        callbacks: Any = (),
    ) -> None:
        self.wall = wall_clock.wall  # perf_counter reading → Unix time
        self._clock = clock
        self.ledger = TimeLedger(_origin(wall_clock.wall0))
        self.step_begin = wall_clock.perf0  # perf_counter at the latest step's begin (hot path)
        self.data_wait = 0.0  # seconds between steps this window, less the phases in them (hot path)
        self._first_step: tuple[float, float] | None = None  # (begin perf, duration)
        self._steady: list[float] = []
        self._compile_known = False
        histogram = create_instrument(meter, PHASE_DURATION, explicit_bucket_boundaries_advisory=list(PHASE_BUCKETS))
        self.recorder = PhaseRecorder(
            tracer=tracer, histogram=histogram, parent=parent, span_attributes=span_attributes,
            point_attributes=point_attributes, clock=clock, on_lost=self._lost,
        )  # fmt: skip
        for before in self.recorder.activate():
            self.ledger.add(before.name, before.seconds)
        self._undo_hooks = instrument_callbacks(callbacks, self.recorder)
        self._evaluation: phase | None = None

    def _lost(self, phase: str, seconds: float) -> None:
        """An outermost phase ended on the training thread."""
        self.ledger.add(phase, seconds)
        # Between a step's end and the next one's begin: not data wait, though the gap holds it.
        if self.step_begin <= self._clock.last_step_end:
            self.data_wait -= seconds

    def on_sample(self, previous_end: float, end: float) -> list[PhaseInterval]:
        """Training thread, at a sampled step ending at `end` (perf seconds) whose
        predecessor ended at `previous_end`: the phases to record, ledger updated."""
        begin, waited = self.step_begin, self.data_wait
        self.data_wait = 0.0
        phases: list[PhaseInterval] = []
        if self._first_step is None:
            self._first_step = (begin, end - begin)
            # The first step's wait for data is part of start-up.
            startup = self.wall(begin) - self.ledger.origin_wall - self.ledger.total_lost()
            self.ledger.add(PHASE_STARTUP, startup)
            phases.append(PhaseInterval(PHASE_STARTUP, self.ledger.origin_wall, self.wall(begin), max(0.0, startup)))
            return phases
        if waited > 0:
            self.ledger.add(names.PHASE_DATA_WAIT, waited)
            phases.append(
                PhaseInterval(names.PHASE_DATA_WAIT, self.wall(min(previous_end, begin)), self.wall(begin), waited)
            )
        if not self._compile_known:
            self._steady.append(end - begin)
            if len(self._steady) >= STEADY_SAMPLES:
                phases += self.settle_compile()
        return phases

    def settle_compile(self) -> list[PhaseInterval]:
        """The compile phase, once: the first step's excess over the steady median (also at
        train end, with the steps there were)."""
        if self._compile_known or self._first_step is None or not self._steady:
            return []
        self._compile_known = True
        first_begin, first_duration = self._first_step
        steady = statistics.median(self._steady)
        excess = first_duration - steady
        if excess <= 0:
            return []
        self.ledger.add(PHASE_COMPILE, excess)
        start = self.wall(first_begin)
        return [
            PhaseInterval(
                PHASE_COMPILE, start, start + excess, excess,
                {"training.first_step.seconds": first_duration, "training.steady_step.seconds": steady},
            )
        ]

    def goodput(self, end: float) -> float | None:
        return self.ledger.goodput(self.wall(end))

    def breakdown(self, end: float) -> dict[str, float]:
        return self.ledger.breakdown(self.wall(end))

    # --- evaluation inside Model.fit (on_eval_begin / on_eval_end, training thread) ---------
    def begin_evaluation(self) -> None:
        if self._evaluation is None:
            self._evaluation = phase(names.PHASE_EVALUATION)
            self._evaluation.__enter__()

    def end_evaluation(self, results: Any) -> None:
        evaluation, self._evaluation = self._evaluation, None
        if evaluation is None:
            return
        if isinstance(results, dict):
            evaluation.set_attributes(**{
                f"training.eval.{key}": float(value)
                for key, value in results.items()
                if isinstance(value, numbers.Real) and not isinstance(value, bool)
            })
        evaluation.__exit__(None, None, None)

    def summary(self, now: float) -> dict[str, float]:
        """The run span's attributes at train end: `training.goodput`, `training.time.<phase>`."""
        attributes = {f"training.time.{key}": value for key, value in self.breakdown(now).items()}
        goodput = self.goodput(now)
        if goodput is not None:
            attributes["training.goodput"] = goodput
        return attributes

    def close(self) -> None:
        self.end_evaluation(None)
        self._undo_hooks()
        self.recorder.deactivate()
