"""`otel-mindformers hang-report DIR...`: one job's per-rank stack dumps and heartbeats,
merged into which ranks are behind, where each group of ranks is stuck, and the first
non-finite value.

Heartbeats are each rank's last finished step and its time, from the newest of its JSON
log's last line and its latest stack dump, or the step its flight ring holds where that is
further (every step, where the log has the sampled ones; its time is then unknown). Ranks whose latest dumps hold the same stacks
(the same code positions in every thread that is not telemetry) form one group, shown once
with its ranks, as PyTorch's flight-recorder analysis groups ranks by collective.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from otel_mindformers.hangs.stacks import Frame, ThreadStack
from otel_mindformers.names.training import NONFINITE_WATCHED
from otel_mindformers.nonfinite.offline.first_bad_rank import (
    FirstBad,
    first_nonfinite,
    from_diagnosis,
    oldest_line_step,
)
from otel_mindformers.outputs import diagnosis_file as records
from otel_mindformers.outputs.diagnosis_schema import find_files, read_records
from otel_mindformers.outputs.jsonl_reader import GLOB_CHARS, local_time

FORMATS = ("text", "json")


@dataclass
class Heartbeat:
    rank: int
    step: int
    time_stamp: float | None  # Unix time the step finished (None when unknown)
    source: str  # "log", "dump" or "flight ring"
    behind_steps: int = 0
    behind_seconds: float | None = None


@dataclass
class StackGroup:
    ranks: list[int]
    threads: list[ThreadStack]  # the first rank's threads, telemetry threads left out
    phases: list[str]
    verdicts: list[str]
    reasons: list[str]

    def innermost(self) -> list[tuple[str, Frame, Frame | None]]:
        """Per thread: its innermost frame, and its innermost frame of the user's own code
        (outside the standard library and installed packages) when that is another one."""
        found = []
        for thread in self.threads:
            frame, own = thread.innermost(), thread.innermost_own_code()
            if frame is not None:
                found.append((thread.name, frame, None if own == frame else own))
        return found


@dataclass
class HangReport:
    heartbeats: list[Heartbeat]
    leading_step: int | None
    groups: list[StackGroup]
    ranks_without_dump: list[int]
    first_nonfinite: FirstBad | None
    dump_files: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # records skipped, with file and line

    @property
    def behind(self) -> list[Heartbeat]:
        return [h for h in self.heartbeats if h.behind_steps > 0]


class HangReportError(ValueError):
    """Nothing to report from the given paths."""


def build_hang_report(inputs: Sequence[str | Path]) -> HangReport:
    for item in inputs:  # as `report` says it: a mistyped folder is not "no dumps there"
        if not GLOB_CHARS & set(str(item)) and not os.path.lexists(item):
            raise HangReportError(f"{item}: no such file or directory")
    files = find_files(inputs)
    read = read_records(files)  # records with wrong fields are left out, each with a note
    latest: dict[int, dict[str, Any]] = {}
    for record in read.of_kind(records.KIND_STACKS):
        rank = record["rank"]
        if rank not in latest or record.get("time_stamp", 0.0) >= latest[rank].get("time_stamp", 0.0):
            latest[rank] = record
    beats = {rank: Heartbeat(rank, r["step"], r.get("last_step_time"), "dump") for rank, r in latest.items()}
    logged = _logged_series(inputs)
    for rank, step, stamp in _logged_heartbeats(logged):
        known = beats.get(rank)
        if known is None or step > known.step:
            beats[rank] = Heartbeat(rank, step, stamp, "log")
    for rank, step in _ring_heartbeats(inputs):  # a log line is a sampled step; the ring has every step
        known = beats.get(rank)
        if known is None or step > known.step:
            beats[rank] = Heartbeat(rank, step, None, "flight ring")
    if not beats:
        raise HangReportError(
            f"no stack dumps ({records.FILE_PATTERN}) or JSON step logs under {', '.join(map(str, inputs))}"
        )
    heartbeats = sorted(beats.values(), key=lambda h: h.rank)
    leader = max(heartbeats, key=lambda h: (h.step, h.time_stamp or 0.0))
    for beat in heartbeats:
        beat.behind_steps = leader.step - beat.step
        if beat.behind_steps and beat.time_stamp is not None and leader.time_stamp is not None:
            beat.behind_seconds = leader.time_stamp - beat.time_stamp
    return HangReport(
        heartbeats=heartbeats,
        leading_step=leader.step,
        groups=_group(latest),
        ranks_without_dump=sorted(set(beats) - set(latest)),
        first_nonfinite=first_nonfinite(from_diagnosis(read), logged=_logged_nonfinite(logged)),
        dump_files=[str(p) for p in files],
        notes=read.notes,
    )


def _logged_series(inputs: Sequence[str | Path]) -> list[Any]:
    """The JSON step logs found under the inputs, a folder's latest run only."""
    from otel_mindformers.outputs.jsonl_reader import AnalysisError, read_logs

    series = []
    for item in inputs:
        try:
            series += read_logs([item], one_run_per_folder=True)  # not an earlier run's log set aside there
        except AnalysisError:  # a folder with dumps only, or a dump file named directly
            continue
    return series


