"""`hw.energy` for devices whose driver reports power but no energy counter."""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable


class EnergyIntegrator:
    """Joules per device since the first reading, by the trapezoid rule over the polls.

    A poll that failed leaves a gap that the next reading bridges with the mean of its two
    ends: the counter stays monotonic and close, where dropping the gap would undercount.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._last: dict[Hashable, tuple[float, float, float]] = {}  # key -> (time, watts, joules)

    def add(self, key: Hashable, watts: float) -> float:
        now = self._clock()
        previous = self._last.get(key)
        joules = 0.0 if previous is None else previous[2] + (now - previous[0]) * (watts + previous[1]) / 2
        self._last[key] = (now, watts, joules)
        return joules
