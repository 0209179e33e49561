"""Across a job: the first step at which any rank saw a non-finite value, and which ranks.

Evidence comes from the ranks' diagnosis files (`nonfinite_check: all_ranks` records each
rank's first NaN/Inf) and from the JSON logs of the reporting ranks (`"nonfinite"`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from otel_mindformers.outputs import diagnosis_file as records
from otel_mindformers.outputs.diagnosis_schema import DiagnosisRecords, read_records
from otel_mindformers.outputs.runs import is_set_aside


@dataclass
class FirstBad:
    step: int
    ranks: dict[int, list[str]] = field(default_factory=dict)  # rank -> non-finite values
    # Every rank named is non-finite on the oldest line its log kept, past step 1 (older
    # lines rotated away, or a resumed run): the values may have gone bad earlier.
    at_or_before: bool = False

    def describe(self) -> str:
        who = "; ".join(
            f"rank {rank} ({', '.join(metrics) or 'a logged value'})" for rank, metrics in sorted(self.ranks.items())
        )
        if self.at_or_before:
            return (
                f"first non-finite value at or before step {self.step} (the oldest line its log kept, "
                f"non-finite already): {who}"
            )
        return f"first non-finite value at step {self.step}: {who}"

    def to_json(self) -> dict[str, Any]:
        found: dict[str, Any] = {
            "step": self.step,
            "ranks": [{"rank": r, "metrics": m} for r, m in sorted(self.ranks.items())],
        }
        if self.at_or_before:  # only then: the step is an upper bound
            found["at_or_before"] = True
        return found


def first_nonfinite(
    evidence: Iterable[tuple[int, int, list[str]]], *, logged: Iterable[tuple[int, int, list[str], bool]] = ()
) -> FirstBad | None:
    """`evidence`: (rank, step, metric names) of non-finite observations (the diagnosis
    records: each rank's first); `logged`: the same from the JSON logs, each a log's first
    non-finite line, and whether that line is the oldest its log kept, past step 1. The
    earliest step wins, and every rank seen at that step is named; where only such oldest
    lines name it, the step is an upper bound (`at_or_before`)."""
    first: FirstBad | None = None
    certain = False  # evidence at the winning step that is not a log's oldest kept line
    for rank, step, metrics, oldest in [*((*one, False) for one in evidence), *logged]:
        if first is None or step < first.step:
            first, certain = FirstBad(step), False
        if step == first.step:
            known = first.ranks.setdefault(rank, [])
            known.extend(m for m in metrics if m not in known)
            certain = certain or not oldest
    if first is not None:
        first.at_or_before = not certain
    return first


def oldest_line_step(first_step: int | None, first_nonfinite_step: int) -> bool:
    """Whether a log's first non-finite step is its oldest kept line, and that line is not
    the start of training (step 1): nothing in the log says the values were finite before."""
    return first_step is not None and first_step > 1 and first_nonfinite_step == first_step


def from_diagnosis(read: DiagnosisRecords) -> Iterable[tuple[int, int, list[str]]]:
    """(rank, step, metrics) of the valid `nonfinite` records (outputs/diagnosis_schema.py)."""
    for record in read.of_kind(records.KIND_NONFINITE):
        yield record["rank"], record["step"], list(record.get("metrics", []))


def report_findings(series: Iterable[Any]) -> list[str]:
    """The `report` command's line naming the first bad rank: `series` are its summaries
    (`rank`, `files`, `nonfinite_steps`, and `first_step` where known); diagnosis files are
    looked for beside their files."""
    # `report` reads a folder's latest run (outputs/jsonl_reader.py `discover`); the diagnosis files
    # beside it are the current ones, unless that run's logs were set aside (outputs/runs.py):
    # then the set-aside ones, never the newer run's.
    series = list(series)
    only_kept = all(is_set_aside(f) for s in series for f in s.files)
    folders = {Path(f).parent for s in series for f in s.files}
    logged: list[tuple[int, int, list[str], bool]] = [
        (s.rank, s.nonfinite_steps[0], [], oldest_line_step(getattr(s, "first_step", None), s.nonfinite_steps[0]))
        for s in series
        if s.rank is not None and s.nonfinite_steps
    ]
    files = [
        f
        for folder in sorted(folders)
        for f in sorted(folder.glob(records.FILE_PATTERN))
        if (is_set_aside(f) if only_kept else records.is_current(f))
    ]
    read = read_records(files)
    first = first_nonfinite(from_diagnosis(read), logged=logged)
    return ([first.describe()] if first is not None else []) + read.notes
