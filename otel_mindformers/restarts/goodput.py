"""A job's attempts as a timeline: lost steps, downtime, how each ended, and the job's
goodput with its badput by category. Pure functions over ledger entries (restarts/ledger_file.py),
used live (the `mindformers.job.goodput` gauge, the JSON line) and offline (`report`).

Per attempt, from its own clock readings (Unix seconds):

    process_start ── start-up ── first_step_begin ── compile ── first_step_end
        ── steps (with checkpoint saves) ── last_step_time ── other ── end

- `lost_steps`: the steps attempt k finished past the step attempt k+1 resumed from (its
  steps computed again); for the last attempt, none yet (`at_risk_steps`: its steps past
  its last durable checkpoint). The lost time is the lost steps at the attempt's mean
  step time.
- `downtime` before attempt k+1: attempt k's end (its last heartbeat when it was killed)
  to attempt k+1's first step, split into `no_process` (until k+1's process began),
  `startup`, `checkpoint_load` and `compile`.
- job goodput = productive time / (the last attempt's end, or now) − the first attempt's
  process start; productive = step time, less checkpoint saves, evaluations and user phases
  between the steps (the run's own goodput counts them lost too, timing/time_ledger.py),
  less the wait for data between steps, less the lost steps' time (their own compute: their
  data wait is data wait). A ledger written before the attempts recorded their evaluations
  and user phases leaves them in productive.
  The rest is badput, by the categories of `names.job.BADPUT_CATEGORIES` (mapped to
  ml-goodput-measurement's BadputType); the categories and productive sum to the wall time.
"""

from __future__ import annotations

from typing import Any

from otel_mindformers.names import job as names

ENDED = (names.OUTCOME_COMPLETED, names.OUTCOME_STOPPED, names.OUTCOME_CRASHED, names.OUTCOME_KILLED)


def _f(entry: dict[str, Any], key: str) -> float | None:
    value = entry.get(key)
    return float(value) if isinstance(value, (int, float)) else None


def attempt_end(entry: dict[str, Any], now: float | None = None) -> float:
    """When the attempt ended: its end record, else its last heartbeat (killed), else now
    (the attempt still running, when `now` is given)."""
    end = _f(entry, "end")
    if end is not None:
        return end
    if entry.get("outcome") in (None, names.OUTCOME_RUNNING) and now is not None:
        return now
    return _f(entry, "last_heartbeat") or _f(entry, "process_start") or 0.0


def is_alive(entry: dict[str, Any], now: float) -> bool:
    """An attempt without an end whose heartbeat is fresh (within three intervals): running."""
    if entry.get("outcome") is not None or entry.get("end") is not None:
        return False
    interval = float(entry.get("heartbeat_interval") or 5.0)
    return now - float(entry.get("last_heartbeat") or 0.0) <= 3 * interval + 1.0


def as_finished(entry: dict[str, Any], step: int, last_sample: float | None) -> dict[str, Any]:
    """An attempt without an end record, with its last step from its flight ring when that is
    past its last heartbeat's (flight_recorder/: exact, a kill cannot lose it). It was alive at
    its last sampled step (`last_sample`, Unix seconds), so it ended no earlier."""
    if entry.get("end") is not None or step <= int(entry.get("last_step") or 0):
        return entry
    corrected = {**entry, "last_step": step}
    if last_sample is not None and last_sample > float(entry.get("last_step_time") or 0.0):
        corrected["last_step_time"] = last_sample
        corrected["last_heartbeat"] = max(float(entry.get("last_heartbeat") or 0.0), last_sample)
    return corrected


def outcome_of(entry: dict[str, Any], live: bool = False) -> str:
    """completed / stopped / crashed, killed when it has no end record, running when `live`."""
    outcome = entry.get("outcome")
    if outcome in ENDED:
        return outcome
    return names.OUTCOME_RUNNING if live else names.OUTCOME_KILLED


def _steps_part(entry: dict[str, Any]) -> tuple[int, float, dict[str, float]]:
    """(steps, seconds of steps after the first, and the badput among them by category:
    checkpoint saves, evaluations, user phases, data wait)."""
    resume = int(entry.get("resume_step") or 0)
    last = int(entry.get("last_step") or resume)
    first_end, last_time = _f(entry, "first_step_end"), _f(entry, "last_step_time")
    span = max(0.0, last_time - first_end) if first_end is not None and last_time is not None else 0.0
    save = min(span, float(entry.get("checkpoint_save_seconds") or 0.0))
    # Absent from a ledger written before they were recorded: 0, left in productive.
    evaluation = min(span - save, float(entry.get("evaluation_seconds") or 0.0))
    user = min(span - save - evaluation, float(entry.get("user_phase_seconds") or 0.0))
    data = float(entry.get("data_wait_seconds") or 0.0)
    # The wait is known up to the worker's last record, the steps up to the clock's: a killed
    # attempt's queued records never came, so its wait is carried at its rate to the last step.
    known = int(entry.get("data_wait_step") or last) - resume
    if 0 < known < last - resume:
        data *= (last - resume) / known
    data = min(span - save - evaluation - user, data)
    badput = {"checkpoint_save": save, "evaluation": evaluation, "user_phases": user, "data_wait": data}
    return max(0, last - resume), span, badput


