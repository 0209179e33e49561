"""`json_file`: one strict-JSON object per sampled step, per rank.

Each line goes out in a single `write(2)` on an O_APPEND descriptor while holding an
exclusive `flock`, so lines never interleave with another writer of the same file (the
article's custom monitor appends to `json_log_path` too, and several ranks may share a
folder). A disk error disables the sink with one warning naming the path; lines already
written stay whole.
"""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path

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

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def write(self, record: StepRecord) -> None:
        try:
            self.append(encode(record))
        except OSError as exc:
            raise OSError(f"cannot write {self.path}: {exc.strerror}") from exc

    def append(self, line: bytes) -> None:
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        try:
            written = os.write(self._fd, line)
            if written != len(line):
                # A short write (disk full) would leave half a line: cut it back off.
                os.ftruncate(self._fd, os.fstat(self._fd).st_size - written)
                raise OSError(28, "No space left on device")
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def close(self) -> None:
        os.close(self._fd)
