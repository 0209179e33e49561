"""Which steps are sampled, the timing window between samples, and which get a span.

`Cadence` owns the sampling decision, torchtitan's
`should_log` as one small object: the first step, every `interval`-th step, and the last
step (taken at train end, because in sink mode MindSpore's `batch_num` is the sink size,
not the epoch length, so the last step cannot be known in advance; a custom loop that names
its length, `start(epochs=, steps_per_epoch=)`, has its last step sampled at the step itself:
`last_step`).
"""

from __future__ import annotations

from otel_mindformers.core.clock import StepClock


class Cadence:
    """The sampling state of one run. The hot path reads only `next_sample`, which lives on
    the run's StepClock (the step hooks' one object)."""

    __slots__ = ("interval", "step_spans", "_progress", "window_start", "window_step", "last_sampled", "last_step")

    def __init__(self, interval: int, step_spans: bool | int, first_step: int, now: float, progress: StepClock) -> None:
        self.interval = interval
        self.step_spans = step_spans
        self._progress = progress
        progress.next_sample = first_step + 1  # the first step is always sampled
        self.window_start, self.window_step = now, first_step
        self.last_sampled = first_step
        self.last_step = 0  # the run's known last step (0: unknown, sampled at the end)

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
        # Sample by the real step: the next multiple of `interval` after this one, or the
        # known last step before it (sampled while its gradients are still there).
        upcoming = (step // self.interval + 1) * self.interval
        last = self.last_step
        self._progress.next_sample = last if step < last < upcoming else upcoming
        return steps, elapsed

    def unsampled_last(self, step: int) -> bool:
        """True when the run's last step `step` has not been sampled yet."""
        return step > self.last_sampled

    def wants_span(self, step: int, is_last: bool) -> bool:
        """`step_spans`: true, false, or every N-th step plus the last. (Anomalous steps get
        theirs regardless, through LazySpan.)"""
        every = self.step_spans
        if isinstance(every, bool):
            return every
        return step % every == 0 or is_last
