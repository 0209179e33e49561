"""A callback that keeps each step's own begin and end (perf_counter), as a user would time
them: the tests' own clocks to check the product's measurements against."""

from __future__ import annotations

import time

from mindspore.train import Callback


class StepTimes(Callback):
    def __init__(self) -> None:
        super().__init__()
        self.begins: list[float] = []
        self.ends: list[float] = []
        self.wall_begins: list[int] = []  # time.time_ns(), to find the step a span ends at

    def on_train_step_begin(self, run_context):
        self.begins.append(time.perf_counter())
        self.wall_begins.append(time.time_ns())

    def on_train_step_end(self, run_context):
        self.ends.append(time.perf_counter())
