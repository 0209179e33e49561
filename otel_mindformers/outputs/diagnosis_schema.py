"""The diagnosis records `report` and `hang-report` read, checked against their schema.

A record that is valid JSON but has wrong fields (a missing or null `rank`, `step: "12.5"`,
`threads` as a string, frames without `line`, `metrics: 5`) is skipped with a note naming
its file and line, as an unparseable line is, so one bad record never hides the other
ranks. What a record must hold (outputs/diagnosis_file.py writes it):

- every record: `kind` (a string), `rank` (an integer >= 0), `step` (an integer), and
  `time_stamp` (a finite number) when present;
- `stacks`: `threads`, a list of objects each with `name` (string), `ident` (integer) and
  `frames`, a list of objects each with `file`, `function` (strings) and `line` (integer),
  and `omitted_frames` an integer when present; `last_step_time` and `idle_seconds` finite
  numbers, `phase`, `verdict` and `reason` strings, each when present and not null;
- `nonfinite`: `metrics`, a list of strings.
"""

from __future__ import annotations

import fnmatch
import math
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeGuard

from otel_mindformers.outputs import diagnosis_file as records
from otel_mindformers.outputs.jsonl_reader import walk_files

_INT64 = 2**63  # steps and ranks past 64 bits are no step or rank (a corrupted record)


def _integer(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and -_INT64 <= value < _INT64


def _finite(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _frames_problem(frames: object) -> str | None:
    if not isinstance(frames, list):
        return "frames is not a list"
    for frame in frames:
        if not isinstance(frame, dict):
            return "a frame is not an object"
        if not (isinstance(frame.get("file"), str) and isinstance(frame.get("function"), str)):
            return "a frame has no file or function"
        if not _integer(frame.get("line")):
            return "a frame's line is not an integer"
    return None


def problem(record: dict[str, Any]) -> str | None:
    """Why `record` cannot be read as a diagnosis record, or None when it can."""
    rank = record.get("rank")
    if not _integer(rank) or rank < 0:
        return f"rank is {rank!r}, not an integer >= 0"
    if not _integer(record.get("step")):
        return f"step is {record.get('step')!r}, not an integer"
    if "time_stamp" in record and not _finite(record["time_stamp"]):
        return f"time_stamp is {record['time_stamp']!r}, not a number"
    kind = record["kind"]
    if kind == records.KIND_STACKS:
        for key in ("last_step_time", "idle_seconds"):
            if record.get(key) is not None and not _finite(record[key]):
                return f"{key} is not a number"
        for key in ("phase", "verdict", "reason"):
            if record.get(key) is not None and not isinstance(record[key], str):
                return f"{key} is not a string"
        threads = record.get("threads")
        if not isinstance(threads, list):
            return "threads is not a list"
        for thread in threads:
            if not isinstance(thread, dict) or not isinstance(thread.get("name"), str):
                return "a thread has no name"
            if not _integer(thread.get("ident")):
                return "a thread's ident is not an integer"
            if not _integer(thread.get("omitted_frames", 0)):
                return "a thread's omitted_frames is not an integer"
            found = _frames_problem(thread.get("frames", []))
            if found:
                return found
    elif kind == records.KIND_NONFINITE:
        metrics = record.get("metrics", [])
        if not isinstance(metrics, list) or not all(isinstance(m, str) for m in metrics):
            return "metrics is not a list of names"
    return None


@dataclass
class DiagnosisRecords:
    """The valid records of some diagnosis files, and a note per line left out."""

    records: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def of_kind(self, kind: str) -> Iterator[dict[str, Any]]:
        return (record for record in self.records if record["kind"] == kind)


def find_files(inputs: Iterable[str | os.PathLike[str]]) -> list[Path]:
    """Diagnosis files named directly (a previous run's kept one too), or the current ones
    under folders, found by the walk every command uses (through symbolic links to rank
    folders): a previous run's, set aside as `diagnosis_rank_<r>.<when>.jsonl`
    (outputs/runs.py), is not this run's."""
    found: dict[Path, None] = {}
    for item in inputs:
        path = Path(item)
        if path.is_dir():
            for file in walk_files(path):
                if fnmatch.fnmatchcase(file.name, records.FILE_PATTERN) and records.is_current(file):
                    found.setdefault(file, None)
        elif records.is_diagnosis_file(path) and path.is_file():
            found.setdefault(path, None)
    return list(found)


def read_records(files: Iterable[Path]) -> DiagnosisRecords:
    """Every file's records; lines that are not JSON objects with a `kind` are skipped as
    before (a write cut by a kill), records with wrong fields and lines too long to be a
    record with a note."""
    read = DiagnosisRecords()
    for path in files:
        try:
            for number, record in records.numbered_records(path, read.notes):
                found = problem(record)
                if found is None:
                    read.records.append(record)
                else:
                    read.notes.append(f"{path}:{number}: diagnosis record skipped ({found})")
        except OSError as exc:
            read.notes.append(f"{path}: cannot read ({exc.strerror})")
    return read


__all__ = ["DiagnosisRecords", "find_files", "problem", "read_records"]
