"""`WallClock`: Unix time of a `time.perf_counter()` reading.

The hot path reads only perf_counter (monotonic, cheap); diagnosis converts its readings
with one (perf, wall) pair taken at creation, off the training thread's budget.
"""

from __future__ import annotations

import time


class WallClock:
    def __init__(self) -> None:
        self._perf0, self._wall0 = time.perf_counter(), time.time()

    def wall(self, perf: float) -> float:
        return self._wall0 + (perf - self._perf0)
