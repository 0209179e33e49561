"""Stall detection: a thread that notices when no training step has finished for a while.

It only reads two attributes of the callback's step clock, so the training thread does
nothing for it. It arms at the first step that finishes after it starts: the first step
includes graph compilation, which can take far longer than any later step.
"""

from __future__ import annotations

import threading
import time
from typing import Callable, Protocol


class StepProgress(Protocol):
    step: int  # last finished step
    last_step_end: float  # time.perf_counter() when it finished (or when training began)


class StallWatchdog:
    """Calls `on_stall(last_step, idle_seconds)` once when no step has finished for
    `timeout` seconds, then `on_resume(step)` when the next step finishes."""

    def __init__(
        self,
        progress: StepProgress,
        timeout: float,
        on_stall: Callable[[int, float], None],
        on_resume: Callable[[int], None],
    ) -> None:
        self._progress = progress
        self._timeout = timeout
        self._on_stall = on_stall
        self._on_resume = on_resume
        self._started_at = progress.last_step_end
        # Detection lags a stall by at most one poll: a tenth of the timeout, within bounds.
        self._poll = min(max(timeout / 10.0, 0.01), 5.0)
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name="otel-mindformers-watchdog", daemon=True
        )

    def start(self) -> "StallWatchdog":
        self._thread.start()
        return self

    def stop(self, timeout: float = 1.0) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _run(self) -> None:
        stalled_since: float | None = None  # the step end the stall was measured from
        while not self._stop.wait(self._poll):
            last_end = self._progress.last_step_end
            if last_end == self._started_at:
                continue
            if stalled_since is not None:
                if last_end != stalled_since:
                    stalled_since = None
                    self._on_resume(self._progress.step)
                continue
            idle = time.perf_counter() - last_end
            if idle > self._timeout:
                stalled_since = last_end
                self._on_stall(self._progress.step, idle)
