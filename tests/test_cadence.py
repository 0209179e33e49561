"""Which steps a run samples (runtime/cadence.py): the first, every `interval`-th, and a known
last step (the run API's `epochs` × `steps_per_epoch`) at the step itself."""

from __future__ import annotations

from otel_mindformers.core.clock import StepClock
from otel_mindformers.runtime.cadence import cadence_for


def _sampled(steps: int, interval: int, last_step: int = 0) -> list[int]:
    """The steps 1..`steps` a run samples, as its step ends ask the cadence."""
    clock = StepClock()
    cadence = cadence_for(interval, True, 0, 0.0, clock, last_step)
    sampled = []
    for step in range(1, steps + 1):
        if step >= clock.next_sample:
            cadence.close_window(step, float(step))
            sampled.append(step)
    return sampled


def test_an_unknown_length_samples_the_first_and_every_interval_th_step():
    assert _sampled(12, 5) == [1, 5, 10]  # step 12 is the run end's to sample


def test_a_known_last_step_is_sampled_at_itself_and_the_cadence_goes_on_past_it():
    assert _sampled(12, 5, last_step=12) == [1, 5, 10, 12]
    assert _sampled(10, 5, last_step=10) == [1, 5, 10]  # on the cadence: once
    # A loop that runs past the length it named: every interval-th step again, not every step.
    assert _sampled(21, 5, last_step=7) == [1, 5, 7, 10, 15, 20]
