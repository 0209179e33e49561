"""One run per file: what a new run does with the files a previous run left at its paths.

A run that starts at step 0 is a new run: the previous run's JSON log and event files are
kept under a name that says when that run last wrote (`train_metric.20261105-101530.json`,
`rank_0/20261105-101530/`), and the run writes into fresh ones. A run that starts past step 0
continues the previous run's step count (a resumed run) and writes on after it.

The same rule holds for every file a run writes at a fixed path: the JSON log, the
TensorBoard folder, and the rank's diagnosis file (`diagnosis_rank_<r>.jsonl`: stack dumps
and the first non-finite value, kept as `diagnosis_rank_<r>.<when>.jsonl`), so nothing of
an earlier run is read as this run's. A live run's files are never set aside: a run of
another job started at its paths writes elsewhere (`folder_beside`; the job's ledger
tells that a run lives there, restarts/run_attempt.py). `set_previous_run_aside` sets a plain file aside
(`set_aside_unless_resumed` where a run applies the rule; outputs/tensorboard.py has the
folder's); the readers find only the current names when they walk a folder.
"""

from __future__ import annotations

import os
import re
import shutil
import time
from collections.abc import Callable
from pathlib import Path

from otel_mindformers.core.file_lock import FileLocked, lock_within
from otel_mindformers.core.guarded_log import get_logger

_logger = get_logger(__name__)


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


def set_previous_run_aside(path: Path) -> Path | None:
    """Keep the lines a previous run left in the plain file `path` (the JSON log, the
    diagnosis file) as `{stem}.{when}{suffix}` (its rotated backups `.N` follow it) and
    start `path` empty; the new name, or None if there was nothing.

    The current file is copied and emptied in place, not renamed: a custom monitor that
    opened `path` before the run started (the monitor_config article's opens it in its
    constructor) keeps writing into this run's file. It is done holding the file's lock (the
    JSON sink's, outputs/jsonl.py), waited for a bounded time: a lock held past it raises
    FileLocked (core/file_lock.py), for the caller to say what it gives up. Another failure
    (a full disk while copying) is one warning and leaves the file as it was: the run then
    appends to it."""
    try:
        return _copy_aside_and_empty(path)
    except FileNotFoundError:
        return None
    except FileLocked:
        raise
    except OSError as exc:
        _logger.warning(
            "otel_mindformers: cannot set the previous run's %s aside (%s); this run appends to it", path, exc.strerror
        )
        return None


def _copy_aside_and_empty(path: Path) -> Path | None:
    fd = os.open(path, os.O_RDWR)
    try:
        lock_within(fd, path)  # released by close
        backups = _backups_of(path)
        if os.fstat(fd).st_size == 0 and not backups:
            return None
        last_write = max([os.fstat(fd).st_mtime] + [b.stat().st_mtime for _, b in backups])
        target = free_name(lambda when: path.with_name(f"{path.stem}.{when}{path.suffix}"), stamp(last_write))
        try:
            shutil.copyfile(path, target)
        except OSError:
            target.unlink(missing_ok=True)  # no half copy beside a file left whole
            raise
        for index, backup in backups:
            os.replace(backup, target.with_name(f"{target.name}.{index}"))
        os.ftruncate(fd, 0)
    finally:
        os.close(fd)
    _logger.info("otel_mindformers: the previous run's %s is kept as %s", path, target.name)
    return target


def _backups_of(path: Path) -> list[tuple[int, Path]]:
    """The rotated backups `path.N` beside `path`."""
    pattern = re.compile(re.escape(path.name) + r"\.(\d+)")
    return [
        (int(match[1]), Path(entry.path))
        for entry in os.scandir(path.parent)
        if (match := pattern.fullmatch(entry.name)) and entry.is_file()
    ]


def set_aside_unless_resumed(path: Path, first_step: int) -> Path | None:
    """A new run sets the lines a previous run left at `path` aside; a resumed run appends.
    Returns where the previous run's lines went, or None (a lock held too long is one
    warning: this run appends)."""
    if is_resumed(first_step):
        return None
    try:
        return set_previous_run_aside(path)
    except FileLocked as exc:
        _logger.warning(
            "otel_mindformers: cannot set the previous run's %s aside (%s); this run appends to it", path, exc
        )
        return None


def folder_beside(json_log_path: str, token: str) -> Path:
    """The JSON log's folder with `.{token}` after its name, beside it (`out/train_metric.json`
    → `out.{token}`): where a run writes when another job's run lives at its paths (their
    files are never taken over). Beside, not inside: a reader walking `out/` finds only the
    live run's files."""
    folder = Path(os.path.abspath(json_log_path)).parent
    return folder.with_name(f"{folder.name}.{token}")


def paths_in(folder: Path, json_log_path: str, tensorboard_path: str) -> tuple[str, str]:
    """`json_log_path` and `tensorboard_path` moved into `folder`: the log by its name (its
    ledger, flight ring and diagnosis file go with it), the TensorBoard folder by its path
    below the log's folder when it was there (`out/tensorboard_log` → `{folder}/tensorboard_log`),
    else by its name."""
    log = Path(os.path.abspath(json_log_path))
    board = Path(os.path.abspath(tensorboard_path))
    moved_board = folder / (board.relative_to(log.parent) if board.is_relative_to(log.parent) else board.name)
    return str(folder / log.name), str(moved_board)
