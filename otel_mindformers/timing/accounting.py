"""What a sampled window adds to its StepRecord, worked out on the pipeline's worker thread.

The training thread hands over its values and the window's clock readings only (a
`SampledStep`, core/sampled_step.py). Here they become the host-computed training values (step time, samples and tokens
per second, goodput, ETA, MFU, TFLOPS), the built-in phases (start-up, compile, data wait),
and the run's time breakdown:

- `startup`: the process's start (first run of a process; else the run's start) to the
  first step's begin, less the phases inside it (a checkpoint load, user phases). The
  kernel's start time: a wrapper that `exec`s Python keeps its process, and its setup
  counts (docs/time.md);
- `compile`: the first step's duration beyond the median of the next sampled steps' own
  durations (what graph compilation costs MindFormers users), once `STEADY_SAMPLES` are known;
- `data_wait`: the gaps between steps of the window, less the phases inside them.

Time lost to phases that end on the training thread (evaluation, checkpoint saves, user
phases) reaches `lost` through the same queue as the records, so the ledger sees every
phase in the order it happened. Only the worker thread touches a `StepAccounting` once the
pipeline runs.
"""

from __future__ import annotations

import statistics

from otel_mindformers.core.clock import WallClock
from otel_mindformers.core.process_start import process_start
from otel_mindformers.core.sampled_step import SampledStep
from otel_mindformers.core.step_record import PhaseInterval, StepRecord
from otel_mindformers.names import phase_names
from otel_mindformers.names import training as tm
from otel_mindformers.names.phase_names import PHASE_COMPILE, PHASE_STARTUP
from otel_mindformers.stragglers.sections import WindowSections
from otel_mindformers.timing.efficiency import StepEfficiency
from otel_mindformers.timing.time_ledger import TimeLedger

# Sampled steps whose own duration makes the steady-state median the first step is compared to.
STEADY_SAMPLES = 3
# A data-wait span only when the window's last gap is at least this long: a well-fed loader's
# gaps (tens of microseconds) would double the spans every sampled step exports and say
# nothing. The histogram and the ledger count every gap.
DATA_WAIT_SPAN_SECONDS = 0.001

_process_started = False  # the first run of a process counts start-up from the process's start


def _run_origin(run_start_wall: float) -> float:
    """Where a run's wall time starts: the process's start for a process's first run."""
    global _process_started
    if _process_started:
        return run_start_wall
    _process_started = True
    return process_start(run_start_wall)  # the ledger's reading too: the report's tables agree


def training_seconds(elapsed: float, phases: float) -> float:
    """The steps' own time in a window: the window less the phases inside it (an evaluation
    of Model.fit, a checkpoint save): they are not training steps (docs/time.md)."""
    return elapsed - phases if 0 < phases < elapsed else elapsed


