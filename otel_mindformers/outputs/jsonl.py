"""`json_file`: one strict-JSON object per sampled step, per rank.

A batch of lines goes out in a single `write(2)` on an O_APPEND descriptor while holding an
exclusive `flock`, so lines never interleave with another writer of the same file (the
article's custom monitor appends to `json_log_path` too, and several ranks may share a
folder). A disk error is said once, naming the path (outputs/sink.py), and the next batch
is tried again; lines already written stay whole.

With `log_rotation.max_bytes`, the file rolls over between two whole lines, under the same
lock: `x.json` becomes `x.json.1`, older backups shift up to `x.json.{backup_count}`, the
oldest is dropped. A writer that finds the path now names another file (someone else
rolled it over, moved it, removed its folder) reopens it before writing.

A new run sets the previous run's lines aside first (outputs/runs.py), so the file at
`json_log_path` holds one run. A resumed run writes on in the file; a half line a killed
writer left at its end is cut off first (`_cut_a_half_line`), so the new lines start on a
line of their own.

At start-up the lock is waited for a bounded time (core/file_lock.py): a writer frozen
while it held it (SIGSTOP, a suspended job, a hung NFS mount) makes the sink raise
FileLocked, and the run goes on without `json_file` (outputs/__init__.py says so once). At
run time the pipeline worker waits for it, never the training thread.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from collections.abc import Sequence
from pathlib import Path

from otel_mindformers.config import LogRotationConfig
from otel_mindformers.core import safe_json
from otel_mindformers.core.file_lock import LOCK_WAIT_SECONDS, FileLocked, lock_within
from otel_mindformers.core.guarded_log import get_logger
from otel_mindformers.core.step_record import StepRecord
from otel_mindformers.job.identity import Identity

_logger = get_logger(__name__)


def rank_path(json_log_path: str, identity: Identity) -> Path:
    """`json_log_path` itself for one process; `{stem}_rank_{x}{suffix}` beside it otherwise."""
    path = Path(json_log_path)
    if not identity.distributed:
        return path
    return path.with_name(f"{path.stem}_rank_{identity.rank}{path.suffix}")


_TAIL_BYTES = 64 * 1024  # a few step lines: the last one naming the job is among them


def _last_lines(path: Path) -> list[dict]:
    """The whole JSON-object lines of a bounded read of the log's tail, last first; [] when
    it cannot be read."""
    try:
        with path.open("rb") as handle:
            handle.seek(max(0, handle.seek(0, 2) - _TAIL_BYTES))
            tail = handle.read().decode("utf-8", errors="replace").splitlines()
    except OSError:
        return []
    lines = []
    for line in reversed(tail):
        try:
            parsed = safe_json.loads(line)
        except ValueError:
            continue
        if isinstance(parsed, dict):
            lines.append(parsed)
    return lines


def last_job_id(path: Path) -> str | None:
    """The job id of the last line of the log at `path` that names one; None when no line
    does, or it cannot be read."""
    for line in _last_lines(path):
        job = line.get("job")
        if isinstance(job, dict) and isinstance(job.get("id"), str):
            return job["id"]
    return None


def last_step_line(path: Path) -> dict | None:
    """The log's last line that has a step; None when it has none, or cannot be read."""
    return next((line for line in _last_lines(path) if isinstance(line.get("step"), int)), None)


# One encoder for every line: `json.dumps` with options builds a new one per call, which
# cost as much as encoding the line.
_ENCODER = json.JSONEncoder(allow_nan=False, separators=(", ", ": "))


def encode(record: StepRecord) -> bytes:
    return (_ENCODER.encode(record.to_json_dict()) + "\n").encode()


