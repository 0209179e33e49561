"""`json_file`: one strict-JSON object per sampled step, per rank.

Each line goes out in a single `write(2)` on an O_APPEND descriptor while holding an
exclusive `flock`, so lines never interleave with another writer of the same file (the
article's custom monitor appends to `json_log_path` too, and several ranks may share a
folder). A disk error disables the sink with one warning naming the path; lines already
written stay whole.

With `log_rotation.max_bytes`, the file rolls over between two whole lines, under the same
lock: `x.json` becomes `x.json.1`, older backups shift up to `x.json.{backup_count}`, the
oldest is dropped. A writer that finds the path now names another file (someone else
rolled it over) reopens it before writing.
"""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path

from otel_mindformers.config import LogRotationConfig
from otel_mindformers.identity import Identity
from otel_mindformers.record import StepRecord


def rank_path(json_log_path: str, identity: Identity) -> Path:
    """`json_log_path` itself for one process; `{stem}_rank_{x}{suffix}` beside it otherwise."""
    path = Path(json_log_path)
    if not identity.distributed:
        return path
    return path.with_name(f"{path.stem}_rank_{identity.rank}{path.suffix}")


def encode(record: StepRecord) -> bytes:
    return (json.dumps(record.to_json_dict(), allow_nan=False, separators=(", ", ": ")) + "\n").encode()


class JsonLinesSink:
    name = "json_file"

    def __init__(self, path: Path, rotation: LogRotationConfig | None = None) -> None:
        self.path = path
        self._rotation = rotation or LogRotationConfig()
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = self._open()

    def _open(self) -> int:
        return os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def write(self, record: StepRecord) -> None:
        try:
            self.append(encode(record))
        except OSError as exc:
            raise OSError(f"cannot write {self.path}: {exc.strerror}") from exc

    def append(self, line: bytes) -> None:
        self._lock_current_file()
        try:
            size = os.fstat(self._fd).st_size
            # A line longer than max_bytes still gets a file of its own, never an empty backup.
            if size and 0 < self._rotation.max_bytes < size + len(line):
                self._roll_over()
            written = os.write(self._fd, line)
            if written != len(line):
                # A short write (disk full) would leave half a line: cut it back off.
                os.ftruncate(self._fd, os.fstat(self._fd).st_size - written)
                raise OSError(28, "No space left on device")
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def _lock_current_file(self) -> None:
        """Lock the file `path` names now: while we waited, another writer may have rolled it over."""
        while True:
            fcntl.flock(self._fd, fcntl.LOCK_EX)
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
