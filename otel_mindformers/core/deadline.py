"""One time budget shared by consecutive stages (a run's shutdown: alerts, outputs, telemetry).

Each stage is given `deadline.remaining()`, so a slow stage leaves less to the next and the
whole takes the budget once, not once per stage.
"""

from __future__ import annotations

import time


class Deadline:
    """`seconds` from now, on the monotonic clock."""

    def __init__(self, seconds: float) -> None:
        self._end = time.monotonic() + max(0.0, seconds)

    def remaining(self) -> float:
        """Seconds left, never negative."""
        return max(0.0, self._end - time.monotonic())

    @property
    def expired(self) -> bool:
        return self.remaining() == 0.0