class StepAccounting:
    """`batch_size` is the dataset's samples per step (None: no throughput);
    `tokens_per_sample` is `monitor_config.tokens_per_sample` (None: no tokens per second)."""

    def __init__(
        self,
        *,
        wall_clock: WallClock,
        monitored: list[str],
        efficiency: StepEfficiency,
        batch_size: int | None,
        tokens_per_sample: int | None,
        before: list[PhaseInterval],
    ) -> None:
        self._wall = wall_clock.wall
        # A phase that ended before the run (a load between two runs of a process) is part
        # of its wall time: the origin is never after the earliest of them.
        origin = min([_run_origin(wall_clock.wall0), *(done.start_wall for done in before)])
        self._ledger = TimeLedger(origin)
        for done in before:  # phases that ended before the run (a checkpoint load)
            self._ledger.add(done.name, done.seconds)
        self._efficiency = efficiency
        self._batch_size = batch_size
        self._tokens_per_sample = tokens_per_sample
        self._wants_time = tm.STEP_TIME in monitored
        self._wants_samples = tm.SAMPLES_PER_SECOND in monitored
        self._wants_tokens = tm.TOKENS_PER_SECOND in monitored and bool(tokens_per_sample)
        self._first_step: tuple[float, float] | None = None  # (begin perf, duration)
        self._steady: list[float] = []
        self._compile_known = False
        self._sections = WindowSections()

    def lost(self, phase: str, seconds: float) -> None:
        """An outermost phase ended on the training thread."""
        self._ledger.add(phase, seconds)
        self._sections.phase(phase, seconds)

    def complete(self, record: StepRecord, window: SampledStep) -> None:
        """Fill in the record's host-computed values, its phases and the time breakdown."""
        values = record.values
        steps, elapsed = window.steps, window.elapsed
        training = training_seconds(elapsed, window.phases)
        if self._wants_time:
            values[tm.STEP_TIME] = training / steps * 1000.0
        samples = None
        if training > 0 and self._batch_size:
            samples = self._batch_size * steps / training
            if self._wants_samples:
                values[tm.SAMPLES_PER_SECOND] = samples
            if self._wants_tokens and self._tokens_per_sample:
                values[tm.TOKENS_PER_SECOND] = samples * self._tokens_per_sample
        first = self._first_step is None
        record.phases = self._phases(window)
        # The rank's sections (sections.py); the first window holds start-up and compile. A
        # last step sampled at train end: its sections run to then, as its breakdown does, and
        # hold what ran after the step (it arrived with the phases), not in its steps' time.
        reaches = elapsed + max(0.0, window.breakdown_at - window.end)
        sections = self._sections.close(steps, reaches, window.data_wait)
        if not first:
            record.sections = sections
        # The breakdown as of the sample: a last step sampled at train end includes what
        # ran after it (its wall too, so the phases and productive still add up to it).
        end_wall = self._wall(max(window.end, window.breakdown_at))
        self._efficiency.add(values, record.step, steps, training, samples, lambda: self._ledger.goodput(end_wall))
        record.time_breakdown = self._ledger.breakdown(end_wall)

    def _phases(self, window: SampledStep) -> list[PhaseInterval]:
        begin, end, waited = window.step_begin, window.end, window.data_wait
        if self._first_step is None:
            self._first_step = (begin, end - begin)
            # The first step's wait for data is part of start-up.
            startup = self._wall(begin) - self._ledger.origin_wall - self._ledger.total_lost()
            self._ledger.add(PHASE_STARTUP, startup)
            return [PhaseInterval(PHASE_STARTUP, self._ledger.origin_wall, self._wall(begin), max(0.0, startup))]
        phases: list[PhaseInterval] = []
        if waited > 0:
            self._ledger.add(phase_names.PHASE_DATA_WAIT, waited)
            start = min(window.previous_end, begin)
            phases.append(PhaseInterval(
                phase_names.PHASE_DATA_WAIT, self._wall(start), self._wall(begin), waited,
                traced=begin - start >= DATA_WAIT_SPAN_SECONDS,
            ))  # fmt: skip
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
        self._ledger.add(PHASE_COMPILE, excess)
        start = self._wall(first_begin)
        return [
            PhaseInterval(
                PHASE_COMPILE,
                start,
                start + excess,
                excess,
                {"training.first_step.seconds": first_duration, "training.steady_step.seconds": steady},
            )  # fmt: skip
        ]

    def summary(self, end: float) -> dict[str, float]:
        """The run span's attributes at train end (`end` in perf seconds):
        `training.goodput` and `training.time.<phase>`."""
        end_wall = self._wall(end)
        attributes = {f"training.time.{key}": value for key, value in self._ledger.breakdown(end_wall).items()}
        goodput = self._ledger.goodput(end_wall)
        if goodput is not None:
            attributes["training.goodput"] = goodput
        return attributes


__all__ = ["DATA_WAIT_SPAN_SECONDS", "STEADY_SAMPLES", "StepAccounting", "training_seconds"]
