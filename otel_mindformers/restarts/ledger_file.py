"""The per-job ledger file of one rank: the job's attempts, beside the outputs.

`{json_log_path stem}.job.rank_{rank}.ledger` holds one JSON object: the job id and a list
of attempts (restarts/attempt_tracker.py says what an attempt records). One file per rank, so ranks
never write the same file. Two attempts of one rank that overlap (a restarted process
while the old one is still dying) each change only their own entry: a read-modify-write
under an exclusive `flock` on a `.lock` file beside it. The file itself is replaced whole
(`os.replace` of a temporary file in the same folder), so a reader, or a process killed
mid-write, sees the old ledger or the new one, never half of one.

A ledger that cannot be read as one (corrupt, truncated, another program's file, one past
`MAX_LEDGER_BYTES`, a FIFO) gives one warning, is kept aside as `*.corrupt`, and a fresh
ledger starts: never a crash.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from otel_mindformers.core import safe_json
from otel_mindformers.core.bounded_read import read_small_file
from otel_mindformers.core.file_lock import LOCK_WAIT_SECONDS, lock_within
from otel_mindformers.core.guarded_log import get_logger

_logger = get_logger(__name__)

LEDGER_VERSION = 1
# An attempt's entry is a few hundred bytes: 16 MiB are tens of thousands of restarts. A
# larger file, or one that is no regular file, is not ours: kept aside, as a corrupt one.
MAX_LEDGER_BYTES = 16 << 20
LEDGER_SUFFIX = ".ledger"


def ledger_path(json_log_path: str, rank: int) -> Path:
    """Where rank `rank` keeps the job's ledger: beside the JSON log."""
    path = Path(json_log_path)
    return path.with_name(f"{path.stem}.job.rank_{rank}{LEDGER_SUFFIX}")


def _valid(data: Any) -> bool:
    return (
        isinstance(data, dict)
        and data.get("version") == LEDGER_VERSION
        and isinstance(data.get("job_id"), str)
        and isinstance(data.get("attempts"), list)
        and all(isinstance(a, dict) and isinstance(a.get("attempt"), int) for a in data["attempts"])
    )


def read_ledger(path: Path, *, repair: bool = True) -> dict[str, Any] | None:
    """The ledger at `path`, or None when there is none or it is unreadable (one warning;
    with `repair`, the bad file is kept aside as `*.corrupt` so a fresh ledger can start,
    and a path that cannot be read at all, a folder say, raises its OSError)."""
    try:
        text = read_small_file(path, MAX_LEDGER_BYTES)  # None: too large, or a FIFO: not ours
    except FileNotFoundError:
        return None
    except OSError as exc:
        if repair:  # a writer: a path it cannot read it cannot write either, and says so once itself
            raise
        _logger.warning_once(
            str(path), "otel_mindformers: cannot read the job ledger %s (%s); left out", path, exc.strerror
        )
        return None
    try:
        data = safe_json.loads(text) if text is not None else None
    except (ValueError, UnicodeDecodeError):
        data = None
    if _valid(data):
        return data
    if not repair:
        _logger.warning_once(str(path), "otel_mindformers: the job ledger %s is corrupt or truncated; left out", path)
        return None
    aside = path.with_name(path.name + ".corrupt")
    with contextlib.suppress(OSError):
        os.replace(path, aside)
    _logger.warning_once(
        str(path),
        "otel_mindformers: the job ledger %s is corrupt or truncated (kept as %s); starting a fresh one",
        path,
        aside.name,
    )
    return None


def write_ledger(path: Path, data: dict[str, Any]) -> None:
    """Replace the ledger at `path` whole (a temporary file, then `os.replace`)."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        with open(temporary, "w", encoding="utf-8") as stream:
            json.dump(data, stream, allow_nan=False, separators=(",", ":"))
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            temporary.unlink()
        raise


@contextlib.contextmanager
def locked(path: Path, wait: float = LOCK_WAIT_SECONDS) -> Iterator[None]:
    """Exclusive use of the ledger at `path` between processes (`flock` on `path.lock`),
    waited for at most `wait` seconds (then FileLocked, core/file_lock.py: a holder frozen
    while writing costs the run its ledger, never its training)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lock_path = path.with_name(path.name + ".lock")
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        lock_within(fd, lock_path, wait)
        yield
    finally:
        os.close(fd)  # releases the lock


def update_ledger(path: Path, change: Callable[[dict[str, Any] | None], dict[str, Any]]) -> dict[str, Any]:
    """Read, change and replace the ledger under the lock; returns what was written."""
    with locked(path):
        data = change(read_ledger(path))
        write_ledger(path, data)
        return data


def new_ledger(job_id: str) -> dict[str, Any]:
    return {"version": LEDGER_VERSION, "job_id": job_id, "attempts": []}


__all__ = [
    "LEDGER_SUFFIX",
    "ledger_path",
    "locked",
    "new_ledger",
    "read_ledger",
    "update_ledger",
    "write_ledger",
]
