"""One run per file: what a new run does with the files a previous run left at its paths.

A run that starts at step 0 is a new run: the previous run's JSON log and event files are
kept under a name that says when that run last wrote (`train_metric.20261105-101530.json`,
`rank_0/20261105-101530/`), and the run writes into fresh ones. A run that starts past step 0
continues the previous run's step count (a resumed run) and writes on after it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path


def is_resumed(first_step: int) -> bool:
    """A run whose step count starts past 0 goes on from where an earlier one stopped."""
    return first_step > 0


def stamp(last_write: float) -> str:
    """The previous run's name: the local time it last wrote, to the second."""
    return time.strftime("%Y%m%d-%H%M%S", time.localtime(last_write))


def free_name(name_for: Callable[[str], Path], run_stamp: str) -> Path:
    """`name_for(stamp)`, or `name_for(stamp_2)`, ... when two runs ended in the same second
    (`_` sorts after `.` and `/`: names sort in the order the runs ended)."""
    candidate, number = name_for(run_stamp), 1
    while candidate.exists():
        number += 1
        candidate = name_for(f"{run_stamp}_{number}")
    return candidate
