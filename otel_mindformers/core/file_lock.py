"""An exclusive `flock` between processes, waited for a bounded time.

A lock on one of our files is held by another writer for the length of one write
(milliseconds), or by a process frozen while it held it (SIGSTOP, a suspended job, a hung
NFS mount), for as long as it stays frozen. Telemetry never waits for that: past
`LOCK_WAIT_SECONDS` the caller gives up what it meant to write (one warning), never the
training. The JSON log's start-up (outputs/jsonl.py), setting a previous run's log aside
(outputs/runs.py) and the job ledger (restarts/ledger_file.py) wait through here.
"""

from __future__ import annotations

import fcntl
import os
import time

LOCK_WAIT_SECONDS = 1.0
_RETRY_SECONDS = 0.02


class FileLocked(OSError):
    """Another process held the lock for longer than the wait; the message names the file."""


def lock_within(
    fd: int, path: str | os.PathLike[str], wait: float = LOCK_WAIT_SECONDS, *, until: float | None = None
) -> None:
    """Take the exclusive `flock` on `fd` (the open file `path`), waiting at most `wait`
    seconds (or until the monotonic time `until`, for a caller that waits in several tries:
    `wait` is then what it waited in all): then FileLocked. Released by `flock(LOCK_UN)` or
    by closing `fd`."""
    deadline = time.monotonic() + wait if until is None else until
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() >= deadline:
                raise FileLocked(
                    f"{os.fspath(path)} is held by another process for more than {wait:g} s "
                    "(a frozen or suspended earlier writer?)"
                ) from None
            time.sleep(_RETRY_SECONDS)


__all__ = ["LOCK_WAIT_SECONDS", "FileLocked", "lock_within"]
