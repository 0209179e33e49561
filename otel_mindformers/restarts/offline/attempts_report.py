"""`report` over a job's directory: its attempts from the ledgers beside the JSON logs.

Every rank keeps `{stem}.job.rank_{r}.ledger` beside its JSON log (restarts/ledger_file.py). Here
the ranks' ledgers become one table: per attempt, when it began and ended, how it ended,
its steps, the steps it lost, the downtime before it, and how many ranks ran it; then the
job's totals (goodput, badput by category with the ml-goodput-measurement type each maps
to). The totals come from the ledger of the rank that waited longest for its data (the
lowest rank when none waited longer); an attempt ends the way its worst rank ended
(crashed > killed > stopped > completed).
"""

from __future__ import annotations

import glob
import json
import re
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from otel_mindformers.cluster.offline.attempt_fault import ended_by
from otel_mindformers.core.one_line import one_line
from otel_mindformers.flight_recorder.recovery import Finished, finished_steps
from otel_mindformers.names import job as names
from otel_mindformers.outputs.jsonl import last_job_id
from otel_mindformers.outputs.jsonl_reader import local_time
from otel_mindformers.outputs.runs import is_set_aside
from otel_mindformers.restarts.goodput import as_finished, is_alive, job_timeline
from otel_mindformers.restarts.ledger_file import LEDGER_SUFFIX, read_ledger

# A rank's ledger, or an earlier job's kept beside it (`.ledger.job2`: restarts/attempt_tracker.py).
_RANK = re.compile(r"\.job\.rank_(\d+)" + re.escape(LEDGER_SUFFIX) + r"(\.job\d+)?$")
_SEVERITY = {
    names.OUTCOME_COMPLETED: 0,
    names.OUTCOME_RUNNING: 1,
    names.OUTCOME_STOPPED: 2,
    names.OUTCOME_KILLED: 3,
    names.OUTCOME_CRASHED: 4,
}


def find_ledgers(inputs: Iterable[str | Path]) -> list[Path]:
    """The ledgers of the logs named by `inputs` (files, globs or folders), by rank."""
    return list(_ledger_ranks(inputs))


def _ledger_ranks(inputs: Iterable[str | Path]) -> dict[Path, int]:
    """`find_ledgers`, each with the rank its name gives."""
    found: dict[Path, int] = {}
    for item in inputs:
        path = Path(item)
        candidates: Iterable[Path]
        if path.is_dir():
            candidates = path.glob(f"*.job.rank_*{LEDGER_SUFFIX}")
        elif path.exists():
            candidates = _ledgers_of_log(path)
        else:
            candidates = (Path(p) for p in glob.glob(str(item)) if Path(p).is_dir())
            candidates = (c for d in candidates for c in d.glob(f"*.job.rank_*{LEDGER_SUFFIX}"))
        for candidate in candidates:
            match = _RANK.search(candidate.name)
            if match:
                found[candidate] = int(match[1])
    return dict(sorted(found.items(), key=lambda item: (str(item[0].parent), item[1])))


def _one_job(read: dict[Path, dict[str, Any]]) -> dict[Path, int]:
    """The ledgers (with their ranks) of one job: named logs of two runs would otherwise
    merge two jobs' attempts. The job still keeping its ledgers at their names wins, else
    the one set aside last (the highest `.jobN`)."""

    def recency(path: Path) -> tuple[int, int]:
        kept = _RANK.search(path.name)[2]  # type: ignore[index]  # every path here matched _RANK
        return (1, 0) if kept is None else (0, int(kept[len(".job") :]))

    if not read:
        return {}
    job = read[max(read, key=recency)]["job_id"]
    return {path: int(_RANK.search(path.name)[1]) for path in read if read[path]["job_id"] == job}  # type: ignore[index]


