"""One attempt of a job, kept in this rank's ledger (restarts/ledger_file.py) while it runs.

An attempt's entry in the ledger:
`attempt` (1, 2, ...), `attempt_id`, `pid`, `host`, `process_start`, `train_begin`,
`first_step_begin`, `first_step_end` (Unix seconds), `resume_step` (the job step it started
after), `last_step` and `last_step_time` (its last finished step, as of its last heartbeat),
`last_heartbeat`, `durable_step` and `durable_time` (its last checkpoint written, or the
step it resumed from), `checkpoint_save_seconds`, `checkpoint_load_seconds`,
`data_wait_seconds` and `data_wait_step` (the run's wait for data between steps, up to the
step of the worker's last record), `evaluation_seconds` and `user_phase_seconds` (the run's
evaluations and user phases after its first step, up to the step of the worker's last
record; absent from ledgers written before they were recorded), `trace_id` and
`span_id` (its run span, which the next attempt's links to), `parent_span_id` (the launcher's
span it is a child of, when there is one), `heartbeat_interval`, `cluster_fault` (the
last fault MindCluster's ClusterD reported during it, cluster/: time, node, device, level,
codes, and `cleared` once ClusterD said the faults were gone), and, once it ended,
`outcome` (completed, stopped, crashed), `reason` and `end`. An entry that never got its
end is `killed`, ended at its last heartbeat: the next attempt writes that down.
Every reader takes a field with `.get`: a new optional field (say, the fault that ended an
attempt) is one more key set on `entry`, and a ledger written before it stays valid
(`LEDGER_VERSION` unchanged).

Cost on the training thread: nothing per step. A background thread reads the step clock
every `heartbeat_interval` seconds and rewrites this rank's ledger (its heartbeat: a few
hundred bytes); the training thread only sets a field and wakes it on the first step, a
checkpoint save or load, and the end.
"""

from __future__ import annotations

import hashlib
import os
import re
import socket
import threading
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from otel_mindformers.core.clock import StepClock, WallClock
from otel_mindformers.core.guarded_log import get_logger
from otel_mindformers.names import job as names
from otel_mindformers.restarts import goodput
from otel_mindformers.restarts.ledger_file import (
    LEDGER_SUFFIX,
    locked,
    new_ledger,
    read_ledger,
    update_ledger,
    write_ledger,
)
from otel_mindformers.restarts.processes import process_gone

_logger = get_logger(__name__)


def local_job_id(path: Path, generation: int) -> str:
    """A job id where the launcher gives none: the ledger's folder and how many jobs it held
    before (every rank of a job finds the same)."""
    digest = hashlib.sha1(str(path.parent.resolve()).encode()).hexdigest()[:10]
    return f"local-{digest}-{generation}"


def _set_aside(path: Path) -> int:
    """Keep an earlier job's ledger as `name.jobN`; returns N (the jobs set aside so far)."""
    number = 1
    while path.with_name(f"{path.name}.job{number}").exists():
        number += 1
    try:
        os.replace(path, path.with_name(f"{path.name}.job{number}"))
    except FileNotFoundError:
        number -= 1
    return number


def _ended_attempts_of_other_ranks(path: Path, job_id: str, before: float) -> int:
    """The highest attempt number of `job_id` in the other ranks' ledgers beside `path`
    that ended (or was last heard of) before `before`, this process's start; 0 when none.
    An attempt of those ranks that is still alive, or ended since, is this one."""
    rank_part = re.compile(r"\.job\.rank_\d+" + re.escape(LEDGER_SUFFIX) + "$")
    pattern = rank_part.sub(f".job.rank_*{LEDGER_SUFFIX}", path.name)
    highest = 0
    for other in path.parent.glob(pattern):
        if other == path or not rank_part.search(other.name):
            continue
        data = read_ledger(other, repair=False)
        if data is None or data["job_id"] != job_id:
            continue
        for attempt in data["attempts"]:
            ended = attempt.get("end") or attempt.get("last_heartbeat") or float("inf")
            if float(ended) < before:
                highest = max(highest, int(attempt["attempt"]))
    return highest


class LedgerInUse(RuntimeError):
    """Another job's attempt is alive and writing the ledger at `path`: `job_id`, and `live`,
    its attempt's entry (pid, host)."""

    def __init__(self, path: Path, job_id: str, live: dict[str, Any]) -> None:
        self.path, self.job_id, self.live = path, job_id, live
        super().__init__(f"job {job_id!r} (pid {live.get('pid')} on {live.get('host')}) is running and writing {path}")