def no_progress_streak(entries: list[dict[str, Any]]) -> int:
    """How many of the last attempts ended, not completed, without passing the furthest step
    of the first of them: three attempts that each crash at step 1,200 make 3."""
    streak, furthest = 0, None
    for entry in entries:
        outcome = entry.get("outcome")
        last = int(entry.get("last_step") or 0)
        if outcome not in ENDED:  # still running: the streak is the earlier attempts'
            continue
        if outcome == names.OUTCOME_COMPLETED:
            streak, furthest = 0, None
            continue
        if furthest is not None and last <= furthest:
            streak += 1
        else:
            streak, furthest = 1, last
    return streak


# A process start is read to ~10 ms (restarts/run_attempt.py `_process_start`): less than this
# before the previous attempt's end is rounding, not a clock set back.
_CLOCK_SLACK_SECONDS = 1.0


def job_timeline(entries: list[dict[str, Any]], now: float | None = None, live_attempt_id: str | None = None) -> dict:
    """The attempts of one rank's ledger, in order, with the job's totals (JSON-ready)."""
    entries = sorted(entries, key=lambda e: int(e.get("attempt") or 0))
    rows: list[dict[str, Any]] = []
    totals = dict.fromkeys([names.PRODUCTIVE, *names.BADPUT_CATEGORIES], 0.0)
    measured = False  # some attempt timed its steps: before that, goodput is not known, not 0
    clock_set_back = 0.0
    for index, entry in enumerate(entries):
        following = entries[index + 1] if index + 1 < len(entries) else None
        live = entry.get("attempt_id") == live_attempt_id
        start = _f(entry, "process_start") or 0.0
        end = attempt_end(entry, now if live else None)
        first_begin, first_end = _f(entry, "first_step_begin"), _f(entry, "first_step_end")
        load = float(entry.get("checkpoint_load_seconds") or 0.0)
        steps, span, between = _steps_part(entry)
        compute = span - sum(between.values())  # the steps' own time
        last = int(entry.get("last_step") or entry.get("resume_step") or 0)
        lost = 0
        if following is not None:
            lost = max(0, min(steps, last - int(following.get("resume_step") or 0)))
        mean = compute / (steps - 1) if steps > 1 else 0.0
        lost_seconds = min(compute, lost * mean)
        if first_begin is not None:
            startup = max(0.0, first_begin - start - load)
            compile_ = max(0.0, (first_end or first_begin) - first_begin)
        else:  # no step finished: all of it start-up
            startup, compile_ = max(0.0, end - start - load), 0.0
        last_time = _f(entry, "last_step_time") or first_end
        other = max(0.0, end - last_time) if last_time is not None else 0.0
        productive = max(0.0, compute - lost_seconds)
        measured = measured or span > 0
        seconds = {
            names.PRODUCTIVE: productive,
            "startup": startup,
            "checkpoint_load": min(load, max(0.0, end - start)),
            "compile": compile_,
            **between,
            "lost_progress": lost_seconds,
            "other": other,
        }
        row: dict[str, Any] = {
            "attempt": int(entry.get("attempt") or 0),
            "attempt_id": entry.get("attempt_id"),
            "start": start,
            "end": end,
            "outcome": outcome_of(entry, live=live),
            "reason": entry.get("reason"),
            "resume_step": int(entry.get("resume_step") or 0),
            "last_step": last,
            "steps": steps,
            "lost_steps": lost,
            "durable_step": entry.get("durable_step"),
            "at_risk_steps": max(0, last - int(entry.get("durable_step") or 0)) if following is None else 0,
            "downtime": None,
            "seconds": seconds,
            "cluster_fault": entry.get("cluster_fault"),  # cluster/: ClusterD's last fault in it
        }
        if rows:
            previous = rows[-1]
            down = max(0.0, start - previous["end"])
            # A process that starts before its predecessor's last heartbeat: a clock set back
            # between attempts (an NTP step, another node). Durations are then taken within
            # each attempt, and the downtime is at least 0.
            clock_set_back = max(clock_set_back, previous["end"] - start - _CLOCK_SLACK_SECONDS)
            row["downtime"] = {
                "total": max(0.0, (first_end if first_end is not None else end) - previous["end"]),
                "no_process": down,
                "startup": startup,
                "checkpoint_load": seconds["checkpoint_load"],
                "compile": compile_,
            }
            totals["no_process"] += down
        for key, value in seconds.items():
            totals[key] += value
        rows.append(row)
    # The last end less the first start, as the attempts and the gaps between them add up
    # (equal to it unless a clock was set back between attempts).
    wall = sum(max(0.0, r["end"] - r["start"]) for r in rows) + totals["no_process"]
    goodput = totals[names.PRODUCTIVE] / wall if wall > 0 and measured else None
    return {
        "attempts": rows,
        "totals": {
            "attempts": len(rows),
            "wall_seconds": wall,
            "goodput": goodput,
            "seconds": totals,
            "badput_types": {key: names.BADPUT_CATEGORIES[key] for key in names.BADPUT_CATEGORIES},
            "lost_steps": sum(r["lost_steps"] for r in rows),
            "downtime_seconds": sum((r["downtime"] or {}).get("total", 0.0) for r in rows),
            "furthest_step": max((r["last_step"] for r in rows), default=0),
            "clock_set_back_seconds": clock_set_back if clock_set_back > 0 else None,
            "no_progress_attempts": no_progress_streak(entries),
        },
    }


__all__ = ["ENDED", "as_finished", "attempt_end", "is_alive", "job_timeline", "no_progress_streak", "outcome_of"]