def _ring_heartbeats(inputs: Sequence[str | Path]) -> Iterable[tuple[int, int]]:
    """(rank, last finished step) from each flight ring beside the JSON logs under the inputs
    (docs/flight_recorder.md): the exact step a rank got to, alive or killed, where its log
    holds only the sampled steps (a 1-step split at interval 10 looks like none)."""
    from otel_mindformers.flight_recorder.recovery import finished_steps
    from otel_mindformers.flight_recorder.ring import SUFFIX
    from otel_mindformers.outputs.jsonl_reader import walk_files

    folders: set[Path] = set()
    for item in inputs:
        path = Path(item)
        if path.is_dir():
            folders |= {found.parent for found in walk_files(path) if found.name.endswith(SUFFIX)}
        elif path.exists():
            folders.add(path.parent)
    for folder in sorted(folders):
        for (rank, _attempt), finished in finished_steps(folder).items():
            yield rank, finished.step


def _logged_heartbeats(series: list[Any]) -> Iterable[tuple[int, int, float | None]]:
    """(rank, last step, its time) from each series."""
    for one in series:
        if one.rank is not None and one.points:
            last = max(one.points, key=lambda p: p.step)
            yield one.rank, last.step, last.time_stamp


def _logged_nonfinite(series: list[Any]) -> Iterable[tuple[int, int, list[str], bool]]:
    """(rank, step, metrics, whether it is the log's oldest line past step 1) of each series'
    first line with a non-finite loss or grad norm that loss scaling does not explain: the reporting
    ranks' evidence, without `nonfinite_check: all_ranks`."""
    for one in series:
        if one.rank is None or not one.points:
            continue
        points = sorted(one.points, key=lambda p: p.step)
        for point in points:
            bad = point.counted_nonfinite.intersection(NONFINITE_WATCHED)  # not a custom scalar's
            if bad:
                yield (
                    one.rank,
                    point.step,
                    sorted(bad),
                    oldest_line_step(points[0].step, point.step),
                )
                break


def _group(latest: dict[int, dict[str, Any]]) -> list[StackGroup]:
    groups: dict[tuple, StackGroup] = {}
    for rank in sorted(latest):
        record = latest[rank]
        threads = [ThreadStack.from_json(t) for t in record.get("threads", [])]
        threads = [t for t in threads if not t.telemetry]
        key = tuple(sorted((t.training, t.signature()) for t in threads))
        group = groups.get(key)
        if group is None:
            group = groups[key] = StackGroup([], threads, [], [], [])
        group.ranks.append(rank)
        for values, value in (
            (group.phases, record.get("phase")),
            (group.verdicts, record.get("verdict")),
            (group.reasons, record.get("reason")),
        ):
            if value and value not in values:
                values.append(value)
    # The smallest group first: the ranks that differ from the rest are the usual suspects.
    return sorted(groups.values(), key=lambda g: (len(g.ranks), g.ranks))


# --- rendering -----------------------------------------------------------------------------


def ranks_text(ranks: Sequence[int]) -> str:
    """`0-3, 7`: consecutive ranks as ranges."""
    parts: list[str] = []
    start = previous = None
    for rank in sorted(ranks):
        if previous is not None and rank == previous + 1:
            previous = rank
            continue
        if start is not None:
            parts.append(str(start) if start == previous else f"{start}-{previous}")
        start = previous = rank
    if start is not None:
        parts.append(str(start) if start == previous else f"{start}-{previous}")
    return ", ".join(parts)


