"""What `run.log` keeps of a step is let go at the next step's begin, while the loop's own
variables still hold it: the loop's next `train_step` frees the last step's loss, as it would
without the monitor, not `run.log` (where freeing a PyNative tensor waits for the device
queue on the training thread: docs/performance.md, custom loops). The last step's values are
kept for the run's end, which samples it."""

from __future__ import annotations

import weakref

import pytest

import otel_mindformers
from tests.support import custom_loop
from tests.support.jsonl import json_lines

pytestmark = [pytest.mark.slow, pytest.mark.mindspore_api]  # real training


def test_the_last_steps_loss_is_freed_by_the_loops_next_train_step_not_by_log(workdir):
    loop = custom_loop.build()
    config = {"interval": 100, "output_type": ["json_file"], "json_log_path": str(workdir / "m.json")}
    freed_before_log: list[bool] = []
    with otel_mindformers.start(config, steps_per_epoch=4) as run:
        previous = None
        for step, (x, y) in enumerate(custom_loop.Data(4).batches(), start=1):
            with run.step(step):
                loss, grads = loop.train_step(x, y)  # the last step's loss: its last reference goes here
                freed_before_log.append(previous is not None and previous() is None)
                run.log(loss=loss, grads=grads)
            previous = weakref.ref(loss)
        del loss, grads
        assert previous() is not None, "the last step's loss is kept for the run's end"
    assert freed_before_log == [False, True, True, True]
    assert [line["step"] for line in json_lines(workdir / "m.json")] == [1, 4]
    assert json_lines(workdir / "m.json")[-1]["loss"] > 0  # sampled at the end, from what log kept
    assert [line["epoch"] for line in json_lines(workdir / "m.json")] == [1, 1]  # step 4 ends epoch 1
