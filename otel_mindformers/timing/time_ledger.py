"""Where a run's wall time goes: the seconds lost per phase, and goodput.

Goodput is the fraction of wall time spent in productive training steps since the run's
origin (the interpreter's start for the first run of a process, else the run's start):
`(wall - lost) / wall`, where `lost` sums the phases — start-up, compile (the first step's
excess over the steady step), data wait, evaluation, checkpoint save/load and user-marked
phases. The phases are disjoint by construction: data wait is the time between steps that
no other phase covers, start-up the time before the first step that no other phase covers.
Written and read on the sampled-step pipeline's worker thread only (accounting.py).
"""

from __future__ import annotations


class TimeLedger:
    def __init__(self, origin_wall: float) -> None:
        self.origin_wall = origin_wall
        self.lost: dict[str, float] = {}

    def add(self, phase: str, seconds: float) -> None:
        if seconds > 0:
            self.lost[phase] = self.lost.get(phase, 0.0) + seconds

    def total_lost(self) -> float:
        return sum(self.lost.values())

    def goodput(self, now_wall: float) -> float | None:
        """Productive fraction of the wall time so far; None before any time has passed."""
        wall = now_wall - self.origin_wall
        if wall <= 0:
            return None
        return min(1.0, max(0.0, (wall - self.total_lost()) / wall))

    def breakdown(self, now_wall: float) -> dict[str, float]:
        """Seconds by phase, with `wall` and `productive`, for the JSON line and the report."""
        wall = max(0.0, now_wall - self.origin_wall)
        # Built on every sampled step on the training thread: a flat copy, nothing more.
        return {"wall": wall, "productive": max(0.0, wall - self.total_lost()), **self.lost}
