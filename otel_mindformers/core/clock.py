"""The run's clocks: `StepClock`, the progress the hot path writes every step and other threads
read (the stall watchdog, the heartbeat gauges), and `WallClock`, which turns the hot path's
`time.perf_counter()` readings into Unix time."""

from __future__ import annotations

import time


class StepClock:
    """Progress shared with other threads: written on every step, read off-thread.

    `last_step_end` is in `time.perf_counter()` seconds (the hot path's one clock);
    `phase` is what the training thread is doing now ("step", "data_wait", "evaluation",
    "checkpoint.save", ... or "outside" before and after training)."""

    __slots__ = ("step", "last_step_end", "phase")

    def __init__(self) -> None:
        self.step = 0
        self.last_step_end = time.perf_counter()
        self.phase = "outside"


class WallClock:
    """Unix time of a `time.perf_counter()` reading, from one (perf, wall) pair taken at
    creation: the hot path reads only perf_counter; wall times are derived off it."""

    __slots__ = ("perf0", "wall0")

    def __init__(self) -> None:
        self.perf0, self.wall0 = time.perf_counter(), time.time()

    def wall(self, perf: float) -> float:
        return self.wall0 + (perf - self.perf0)