def _other_jobs(read: dict[Path, dict[str, Any]], kept: dict[Path, int]) -> list[dict[str, str]]:
    """The ledgers at their live names that `_one_job` left out: another job's. The nodes of
    one job that no launcher names each mint their own id from their folder, so folders of two
    nodes given together look like two jobs; say so rather than drop one silently. (A ledger
    set aside as `.jobN` is an earlier job's, left out as a matter of course.)"""
    return [
        {"ledger": str(path), "job_id": data["job_id"]}
        for path, data in read.items()
        if path not in kept and _RANK.search(path.name)[2] is None  # type: ignore[index]
    ]


def _as_logged(entry: dict[str, Any], logged: Any) -> dict[str, Any]:
    """The ledger's entry, with the last step its rank's log saw when that is later (the
    heartbeat that would have said so never came: the attempt was killed), and the data wait
    that line carries. It was alive at that line: an attempt without an end record ends no
    earlier (restarts/goodput.py)."""
    if logged is None:
        return entry
    if logged.data_wait is not None and logged.last_step > int(entry.get("data_wait_step") or 0):
        # The wait as of that line: a heartbeat lagging it (an attempt killed within one
        # `heartbeat_interval` of its first steps) would leave the job's data wait at 0.
        entry = {**entry, "data_wait_seconds": logged.data_wait, "data_wait_step": logged.last_step}
    if logged.last_step <= int(entry.get("last_step") or 0):
        return entry
    corrected = {**entry, "last_step": logged.last_step}
    if logged.last_time is not None:
        corrected["last_step_time"] = logged.last_time
        if entry.get("end") is None:
            corrected["last_heartbeat"] = max(float(entry.get("last_heartbeat") or 0.0), logged.last_time)
    return corrected


def _alive(entry: dict[str, Any], now: float, flown: Finished | None) -> bool:
    """Its flight ring's lock says whether the attempt's process lives (the kernel drops it
    with the process); without a ring, a fresh heartbeat does."""
    if flown is not None and entry.get("end") is None:
        return flown.alive
    return is_alive(entry, now)


def _as_flown(entry: dict[str, Any], flown: Finished | None) -> dict[str, Any]:
    """The ledger's entry, with the last step its flight ring holds (flight_recorder/: the
    step hook's store, which a kill cannot lose) when it is later."""
    return entry if flown is None else as_finished(entry, flown.step, flown.last_sample)


def _ledgers_of_log(log: Path) -> list[Path]:
    """The ledgers of the job that wrote `log`: those beside it, or, for a log a later run
    set aside (outputs/runs.py), the earlier job's kept with it, found by the job id its
    lines carry (none when they carry none: better no job than the next one's)."""
    stem = log.name.split(".")[0].split("_rank_")[0]
    current = list(log.parent.glob(f"{stem}.job.rank_*{LEDGER_SUFFIX}"))
    if not is_set_aside(log):
        return current
    job_id = last_job_id(log)
    kept = log.parent.glob(f"{stem}.job.rank_*{LEDGER_SUFFIX}.job*")
    return [p for p in [*current, *kept] if job_id is not None and _job_of(p) == job_id]


def _job_of(ledger: Path) -> str | None:
    data = read_ledger(ledger, repair=False)
    return None if data is None else data["job_id"]


def _shown(text: object) -> str:
    """A job id as the report prints it: one written by another tool may hold a line break,
    which would forge report lines; such an id is shown escaped."""
    text = str(text)
    return text if text.isprintable() else repr(text)


def _inferred(reason: str | None) -> bool:
    """A reason the ledger wrote for an attempt that left no end record of its own."""
    return not reason or reason.startswith("no end record")


# msrun polls its workers once a second: a rank it tears down after another's crash is heard
# last within that and one heartbeat interval of the crash.
_TEARDOWN_SECONDS = 1.0


