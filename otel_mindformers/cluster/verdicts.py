"""This rank's verdicts about its own device and node, as `occur` / `recover` transitions.

Pure state machines, fed once per sampled record on the pipeline's worker thread (the stall
verdict comes from a stall watchdog instead: cluster/part.py). Each verdict is about this
rank alone, as the straggler signal is: no rank waits for another to judge it.

- SDC suspect (`SdcVerdict`): this rank's own loss (the value it computed before any
  all-reduce) turns non-finite `strikes` times within `window` sampled steps, each time
  after a finite one. Where loss scaling skips the step, the parameters stay finite and the
  NaN returns only on the rank whose device made it; where the parameters take the NaN,
  every rank stays non-finite from then on: one episode each, never a suspect.
- slow node (`SlowNodeVerdict`): this rank waits for its next batch more than `data_share`
  of its window's wall time for `windows` windows in a row (stragglers/: the others wait
  for it inside their step), in a job of more than one rank.

Both recover after `recover_after` clean sampled steps in a row.
"""

from __future__ import annotations

import math
from collections import deque

from otel_mindformers.core.step_record import StepRecord
from otel_mindformers.names import straggler_names
from otel_mindformers.names.training import LOSS
from otel_mindformers.stragglers.sections import WINDOW_KEY

OCCUR, RECOVER = "occur", "recover"


class _Recovery:
    """Open after an occur; clean samples in a row close it."""

    def __init__(self, recover_after: int) -> None:
        self._needed = recover_after
        self.open = False
        self._clean = 0

    def opened(self) -> None:
        self.open, self._clean = True, 0

    def clean(self) -> bool:
        """One clean sample; True when it closes the verdict."""
        if not self.open:
            return False
        self._clean += 1
        if self._clean >= self._needed:
            self.open = False
            return True
        return False

    def dirty(self) -> None:
        self._clean = 0


class SdcVerdict:
    def __init__(self, strikes: int, window: int, recover_after: int) -> None:
        self._strikes = strikes
        self._window = window
        self._episodes: deque[int] = deque()  # the sample index each episode began at
        self._samples = 0
        self._was_bad = False
        self._recovery = _Recovery(recover_after)
        self.detail = ""

    def feed(self, record: StepRecord) -> str | None:
        loss = record.values.get(LOSS)
        if loss is None or isinstance(loss, bool):
            return None  # this rank read no loss on this step: nothing to judge
        self._samples += 1
        bad = not math.isfinite(float(loss))
        onset = bad and not self._was_bad
        self._was_bad = bad
        if not bad:
            return RECOVER if self._recovery.clean() else None
        self._recovery.dirty()
        if not onset:
            return None
        self._episodes.append(self._samples)
        while self._episodes and self._episodes[0] <= self._samples - self._window:
            self._episodes.popleft()
        if len(self._episodes) >= self._strikes and not self._recovery.open:
            self._recovery.opened()
            self._episodes.clear()
            self.detail = (
                f"this rank's own loss turned non-finite {self._strikes} times within {self._window} "
                f"sampled steps, the last at step {record.step}"
            )
            return OCCUR
        return None


class SlowNodeVerdict:
    def __init__(self, data_share: float, windows: int, recover_after: int) -> None:
        self._share = data_share
        self._windows = windows
        self._streak = 0
        self._recovery = _Recovery(recover_after)
        self.detail = ""

    def feed(self, record: StepRecord) -> str | None:
        sections = record.sections
        window = sections.get(WINDOW_KEY) or 0.0
        if window <= 0 or record.world_size <= 1:
            return None
        share = sections.get(straggler_names.SECTION_DATA_WAIT, 0.0) / window
        if share <= self._share:
            self._streak = 0
            return RECOVER if self._recovery.clean() else None
        self._recovery.dirty()
        self._streak += 1
        if self._streak >= self._windows and not self._recovery.open:
            self._recovery.opened()
            self.detail = (
                f"this rank waited for its data {share:.0%} of its window ({self._windows} windows in a row "
                f"over {self._share:.0%}) at step {record.step}: the job waits for it"
            )
            return OCCUR
        return None


__all__ = ["OCCUR", "RECOVER", "SdcVerdict", "SlowNodeVerdict"]
