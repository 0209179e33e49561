"""Which steps a run samples (runtime/cadence.py): the first, every `interval`-th, and a known
last step (the run API's `epochs` × `steps_per_epoch`) at the step itself; which of them get a
span (`step_spans`); the loop's known length (runtime/training_loop.py) and an epoch's steps
(compat/mindspore_model.py)."""

from __future__ import annotations

import pytest

from otel_mindformers.compat.mindspore_model import steps_per_epoch
from otel_mindformers.core.clock import StepClock
from otel_mindformers.runtime.cadence import cadence_for
from otel_mindformers.runtime.training_loop import TrainingLoop


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


def _spans(samples: list[int], step_spans: bool | int) -> list[int]:
    """The sampled steps that get a span, each window from the previous sample; the last is the run's last."""
    cadence = cadence_for(1, step_spans, 0, 0.0, StepClock(), 0)
    windows = zip([0, *samples], samples, strict=False)
    return [step for start, step in windows if cadence.wants_span(step, start, step == samples[-1])]


def test_step_spans_n_keeps_the_sample_at_or_first_past_each_multiple_of_n():
    # Device sink mode samples the first sink end past each multiple of the interval (sinks of 3).
    assert _spans([3, 6, 9, 12, 15, 18, 21, 23], 10) == [12, 21, 23]
    assert _spans([10, 20, 25, 30, 31], 10) == [10, 20, 30, 31]  # on the grid: the multiple itself, once
    assert _spans([5, 9], 10) == [9]  # none passed: the last only
    assert _spans([5, 9], True) == [5, 9] and _spans([5, 9], False) == []


class _Dataset:
    def __init__(self, size: int) -> None:
        self.size = size

    def get_dataset_size(self) -> int:
        return self.size


@pytest.mark.parametrize(
    ("cb_params", "steps"),
    [
        ({"batch_num": 4, "dataset_sink_mode": True, "train_dataset": _Dataset(10)}, 4),  # a sink of 4 steps
        ({"batch_num": 4, "train_dataset": _Dataset(10)}, 4),  # sink mode unsaid: MindSpore's count
        ({"batch_num": 4, "dataset_sink_mode": False, "train_dataset": _Dataset(10)}, 10),  # the CPU fallback
        ({"batch_num": 4, "dataset_sink_mode": False, "train_dataset": _Dataset(0)}, 4),  # a size it cannot tell
        ({"batch_num": 4, "dataset_sink_mode": False}, 4),  # no dataset
    ],
)
def test_an_epoch_is_the_sink_in_sink_mode_and_the_whole_dataset_fed_step_by_step(cb_params, steps):
    assert steps_per_epoch(cb_params) == steps


def _loop(steps_done: int, offset: int, epochs: int, last_step: int = 0, per_epoch: int = 10) -> TrainingLoop:
    return TrainingLoop(
        network=None, train_network=None, optimizer=None, dataset=None, batch_size=None, epochs=epochs,
        steps_per_epoch=per_epoch, steps_done=steps_done, step_offset=offset, callbacks=(), step_view={},
        checkpoint_step=lambda: 0, last_step=last_step,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("steps_done", "offset", "epochs"),
    [
        (0, 0, 3),  # a fresh Model.train of 3 epochs
        (0, 20, 1),  # initial_epoch=2: the 3rd epoch
        (13, 0, 2),  # MindSpore's own resume (cur_step_num starts at 13): the rest of epoch 2, then 3
        (0, 13, 2),  # MindFormers' resume at its step 13 (initial_epoch 1): the same
        (3, 10, 2),  # both: step 13 again
    ],
)
def test_the_loops_known_last_step_is_the_jobs_whatever_the_resume(steps_done, offset, epochs):
    """3 epochs of 10 steps end at the job's step 30, however far a resume took the start."""
    assert _loop(steps_done, offset, epochs).known_last_step == 30


def test_a_loop_that_names_its_last_step_or_knows_no_length():
    assert _loop(0, 0, 3, last_step=25).known_last_step == 25  # the run API's, as named
    assert _loop(0, 0, 0).known_last_step == _loop(13, 0, 0).known_last_step == 0  # no epochs known
    assert _loop(0, 0, 3, per_epoch=0).known_last_step == 0


def test_model_trains_loop_on_the_cpu_fallback_ends_after_its_whole_epochs():
    """`Model.train(2, dataset of 10, dataset_sink_mode=True, sink_size=4)` on the CPU feeds
    step by step (`dataset_sink_mode` False in cb_params): 2 epochs of 10, not of 4."""
    cb_params = {"batch_num": 4, "dataset_sink_mode": False, "train_dataset": _Dataset(10), "epoch_num": 2}
    loop = TrainingLoop.of_model_train(cb_params)
    assert (loop.steps_per_epoch, loop.known_last_step) == (10, 20)
