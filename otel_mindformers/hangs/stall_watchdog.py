"""Stall detection: a thread that notices when no training step has finished for a while.

It only reads two attributes of the callback's step clock, so the training thread does
nothing for it. It arms at the first step that finishes after it starts: the first step
includes graph compilation, which can take far longer than any later step.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Protocol


class StepProgress(Protocol):
    step: int  # last finished step
    last_step_end: float  # time.perf_counter() when it finished (or when training began)


# Multiples of the timeout at which a stall is reported: the first notices it, the second
# (with a second stack dump) tells a stuck rank from a slow one.
THRESHOLDS = (1.0, 2.0)


class StallWatchdog:
    """Calls `on_stall(last_step, idle_seconds, threshold)` when no step has finished for
    `timeout` seconds (threshold 1) and again at twice that (threshold 2), then
    `on_resume(step)` when a step finishes, also one that finishes right before `stop()`."""

    def __init__(
        self,
        progress: StepProgress,
        timeout: float,
        on_stall: Callable[[int, float, int], None],
        on_resume: Callable[[int], None],
    ) -> None:
        self._progress = progress
        self._timeout = timeout
        self._on_stall = on_stall
        self._on_resume = on_resume
        self._started_at = progress.last_step_end
        self._stalled_since: float | None = None  # the step end the stall was measured from
        self._thresholds_passed = 0
        # Detection lags a stall by at most one poll: a tenth of the timeout, within bounds.
        self._poll = min(max(timeout / 10.0, 0.01), 5.0)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="otel-mindformers-watchdog", daemon=True)

    def start(self) -> StallWatchdog:
        self._thread.start()
        return self

    def stop(self, timeout: float = 1.0) -> None:
        """Stop after one last check, so a stall that has just ended gets its resume."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _run(self) -> None:
        while not self._stop.wait(self._poll):
            self._check(final=False)
        self._check(final=True)

    def _check(self, final: bool) -> None:
        last_end = self._progress.last_step_end
        if last_end == self._started_at:
            return
        if self._stalled_since is not None and last_end != self._stalled_since:
            self._stalled_since, self._thresholds_passed = None, 0
            self._on_resume(self._progress.step)
            return
        if final or self._thresholds_passed == len(THRESHOLDS):
            return
        idle = time.perf_counter() - last_end
        if idle > self._timeout * THRESHOLDS[self._thresholds_passed]:
            self._stalled_since = last_end
            self._thresholds_passed += 1
            self._on_stall(self._progress.step, idle, self._thresholds_passed)