def _killed_first(
    ranked: list[tuple[int, dict[str, Any]]], crashed: dict[str, Any], heartbeats: dict[tuple[int, int], float]
) -> tuple[int, dict[str, Any]] | None:
    """The rank killed before the crash could have caused it, when one was: on several nodes
    a node's death makes its peers' collectives fail (MindSpore's "Launch kernel failed:
    AllReduce") tens of seconds later, when the scheduler gives up. Heard last (its last
    heartbeat, or its flight ring's last step) more than a heartbeat interval and msrun's
    teardown before the crash, it was gone first. None when no rank was."""
    before = [
        (rank, row)
        for rank, row in ranked
        if row["outcome"] == names.OUTCOME_KILLED
        and row["end"] + heartbeats.get((rank, row["attempt"]), 0.0) + _TEARDOWN_SECONDS < crashed["end"]
    ]
    return min(before, key=lambda item: item[1]["end"]) if before else None


def _merge(
    rank_rows: dict[int, list[dict[str, Any]]], clocks: int, heartbeats: dict[tuple[int, int], float]
) -> list[dict[str, Any]]:
    """One row per attempt across the ranks. Its time (the downtime before it, its
    categories) is rank `clocks`' where that rank saw it, the rank whose clocks give the
    totals, so the rows add up to them: the nodes of a job do not end together (a node
    whose peer died waits in its collective until the scheduler gives up on the job), so
    the ranks' downtimes differ by that wait."""
    by_attempt: dict[int, list[tuple[int, dict[str, Any]]]] = {}
    for rank, rows in rank_rows.items():
        for row in rows:
            by_attempt.setdefault(row["attempt"], []).append((rank, row))
    merged = []
    for attempt in sorted(by_attempt):
        ranked = sorted(by_attempt[attempt], key=lambda item: item[0])
        first = dict(next((row for rank, row in ranked if rank == clocks), ranked[0][1]))
        first["ranks"] = [rank for rank, _ in ranked]
        # The worst outcome, with the reason of the rank it happened on: the rank that raised,
        # not one that msrun tore down after it (whose reason is only inferred).
        worst_rank, worst = max(
            ranked, key=lambda item: (_SEVERITY.get(item[1]["outcome"], 0), not _inferred(item[1].get("reason")))
        )
        first["outcome"] = worst["outcome"]
        first["reason"] = worst.get("reason")
        if len(ranked) > 1 and worst.get("reason") and not _inferred(worst.get("reason")):
            first["reason"] = f"on rank {worst_rank}: {worst['reason']}"
        gone = _killed_first(ranked, worst, heartbeats) if worst["outcome"] == names.OUTCOME_CRASHED else None
        if gone is not None:
            gap = worst["end"] - gone[1]["end"]
            first["outcome"] = names.OUTCOME_KILLED
            first["reason"] = (
                f"rank {gone[0]} was killed; {gap:.0f} s later rank {worst_rank} crashed: {worst['reason']}"
            )
        # ClusterD's fault is in the ledger of the rank that listened (cluster/), whichever it is.
        first["cluster_fault"] = next((row["cluster_fault"] for _, row in ranked if row.get("cluster_fault")), None)
        # The attempt got as far as its furthest rank: a rank torn down a step behind the one
        # that died (its step's end not yet recorded) does not set the job back.
        for key in ("last_step", "steps", "lost_steps", "at_risk_steps"):
            first[key] = max(row[key] for _, row in ranked)
        first["start"] = min(row["start"] for _, row in ranked)
        first["end"] = max(row["end"] for _, row in ranked)
        merged.append(first)
    return merged


