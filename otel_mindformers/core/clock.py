"""The run's clocks: `StepClock`, the progress the hot path writes every step and other threads
read (the stall watchdog, the heartbeat gauges), and `WallClock`, which turns the hot path's
`time.perf_counter()` readings into Unix time."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable


def _nothing() -> None:
    pass


class StepClock:
    """Every field the step hooks touch, in one object: inside `Model.train` each object a
    hook touches is a cache miss (docs/performance.md).

    Shared with other threads: `step`, `last_step_end` (in `time.perf_counter()` seconds,
    the hot path's one clock) and `phase` (what the training thread is doing now: "step",
    "data_wait", "evaluation", "checkpoint.save", ... or "outside" before and after
    training) are read off-thread (the stall watchdog, the heartbeat gauges); `wake` is set
    by another thread that needs the training thread at the next step end (a stop to
    honour, a capture to start; runtime/callback.py clears it there).
    The training thread's own: `step_begin`, `data_wait` and `phases` (timing/timeline.py),
    `step_offset` (the job's step after a resume, job/resume.py) and `next_sample`
    (runtime/cadence.py); `arm_after` and `arm`: the step begin after the step `arm_after`
    calls `arm()` (the gradient-norm probes' counts before a sampled step,
    model_state/grad_norm_reader.py; never by default); `finished`, the int64 the step hook
    stores the job's step into (`finished[0] = step`): the flight ring's shared memory, which
    outlives the process (flight_recorder/), or a buffer of its own when the run keeps no ring."""

    __slots__ = (
        "step",
        "last_step_end",
        "phase",
        "step_begin",
        "data_wait",
        "step_offset",
        "next_sample",
        "wake",
        "arm_after",
        "arm",
        "phases",
        "finished",
    )

    def __init__(self) -> None:
        self.step = 0
        self.last_step_end = self.step_begin = time.perf_counter()
        self.phase = "outside"
        self.data_wait = 0.0  # seconds between steps this window, less the phases in them
        self.step_offset = 0
        self.next_sample = 1
        self.wake = False
        self.arm_after = sys.maxsize
        self.arm: Callable[[], None] = _nothing
        self.phases = 0.0  # seconds of the phases charged this window (evaluation, saves): not step time
        self.finished = memoryview(bytearray(8)).cast("q")


class WallClock:
    """Unix time of a `time.perf_counter()` reading, from one (perf, wall) pair taken at
    creation: the hot path reads only perf_counter; wall times are derived off it."""

    __slots__ = ("perf0", "wall0")

    def __init__(self) -> None:
        self.perf0, self.wall0 = time.perf_counter(), time.time()

    def wall(self, perf: float) -> float:
        return self.wall0 + (perf - self.perf0)
