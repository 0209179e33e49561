"""One run per file: what a new run does with the files a previous run left at its paths.

A run that starts at step 0 is a new run: the previous run's JSON log and event files are
kept under a name that says when that run last wrote (`train_metric.20261105-101530.json`,
`rank_0/20261105-101530/`), and the run writes into fresh ones. A run that starts past step 0
continues the previous run's step count (a resumed run) and writes on after it.

The same rule holds for every file a run writes at a fixed path: the JSON log, the
TensorBoard folder, and the rank's diagnosis file (`diagnosis_rank_<r>.jsonl`: stack dumps
and the first non-finite value, kept as `diagnosis_rank_<r>.<when>.jsonl`), so nothing of
an earlier run is read as this run's. `set_aside_unless_resumed` is where a run applies it
to a plain file; the readers find only the current names when they walk a folder.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable
from pathlib import Path


def is_resumed(first_step: int) -> bool:
    """A run whose step count starts past 0 goes on from where an earlier one stopped."""
    return first_step > 0


def stamp(last_write: float) -> str:
    """The previous run's name: the local time it last wrote, to the second."""
    return time.strftime("%Y%m%d-%H%M%S", time.localtime(last_write))


# What `free_name(..., stamp(...))` adds to a kept file's stem: `.20261105-101530`, `_2` after it.
_KEPT_STAMP = re.compile(r"\.\d{8}-\d{6}(?:_\d+)?$")


def set_aside_stamp(path: str | os.PathLike[str]) -> str | None:
    """The stamp of the run that wrote `path` when a later run set it aside
    (`train_metric.20261105-101530.json` → `20261105-101530`, `_2` included; rotated
    backups `.N` after it too); None for a file no run set aside. Stamps sort in the
    order the runs ended."""
    name = Path(path).name
    stem = name.split(".", 1)[0]
    rest = name[len(stem) :]
    parts = rest.split(".")  # "", stamp, suffix, [backup index]
    if len(parts) >= 3 and _KEPT_STAMP.search("." + parts[1]) is not None:
        return parts[1]
    return None


def is_set_aside(path: str | os.PathLike[str]) -> bool:
    """Whether `path` is a file a later run set aside (see `set_aside_stamp`)."""
    return set_aside_stamp(path) is not None


def free_name(name_for: Callable[[str], Path], run_stamp: str) -> Path:
    """`name_for(stamp)`, or `name_for(stamp_2)`, ... when two runs ended in the same second
    (`_` sorts after `.` and `/`: names sort in the order the runs ended)."""
    candidate, number = name_for(run_stamp), 1
    while candidate.exists():
        number += 1
        candidate = name_for(f"{run_stamp}_{number}")
    return candidate


def set_aside_unless_resumed(path: Path, first_step: int) -> Path | None:
    """A new run sets the lines a previous run left at `path` aside (see jsonl); a resumed
    run appends. Returns where the previous run's lines went, or None."""
    if is_resumed(first_step):
        return None
    from otel_mindformers.outputs.jsonl import set_previous_run_aside  # jsonl imports this module

    return set_previous_run_aside(path)