def job_report(
    inputs: Sequence[str | Path], now: float | None = None, logged: Sequence[Any] = ()
) -> dict[str, Any] | None:
    """The job's attempts and totals from the ledgers beside `inputs`; None without any.
    `logged`: the report's series summaries (analysis/report.py), whose lines may know an
    attempt's last step better than the ledger: a killed attempt's last heartbeat lags its
    last line by up to `heartbeat_interval`."""
    read = {path: data for path in _ledger_ranks(inputs) if (data := read_ledger(path, repair=False)) is not None}
    ledgers = _one_job(read)
    left_out = _other_jobs(read, ledgers)
    rank_rows: dict[int, list[dict[str, Any]]] = {}
    timelines: dict[int, dict[str, Any]] = {}
    last_logged = {
        (series.rank, attempt.job_id, attempt.attempt): attempt for series in logged for attempt in series.attempts
    }
    flown: dict[tuple[int, str], Finished] = {}
    for folder in {path.parent for path in ledgers}:
        flown.update(finished_steps(folder))
    for path, rank in ledgers.items():
        data = read[path]
        now = now if now is not None else time.time()
        entries = [
            _as_logged(
                _as_flown(entry, flown.get((rank, str(entry.get("attempt_id"))))),
                last_logged.get((rank, data["job_id"], entry.get("attempt"))),
            )
            for entry in data["attempts"]
        ]
        live = [a for a in entries if _alive(a, now, flown.get((rank, str(a.get("attempt_id")))))]
        current = live[-1]["attempt_id"] if live else None
        timeline = job_timeline(entries, now, current)
        timelines[rank] = timeline
        rank_rows[rank] = timeline["attempts"]
    if not timelines:
        return None
    # A synchronous job moves at the pace of its most held-back rank: the others waited for
    # its data inside the all-reduce, as step time. Its clocks give the totals (ties: the
    # lowest rank), among the ranks that saw every attempt: one that joined when the job
    # grew (or left when it shrank) misses the other attempts and their downtime.
    most = max(len(rows) for rows in rank_rows.values())
    witnesses = sorted(rank for rank in timelines if len(rank_rows[rank]) == most)
    held_back = max(witnesses, key=lambda rank: timelines[rank]["totals"]["seconds"]["data_wait"])
    heartbeats = {
        (rank, int(entry["attempt"])): float(entry.get("heartbeat_interval") or 0.0)
        for path, rank in ledgers.items()
        for entry in read[path]["attempts"]
        if entry.get("attempt") is not None
    }
    attempts = _merge(rank_rows, held_back, heartbeats)
    totals = dict(timelines[held_back]["totals"])
    totals["rank"] = held_back
    totals["lost_steps"] = sum(row["lost_steps"] for row in attempts)
    totals["furthest_step"] = max((row["last_step"] for row in attempts), default=0)
    return {
        "job_id": read[next(iter(ledgers))]["job_id"],
        "ranks": sorted(timelines),
        "ledgers": [str(p) for p in ledgers],
        "left_out": left_out,
        "attempts": attempts,
        "totals": totals,
    }


def _clock(seconds: float) -> str:
    return local_time(seconds, "%H:%M:%S")


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 120:
        return f"{seconds:.1f} s"
    return f"{seconds / 60:.1f} min"


def _rows(job: dict[str, Any]) -> list[tuple[str, ...]]:
    rows: list[tuple[str, ...]] = [
        ("attempt", "ranks", "start", "end", "ended", "steps", "lost steps", "downtime before")
    ]
    for row in job["attempts"]:
        # One line: a reason written before the run kept it to one (core/one_line.py), or by
        # another tool, would break the table.
        reason = one_line(str(row.get("reason") or ""))
        outcome = row["outcome"] + (f" ({reason})" if not _inferred(reason) else "")
        rows.append((
            str(row["attempt"]), str(len(row["ranks"])), _clock(row["start"]), _clock(row["end"]), outcome,
            f"{row['resume_step'] + 1}..{row['last_step']}" if row["steps"] else "-",
            _lost(row), _duration((row["downtime"] or {}).get("total")),
        ))  # fmt: skip
    return rows


def _lost(row: dict[str, Any]) -> str:
    """The steps computed again; for a last attempt that did not complete, the steps past its
    last checkpoint, which the next attempt will compute again if it resumes from there."""
    at_risk = row.get("at_risk_steps") or 0
    if at_risk and row["outcome"] != "completed":
        return f"{row['lost_steps']} ({at_risk} at risk)"
    return str(row["lost_steps"])