class JsonLinesSink:
    name = "json_file"

    def __init__(self, path: Path, rotation: LogRotationConfig | None = None, *, follow_links: bool = True) -> None:
        """`follow_links=False`: a link at `path` is an OSError (ELOOP), never written through,
        for a log whose name a file in a shared folder chose (flight_recorder/recovery.py)."""
        self.path = path
        self._rotation = rotation or LogRotationConfig()
        self._open_flags = 0 if follow_links else os.O_NOFOLLOW
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = self._open()
        try:
            self._lock_current_file(LOCK_WAIT_SECONDS)
        except FileLocked:
            os.close(self._fd)
            raise
        try:
            self._cut_a_half_line()
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def _cut_a_half_line(self) -> None:
        """Holding the lock: a writer killed mid-line (a kill inside a large write, a crash)
        left half a record at the end. Appended to as it is, the half line would take this
        run's first line with it, and the readers stop at a malformed line that is not the
        last. Cut back to the last whole line, with one warning."""
        size = os.fstat(self._fd).st_size
        if not size:
            return
        reader = os.open(self.path, os.O_RDONLY | self._open_flags)
        try:
            if os.pread(reader, 1, size - 1) == b"\n":
                return
            end = size
            whole = 0
            while end > 0:  # back to the last newline, 64 KiB at a time
                start = max(0, end - 65536)
                found = os.pread(reader, end - start, start).rfind(b"\n")
                if found >= 0:
                    whole = start + found + 1
                    break
                end = start
            half = os.pread(reader, min(size - whole, 80), whole)
        finally:
            os.close(reader)
        os.ftruncate(self._fd, whole)
        _logger.warning(
            "otel_mindformers: %s ended in half a line (%d bytes, %r...: a writer killed mid-line); "
            "cut back to its last whole line before appending",
            self.path,
            size - whole,
            half.decode("utf-8", "replace"),
        )

    def _open(self) -> int:
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | self._open_flags
        try:
            return os.open(self.path, flags, 0o644)
        except FileNotFoundError:  # its folder removed while the run writes (`rm -rf out/`)
            self.path.parent.mkdir(parents=True, exist_ok=True)
            return os.open(self.path, flags, 0o644)

    def write(self, records: Sequence[StepRecord]) -> None:
        try:
            self.append([encode(record) for record in records])
        except OSError as exc:
            raise OSError(f"cannot write {self.path}: {exc.strerror}") from exc

    def append(self, lines: Sequence[bytes]) -> None:
        """Whole lines (each ends in a newline), under one lock, in one write per file."""
        self._lock_current_file()
        try:
            size = os.fstat(self._fd).st_size
            limit = self._rotation.max_bytes
            chunk: list[bytes] = []
            for line in lines:
                # A line longer than max_bytes still gets a file of its own, never an empty backup.
                if size and 0 < limit < size + len(line):
                    self._write_whole(b"".join(chunk))
                    self._roll_over()
                    # Another writer may have written into the new file before our lock on it.
                    size, chunk = os.fstat(self._fd).st_size, []
                chunk.append(line)
                size += len(line)
            self._write_whole(b"".join(chunk))
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def _write_whole(self, data: bytes) -> None:
        if not data:
            return
        written = os.write(self._fd, data)
        if written != len(data):
            # A short write (disk full) leaves part of a line: cut the file back to the last whole one.
            whole = data.rfind(b"\n", 0, written) + 1
            os.ftruncate(self._fd, os.fstat(self._fd).st_size - written + whole)
            raise OSError(28, "No space left on device")

    def _lock_current_file(self, wait: float | None = None) -> None:
        """Lock the file `path` names now: while we waited, another writer may have rolled it
        over. `wait`: at most that many seconds in all (then FileLocked); None: as long as it takes."""
        until = None if wait is None else time.monotonic() + wait
        while True:
            if wait is None:
                fcntl.flock(self._fd, fcntl.LOCK_EX)
            else:
                lock_within(self._fd, self.path, wait, until=until)
            try:
                if os.stat(self.path).st_ino == os.fstat(self._fd).st_ino:
                    return
            except FileNotFoundError:
                pass
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = self._open()

    def _roll_over(self) -> None:
        """Holding the lock: shift the backups up, start a fresh file and move the lock to it."""
        for index in range(self._rotation.backup_count - 1, 0, -1):
            older = self._backup(index)
            if older.exists():
                os.replace(older, self._backup(index + 1))
        os.replace(self.path, self._backup(1))
        previous, self._fd = self._fd, self._open()
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        fcntl.flock(previous, fcntl.LOCK_UN)
        os.close(previous)

    def _backup(self, index: int) -> Path:
        return self.path.with_name(f"{self.path.name}.{index}")

    def close(self) -> None:
        os.close(self._fd)
