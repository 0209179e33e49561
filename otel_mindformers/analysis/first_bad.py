"""Across a job: the first step at which any rank saw a non-finite value, and which ranks.

Evidence comes from the ranks' diagnosis files (`nonfinite_check: all_ranks` records each
rank's first NaN/Inf) and from the JSON logs of the reporting ranks (`"nonfinite"`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from otel_mindformers.analysis.diagnosis_schema import DiagnosisRecords, read_records
from otel_mindformers.diagnosis import records
from otel_mindformers.outputs.runs import is_set_aside


@dataclass
class FirstBad:
    step: int
    ranks: dict[int, list[str]] = field(default_factory=dict)  # rank -> non-finite values

    def describe(self) -> str:
        who = "; ".join(
            f"rank {rank} ({', '.join(metrics) or 'a logged value'})" for rank, metrics in sorted(self.ranks.items())
        )
        return f"first non-finite value at step {self.step}: {who}"

    def to_json(self) -> dict[str, Any]:
        return {"step": self.step, "ranks": [{"rank": r, "metrics": m} for r, m in sorted(self.ranks.items())]}


def first_nonfinite(evidence: Iterable[tuple[int, int, list[str]]]) -> FirstBad | None:
    """`evidence`: (rank, step, metric names) of non-finite observations; the earliest step
    wins, and every rank seen at that step is named."""
    first: FirstBad | None = None
    for rank, step, metrics in evidence:
        if first is None or step < first.step:
            first = FirstBad(step)
        if step == first.step:
            known = first.ranks.setdefault(rank, [])
            known.extend(m for m in metrics if m not in known)
    return first


def from_diagnosis(read: DiagnosisRecords) -> Iterable[tuple[int, int, list[str]]]:
    """(rank, step, metrics) of the valid `nonfinite` records (analysis/diagnosis_schema.py)."""
    for record in read.of_kind(records.KIND_NONFINITE):
        yield record["rank"], record["step"], list(record.get("metrics", []))


def report_findings(series: Iterable[Any]) -> list[str]:
    """The `report` command's line naming the first bad rank: `series` are its summaries
    (`rank`, `files`, `nonfinite_steps`); diagnosis files are looked for beside their files."""
    # `report` reads a folder's latest run (analysis/logs.py `discover`); the diagnosis files
    # beside it are the current ones, unless that run's logs were set aside (outputs/runs.py).
    series = list(series)
    only_kept = all(is_set_aside(f) for s in series for f in s.files)
    folders = {Path(f).parent for s in series for f in s.files}
    logged: list[tuple[int, int, list[str]]] = [
        (s.rank, s.nonfinite_steps[0], []) for s in series if s.rank is not None and s.nonfinite_steps
    ]
    files = [
        f
        for folder in sorted(folders)
        for f in sorted(folder.glob(records.FILE_PATTERN))
        if only_kept or records.is_current(f)
    ]
    read = read_records(files)
    first = first_nonfinite([*from_diagnosis(read), *logged])
    return ([first.describe()] if first is not None else []) + read.notes
