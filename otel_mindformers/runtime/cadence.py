"""Which steps are sampled, the timing window between samples, and which get a span.

`Cadence` owns the sampling decision, torchtitan's
`should_log` as one small object: the first step, every `interval`-th step, and the last
step (taken at train end, because in sink mode MindSpore's `batch_num` is the sink size,
not the epoch length, so the last step cannot be known in advance). A custom loop that names
its length (`start(epochs=, steps_per_epoch=)`) gets `KnownLengthCadence`: its last step is
sampled at the step itself, while its gradients are still there.
"""

from __future__ import annotations

from otel_mindformers.core.clock import StepClock


class Cadence:
    """The sampling state of one run. The hot path reads only `next_sample`, which lives on
    the run's StepClock (the step hooks' one object)."""

    __slots__ = ("interval", "step_spans", "_progress", "window_start", "window_step", "last_sampled")

    def __init__(self, interval: int, step_spans: bool | int, first_step: int, now: float, progress: StepClock) -> None:
        self.interval = interval
        self.step_spans = step_spans
        self._progress = progress
        progress.next_sample = first_step + 1  # the first step is always sampled
        self.window_start, self.window_step = now, first_step
        self.last_sampled = first_step

    @property
    def next_sample(self) -> int:
        return self._progress.next_sample

    def close_window(self, step: int, end: float) -> tuple[int, float]:
        """The steps and seconds since the previous sample; starts the next window."""
        steps = step - self.window_step
        if steps < 1:  # a step counter that did not move (a resumed or repeated step)
            steps = 1
        elapsed = end - self.window_start
        self.window_start, self.window_step, self.last_sampled = end, step, step
        # Sample by the real step: the next multiple of `interval` after this one.
        self._progress.next_sample = (step // self.interval + 1) * self.interval
        return steps, elapsed

    def unsampled_last(self, step: int) -> bool:
        """True when the run's last step `step` has not been sampled yet."""
        return step > self.last_sampled

    def wants_span(self, step: int, window_start: int, is_last: bool) -> bool:
        """`step_spans`: true, false, or N: a sampled step whose window (`window_start`, the
        previous sample, to `step`) passed a multiple of N, plus the last. Device sink mode
        samples past the multiples of `interval`, so `step % N` would rarely hold there.
        (Anomalous steps get theirs regardless, through LazySpan.)"""
        every = self.step_spans
        if isinstance(every, bool):
            return every
        return step // every > window_start // every or is_last


class KnownLengthCadence(Cadence):
    """A cadence that also samples the run's known last step at the step itself (a subclass,
    so the callback's sampled steps, whose last step is not known, pay nothing for it)."""

    __slots__ = ("last_step",)

    def __init__(
        self, interval: int, step_spans: bool | int, first_step: int, now: float, progress: StepClock, last_step: int
    ) -> None:
        super().__init__(interval, step_spans, first_step, now, progress)
        self.last_step = last_step

    def close_window(self, step: int, end: float) -> tuple[int, float]:
        window = super().close_window(step, end)
        if step < self.last_step < self._progress.next_sample:  # the last step before the next multiple
            self._progress.next_sample = self.last_step
        return window


def cadence_for(
    interval: int, step_spans: bool | int, first_step: int, now: float, progress: StepClock, last_step: int
) -> Cadence:
    """The run's cadence: `last_step` > 0 is the loop's known last step (0: not known)."""
    if last_step > 0:
        return KnownLengthCadence(interval, step_spans, first_step, now, progress, last_step)
    return Cadence(interval, step_spans, first_step, now, progress)