def _clock(stamp: float | None) -> str:
    return "-" if stamp is None else local_time(stamp)


def render_text(report: HangReport) -> str:
    out = [f"Heartbeats ({len(report.heartbeats)} ranks, leading step {report.leading_step})"]
    for beat in report.heartbeats:
        lag = ""
        if beat.behind_steps:
            seconds = "" if beat.behind_seconds is None else f", {beat.behind_seconds:.1f} s"
            lag = f"  behind by {beat.behind_steps} step(s){seconds}"
        out.append(f"  rank {beat.rank:<5} step {beat.step:<8} at {_clock(beat.time_stamp)} ({beat.source}){lag}")
    behind = report.behind
    out.append("")
    if behind:
        out.append(
            f"Behind: rank(s) {ranks_text([b.rank for b in behind])} stopped first; the job split after step "
            f"{min(b.step for b in behind)}"
        )
    else:
        out.append("Behind: none (every rank at the same step)")
    out.append(f"First non-finite: {report.first_nonfinite.describe() if report.first_nonfinite else 'none recorded'}")
    out += ["", f"Stack groups ({len(report.groups)}, from each rank's latest dump)"]
    if not report.groups:
        out.append("  no stack dumps found")
    for index, group in enumerate(report.groups, 1):
        details = ", ".join(
            part
            for part in (
                f"phase {'/'.join(group.phases)}" if group.phases else "",
                "/".join(group.verdicts),
                f"dumped on {'/'.join(group.reasons)}" if group.reasons else "",
            )
            if part
        )
        out.append(f"== group {index}: rank(s) {ranks_text(group.ranks)} ({details})")
        for name, frame, own in group.innermost():
            mine = f"; own code: {own.location()}" if own is not None else ""
            out.append(f"   innermost [{name}]: {frame.location()}{mine}")
        for thread in group.threads:
            out += ["   " + line for line in thread.text().splitlines()]
        out.append("")
    if report.ranks_without_dump:
        out.append(f"Ranks without a stack dump: {ranks_text(report.ranks_without_dump)}")
    if report.notes:
        out += ["", *report.notes]
    return "\n".join(out).rstrip() + "\n"


def to_json(report: HangReport) -> dict[str, Any]:
    return {
        "leading_step": report.leading_step,
        "heartbeats": [beat.__dict__ for beat in report.heartbeats],
        "behind": [b.rank for b in report.behind],
        "split_after_step": min((b.step for b in report.behind), default=None),
        "first_nonfinite": report.first_nonfinite.to_json() if report.first_nonfinite else None,
        "skipped": report.notes,
        "groups": [
            {
                "ranks": group.ranks,
                "phases": group.phases,
                "verdicts": group.verdicts,
                "reasons": group.reasons,
                "innermost": [
                    {"thread": name, **frame.to_json(), "own_code": own.to_json() if own else None}
                    for name, frame, own in group.innermost()
                ],
                "threads": [thread.to_json() for thread in group.threads],
            }
            for group in report.groups
        ],
        "ranks_without_dump": report.ranks_without_dump,
        "dump_files": report.dump_files,
    }


# --- command -------------------------------------------------------------------------------


def add_command(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "hang-report",
        help="merge one job's per-rank stack dumps and heartbeats: who is behind, where ranks are stuck",
    )
    parser.add_argument(
        "paths",
        nargs="+",
        metavar="DIR",
        help=f"folders (searched recursively) or files: {records.FILE_PATTERN} and JSON step logs",
    )
    parser.add_argument("--format", choices=FORMATS, default="text")
    parser.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from otel_mindformers.flight_recorder.offline.recover_logs import recover_dead_runs
    from otel_mindformers.outputs.jsonl_reader import AnalysisError

    try:
        recover_dead_runs(args.paths)
        report = build_hang_report(args.paths)
    except (HangReportError, AnalysisError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if args.format == "json":
        print(json.dumps(to_json(report), indent=2))
    else:
        sys.stdout.write(render_text(report))
    return 0