def _live_attempt_of_another_process(attempts: list[dict[str, Any]], now: float) -> dict[str, Any] | None:
    """The ledger's last attempt, when it has no end, its heartbeat is fresh, it is not this
    process and its process is not known to be gone: a run that still writes there."""
    last = attempts[-1] if attempts else None
    if last is None or not goodput.is_alive(last, now) or process_gone(last):
        return None
    if last.get("pid") == os.getpid() and last.get("host") == socket.gethostname():
        return None
    return last


class AttemptTracker:
    """Start with `AttemptTracker.begin(...)`; `end(...)` once. `previous` is the earlier
    attempt's entry (None for the job's first attempt)."""

    def __init__(
        self,
        path: Path,
        job_id: str,
        entry: dict[str, Any],
        history: list[dict[str, Any]],
        clock: StepClock,
        wall_clock: WallClock,
        heartbeat_interval: float,
    ) -> None:
        self.path = path
        self.job_id = job_id
        self.entry = entry
        self.history = history  # the earlier attempts, oldest first
        self.previous = history[-1] if history else None
        self._clock = clock
        self._wall = wall_clock.wall
        self._interval = heartbeat_interval
        self._lock = threading.Lock()  # the entry: training thread and writer
        self._wake = threading.Event()
        self._stop = False
        self._first_step_pending = True
        self._phases_before: tuple[float, float] | None = None  # as of the first step: start-up's
        self.failures = 0
        self.timeline: dict[str, Any] = goodput.job_timeline(history + [entry], time.time(), entry["attempt_id"])
        self._thread = threading.Thread(target=self._run, name="otel-mindformers-ledger", daemon=True)

    @property
    def attempt(self) -> int:
        return int(self.entry["attempt"])

    @property
    def attempt_id(self) -> str:
        return str(self.entry["attempt_id"])

    @property
    def job_goodput(self) -> float | None:
        return self.timeline["totals"]["goodput"]

    @property
    def no_progress_attempts(self) -> int:
        return int(self.timeline["totals"]["no_progress_attempts"])

    @classmethod
    def begin(
        cls,
        *,
        path: Path,
        job_id: str | None,
        continues: bool,
        rank: int,
        resume_step: int,
        process_start: float,
        checkpoint_load_seconds: float,
        clock: StepClock,
        wall_clock: WallClock,
        heartbeat_interval: float,
        finished: Mapping[str, tuple[int, float | None]] | None = None,
        running: frozenset[str] = frozenset(),
    ) -> AttemptTracker:
        """Open this attempt in the ledger. `job_id`: the configured or launcher's id (None:
        the ledger's, or a local one); `continues`: the run resumed, or the launcher says it
        restarted the job, so without an id it is the ledger's job going on; `finished`:
        attempt id -> (last finished step, end of its last sampled step or None), from the
        flight rings of attempts that died (flight_recorder/): exact where the heartbeat lags;
        `running`: the attempt ids whose flight ring's lock a process holds (it lives)."""
        now = time.time()
        entry: dict[str, Any] = {
            "attempt_id": uuid.uuid4().hex,
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "rank": rank,
            "process_start": min(process_start, now),
            "train_begin": now,
            "resume_step": resume_step,
            "last_step": resume_step,
            "last_step_time": None,
            "last_heartbeat": now,
            "durable_step": resume_step,
            "durable_time": None,
            "checkpoint_save_seconds": 0.0,
            "checkpoint_load_seconds": checkpoint_load_seconds,
            "data_wait_seconds": 0.0,
            "evaluation_seconds": 0.0,
            "user_phase_seconds": 0.0,
            "heartbeat_interval": heartbeat_interval,
            "outcome": None,
        }
        with locked(path):
            data = read_ledger(path)
            same_job = data is not None and (data["job_id"] == job_id if job_id else continues)
            live = (
                _live_attempt_of_another_process(data["attempts"], now) if data is not None and not same_job else None
            )
            if data is not None and live is not None:
                # Setting it aside would freeze that run's entry mid-run ("killed"), and the
                # two would then overwrite each other's ledger: that run keeps it.
                raise LedgerInUse(path, data["job_id"], live)
            if data is not None and not same_job:
                generation = _set_aside(path) + 1
                data = None
            else:
                generation = 1
            if data is None:
                data = new_ledger(job_id or local_job_id(path, generation))
            history = data["attempts"]
            for earlier in history:
                if earlier.get("outcome") is None:  # no end record: it was killed
                    earlier["outcome"] = names.OUTCOME_KILLED
                    earlier["reason"] = names.INFERRED_KILL
                    how_far = (finished or {}).get(str(earlier.get("attempt_id")))
                    if how_far is not None:
                        earlier.update(goodput.as_finished(earlier, *how_far))
            # A rank new to a job that resumes (the job ran before, on fewer ranks) numbers on
            # after the job's earlier attempts, which only the other ranks' ledgers hold.
            before = max((int(a["attempt"]) for a in history), default=0)
            if not history and resume_step > 0:
                before = _ended_attempts_of_other_ranks(path, data["job_id"], entry["process_start"])
            entry["attempt"] = before + 1
            data["attempts"] = history + [entry]
            write_ledger(path, data)
        earlier_steps = max((int(a.get("last_step") or 0) for a in history), default=0)
        if resume_step == 0 and earlier_steps:  # a fixed job id run again from scratch: most likely a new experiment
            _logger.warning(
                "otel_mindformers: joining job %s as attempt %d from step 0 (all %d earlier steps count as "
                "lost); give this run another job_id if it is a new experiment",
                data["job_id"], entry["attempt"], earlier_steps,
            )  # fmt: skip
        tracker = cls(path, data["job_id"], entry, history, clock, wall_clock, heartbeat_interval)
        set_back = tracker.timeline["totals"]["clock_set_back_seconds"]  # goodput.py's one rule for it
        alive = [earlier for earlier in history if str(earlier.get("attempt_id")) in running]
        if alive:  # it overlaps this one because it runs, not because a clock moved
            _logger.warning(
                "otel_mindformers: attempt %s of job %s on rank %d is running (pid %s, its flight ring is locked): "
                "this process is a second launch of that rank, and both write its files; stop one of them",
                alive[-1].get("attempt"), data["job_id"], rank, alive[-1].get("pid"),
            )  # fmt: skip
        elif set_back:
            _logger.warning(
                "otel_mindformers: this attempt of job %s began %.0f s before the previous one ended: the clock "
                "was set back between them (another node, an NTP step); durations are taken within each attempt",
                data["job_id"], set_back,
            )  # fmt: skip
        tracker._thread.start()
        return tracker

    # --- training thread (events, never per step) -------------------------------------------
    def link_run_span(self, trace_id: int, span_id: int, parent_span_id: int | None = None) -> None:
        """The run span's ids, and its parent's (the launcher's span, from TRACEPARENT): a
        later attempt records this one's span with them if this one is killed."""
        with self._lock:
            self.entry["trace_id"], self.entry["span_id"] = f"{trace_id:032x}", f"{span_id:016x}"
            if parent_span_id is not None:
                self.entry["parent_span_id"] = f"{parent_span_id:016x}"
        self._wake.set()

    def note_checkpoint_load(self, seconds: float) -> None:
        """The checkpoint load that ended before the run (part of its start-up)."""
        if seconds > 0:
            with self._lock:
                self.entry["checkpoint_load_seconds"] = float(self.entry["checkpoint_load_seconds"]) + seconds
            self._wake.set()

    def note_data_wait(self, seconds: float, step: int) -> None:
        """The run's wait for data up to `step` (the pipeline worker, each sampled record; it
        lags the clock's last step by the records still queued): the next heartbeat writes
        it down; badput for the job (restarts/goodput.py)."""
        with self._lock:
            self.entry["data_wait_seconds"], self.entry["data_wait_step"] = seconds, step

    def note_phases(self, evaluation: float, user: float) -> None:
        """The run's evaluation and user-phase seconds so far (the pipeline worker, each
        sampled record, the first one the attempt's first step): those since the first step
        are badput between its steps (restarts/goodput.py); the next heartbeat writes them."""
        if self._phases_before is None:
            self._phases_before = (evaluation, user)
        before_evaluation, before_user = self._phases_before
        with self._lock:
            self.entry["evaluation_seconds"] = max(0.0, evaluation - before_evaluation)
            self.entry["user_phase_seconds"] = max(0.0, user - before_user)

    def note_cluster_fault(self, fault: dict[str, Any] | None) -> None:
        """A fault MindCluster's ClusterD reported (cluster/heard.py, on its listener thread),
        or None when it reports the faults cleared. Written at once, not at the next
        heartbeat: ClusterD may stop the job right after it, and `report` then says which
        fault ended this attempt."""
        with self._lock:
            if fault is not None:
                self.entry["cluster_fault"] = dict(fault)
            elif self.entry.get("cluster_fault"):
                self.entry["cluster_fault"] = {**self.entry["cluster_fault"], "cleared": round(time.time(), 3)}
            else:
                return
        self._write()

    def line_fields(self) -> dict[str, Any]:
        """The JSON line's `job` object (sampled steps)."""
        fields: dict[str, Any] = {"id": self.job_id, "attempt": self.attempt}
        value = self.job_goodput
        if value is not None:
            fields["goodput"] = round(value, 6)
        return fields

    def first_step(self, begin_perf: float, end_perf: float) -> None:
        """The attempt's first step ran from `begin_perf` to `end_perf` (perf seconds)."""
        if not self._first_step_pending:
            return
        self._first_step_pending = False
        with self._lock:
            self.entry["first_step_begin"], self.entry["first_step_end"] = self._wall(begin_perf), self._wall(end_perf)
        self._wake.set()

    def checkpoint_saved(self, step: int, seconds: float) -> None:
        """A checkpoint of `step` is on disk (ModelCheckpoint, CheckpointMonitor, or a
        `checkpoint.save` phase): a durable step."""
        with self._lock:
            entry = self.entry
            entry["durable_step"], entry["durable_time"] = step, time.time()
            entry["checkpoint_save_seconds"] = float(entry["checkpoint_save_seconds"]) + seconds
        self._wake.set()

    def end(self, outcome: str, reason: str | None, step: int, timeout: float = 2.0) -> None:
        """The attempt ended (completed, stopped or crashed): its last write."""
        self._stop = True
        self._wake.set()
        self._thread.join(timeout)
        with self._lock:
            self._take_progress()
            self.entry.update(
                outcome=outcome, reason=reason, end=time.time(), last_step=max(step, self.entry["last_step"])
            )
        self._write()

    # --- writer thread ---------------------------------------------------------------------
    def _run(self) -> None:
        self._write()
        while not self._stop:
            self._wake.wait(self._interval)
            self._wake.clear()
            if self._stop:
                return
            with self._lock:
                self._take_progress()
            self._write()

    def _take_progress(self) -> bool:
        """Copy the clock's step into the entry (holding the lock); True when it moved."""
        clock, entry = self._clock, self.entry
        step, at = clock.step, clock.last_step_end
        entry["last_heartbeat"] = time.time()
        if step == entry["last_step"]:
            return False
        entry["last_step"], entry["last_step_time"] = step, self._wall(at)
        return True

    def _write(self) -> None:
        with self._lock:
            mine = dict(self.entry)

        def change(data: dict[str, Any] | None) -> dict[str, Any]:
            if data is not None and data["job_id"] != self.job_id:  # another job's now
                raise _Replaced(data["job_id"])
            if data is None:  # corrupt or gone: ours again
                data = new_ledger(self.job_id)
                data["attempts"] = list(self.history)
            # The entry as of now, under the file's lock: two threads that write (the heartbeat,
            # a ClusterD fault) leave the later state, never an older copy, on disk.
            with self._lock:
                latest = dict(self.entry)
            data["attempts"] = [a for a in data["attempts"] if a.get("attempt_id") != mine["attempt_id"]] + [latest]
            return data

        try:
            try:
                data = update_ledger(self.path, change)
            except _Replaced as replaced:
                # A later run took our heartbeat for a dead one's (this process was frozen) and
                # set our ledger aside: it is written on there, never taken back.
                moved = _set_aside_holding(self.path, mine["attempt_id"])
                if moved is None:
                    raise OSError(
                        f"job {replaced.args[0]!r} replaced it, and this job's ledger is not beside it"
                    ) from None
                _logger.warning(
                    "otel_mindformers: job %s's ledger %s now belongs to job %s (a run started there while this "
                    "one was not heard from); this run writes its ledger on in %s",
                    self.job_id, self.path, replaced.args[0], moved.name,
                )  # fmt: skip
                self.path = moved
                data = update_ledger(self.path, change)
            self.timeline = goodput.job_timeline(data["attempts"], time.time(), mine["attempt_id"])
        except Exception as exc:  # a full disk, a vanished folder: telemetry, not training
            self.failures += 1
            if self.failures == 1:
                _logger.warning("otel_mindformers: cannot write the job ledger %s: %s", self.path, exc)


class _Replaced(Exception):
    """The ledger at the tracker's path is another job's now (args: its job id)."""


def _set_aside_holding(path: Path, attempt_id: str) -> Path | None:
    """The set-aside ledger (`name.jobN`) that holds the attempt `attempt_id`, if any."""
    for candidate in sorted(path.parent.glob(f"{path.name}.job*")):
        data = read_ledger(candidate, repair=False)
        if data is not None and any(a.get("attempt_id") == attempt_id for a in data["attempts"]):
            return candidate
    return None


__all__ = ["AttemptTracker", "LedgerInUse", "local_job_id"]