def _aligned(rows: list[tuple[str, ...]], indent: str = "  ") -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return [indent + "  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows]


def _totals_lines(job: dict[str, Any]) -> list[str]:
    totals = job["totals"]
    wall = totals["wall_seconds"]
    goodput = totals["goodput"]
    lines = [
        f"  job goodput {'-' if goodput is None else f'{goodput:.1%}'} of {_duration(wall)} since the first attempt began; "
        f"{totals['lost_steps']} steps lost, {_duration(totals['downtime_seconds'])} of downtime",
    ]
    lines += [f"    {key:<16} {seconds:>10}  {share:>6}  {kind}" for key, seconds, share, kind in _categories(totals)]
    if totals.get("clock_set_back_seconds"):
        lines.append(
            f"  clock set back: an attempt began {_duration(totals['clock_set_back_seconds'])} before the one "
            "before it ended; durations are taken within each attempt and downtime counts from 0"
        )
    if totals["no_progress_attempts"] > 1:
        lines.append(
            f"  no progress: the last {totals['no_progress_attempts']} attempts ended without passing step "
            f"{totals['furthest_step']}"
        )
    return lines


def _categories(totals: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """(category, time, share of the wall time, BadputType) for productive and each badput."""
    wall = totals["wall_seconds"]
    return [
        (key, _duration(seconds), f"{seconds / wall if wall > 0 else 0.0:.1%}", totals["badput_types"].get(key, ""))
        for key, seconds in totals["seconds"].items()
    ]


def render_job(job: dict[str, Any], fmt: str = "text") -> str:
    """The attempts section of `report` (text or markdown)."""
    count = len(job["attempts"])
    header = f"job {_shown(job['job_id'])}: {count} attempt{'' if count == 1 else 's'}, {len(job['ranks'])} rank(s)"
    if fmt == "markdown":
        rows = _rows(job)
        lines = [f"## {header}", "", "| " + " | ".join(rows[0]) + " |", "|" + "---|" * len(rows[0])]
        lines += ["| " + " | ".join(row) + " |" for row in rows[1:]]
        summary, *rest = _totals_lines(job)
        lines += ["", summary.strip(), "", "| category | time | share | BadputType |", "|---|---|---|---|"]
        lines += [f"| {' | '.join(cells)} |" for cells in _categories(job["totals"])]
        lines += [f"- {line.strip()}" for line in rest[len(job["totals"]["seconds"]) :]]
        lines += [f"- {line}" for line in _ended_by(job)]
        lines += [f"- {line.strip()}" for line in left_out_lines(job)]
        return "\n".join(lines) + "\n"
    ended = [f"  {line}" for line in _ended_by(job)]
    return "\n".join([header, *_aligned(_rows(job)), *ended, *_totals_lines(job), *left_out_lines(job)]) + "\n"


def left_out_lines(job: dict[str, Any]) -> list[str]:
    """What `job_report` left out (`_other_jobs`), with how to join the nodes of one job."""
    if not job.get("left_out"):
        return []
    lines = [f"  left out, another job's: {_shown(o['ledger'])} (job {_shown(o['job_id'])})" for o in job["left_out"]]
    hint = (
        "  one job on several nodes? Without a launcher's job id each node names its own from its output folder: "
        "give every node the same OTEL_MINDFORMERS_JOB_ID (or monitor_config.job_id)"
    )
    return [*lines, hint]


def _ended_by(job: dict[str, Any]) -> list[str]:
    """The attempts a ClusterD fault ended, in words (cluster/offline/attempt_fault.py)."""
    return [line for row in job["attempts"] if (line := ended_by(row)) is not None]


def with_job(rendered: str, job: dict[str, Any] | None, fmt: str) -> str:
    """`report`'s output with the job's attempts (`job_report`'s) after it (under "job" in JSON)."""
    if job is None:
        return rendered
    if fmt == "json":
        document = json.loads(rendered)
        document["job"] = job
        return json.dumps(document, indent=2) + "\n"
    return rendered.rstrip("\n") + "\n\n" + render_job(job, fmt)


__all__ = ["find_ledgers", "job_report", "left_out_lines", "render_job", "with_job"]
