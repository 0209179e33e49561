"""Reading TensorBoard event files back in tests, with TensorBoard's own reader."""

from __future__ import annotations

from pathlib import Path


def loss_steps(logdir: Path) -> list[int]:
    """The steps of the `loss` scalars TensorBoard's reader finds in one run folder."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(logdir))
    accumulator.Reload()
    return [event.step for event in accumulator.Scalars("loss")]
