"""The per-rank diagnosis file beside the JSON log: `diagnosis_rank_<r>.jsonl`.

One JSON object per line, written rarely (a stack dump, the first non-finite value), each
with `kind` ("stacks" or "nonfinite"), `rank`, `time_stamp` (Unix s) and the rank's last
finished `step`. `otel-mindformers hang-report` and `report` read them back.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from otel_mindformers.core import safe_json
from otel_mindformers.outputs.runs import is_set_aside

KIND_STACKS = "stacks"
KIND_NONFINITE = "nonfinite"
FILE_PATTERN = "diagnosis_rank_*.jsonl"
_RANK_IN_NAME = re.compile(r"diagnosis_rank_(\d+)(?:\.[0-9_-]+)?\.jsonl$")


def diagnosis_path(json_log_path: str | os.PathLike[str], rank: int) -> Path:
    """Where rank `rank` writes, beside the JSON log (whether or not `json_file` is on)."""
    return Path(json_log_path).parent / f"diagnosis_rank_{rank}.jsonl"


def append(path: Path, record: dict[str, Any]) -> None:
    """One line in one write(2) on an O_APPEND file: concurrent writers never interleave."""
    line = (json.dumps(record, ensure_ascii=False, allow_nan=False) + "\n").encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def is_diagnosis_file(path: Path) -> bool:
    """Whether `path` is named as a rank's diagnosis file (a kept one of an earlier run too)."""
    return _RANK_IN_NAME.search(path.name) is not None


def is_current(path: Path) -> bool:
    """Whether `path` is a rank's current diagnosis file, not one a later run set aside."""
    return _RANK_IN_NAME.search(path.name) is not None and not is_set_aside(path)


def numbered_records(path: Path, notes: list[str]) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, record) for each line of `path` that is a JSON object with a `kind`. A
    line that is not (a write cut by a kill) is skipped; one longer than any record
    (safe_json.MAX_LINE_CHARS) is skipped over unread, with a note in `notes`."""
    with path.open(encoding="utf-8", errors="replace") as lines:
        for number, line in safe_json.bounded_lines(lines):
            if line is None:
                notes.append(f"{path}:{number}: diagnosis record skipped ({safe_json.TOO_LONG})")
                continue
            try:
                record = safe_json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict) and isinstance(record.get("kind"), str):
                yield number, record


def read(path: Path) -> Iterator[dict[str, Any]]:
    """The file's records (`numbered_records`, without the notes)."""
    return (record for _, record in numbered_records(path, []))
