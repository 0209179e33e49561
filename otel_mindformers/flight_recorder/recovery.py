"""What a dead run's ring still holds: its last finished step, and the records its outputs
never wrote (the tail: slots past the ring's written step).

A ring is recovered only when its writer is gone: its `flock` is free (the kernel drops it
with the process, however the process died). Holding that lock, the recovering process
writes the tail out, then advances the ring's written step, so each record is recovered
once; a recovery that dies half way leaves the tail where it was. The next attempt of the
same job and rank recovers at its start (flight_recorder/recorder.py, then removes the
ring); `report`, `hang-report` and `replay` recover into the JSON log before they read it
(flight_recorder/offline/recover_logs.py; the ring stays: its last finished step is the
report's for that attempt until a next attempt writes it into the ledger).

A ring that cannot be read as one (another format version, truncated, not ours) gives one
warning and is kept aside as `*.corrupt`. A slot a death cut short is empty (its commit
marker is stored last); damaged slots (their parts disagree) give one warning and are
skipped. Nothing here raises.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
from dataclasses import dataclass
from pathlib import Path

from otel_mindformers.core.guarded_log import get_logger
from otel_mindformers.core.step_record import StepRecord
from otel_mindformers.flight_recorder.ring import (
    FILE_BYTES,
    FLAG_STEP_TIME,
    SUFFIX,
    WRITTEN_OFFSET,
    Header,
    RingError,
    Slot,
    parse_header,
    parse_ring,
    rings_beside,
)
from otel_mindformers.names import training as tm
from otel_mindformers.timing.accounting import training_seconds

_logger = get_logger(__name__)


@dataclass
class Tail:
    """A dead run's ring, locked by this process until `release`, and what it held past its
    written step (oldest first)."""

    path: Path
    header: Header
    slots: list[Slot]
    _fd: int

    def records(self) -> list[StepRecord]:
        """The tail as the StepRecords the dead run's pipeline would have built, marked
        recovered: the values it read, the step time from its window (when the run
        monitored it), its times, its job. What the pipeline worker adds (throughput,
        goodput, the time breakdown, device readings) it never got to."""
        return [to_record(self.header, slot) for slot in self.slots]

    def unlogged(self, last_line: dict | None) -> list[StepRecord]:
        """The tail's records past `last_line`, the last line of the JSON log they go to, when
        that line is this run's (its job and attempt): an output that failed part-way through
        a batch wrote some of its lines without the ring's mark saying so."""
        records = self.records()
        if last_line is None or not _same_run(last_line, self.header):
            return records
        return [record for record in records if record.step > last_line["step"]]

    def mark_written(self) -> None:
        """The tail is out: a later recovery finds nothing past the written step."""
        if self.slots:
            os.pwrite(self._fd, self.slots[-1].step.to_bytes(8, "little", signed=True), WRITTEN_OFFSET)

    def release(self, *, remove: bool = False) -> None:
        try:
            if remove:
                with contextlib.suppress(OSError):
                    os.unlink(self.path)
        finally:
            os.close(self._fd)  # drops the lock


def _same_run(line: dict, header: Header) -> bool:
    job = line.get("job")
    if not isinstance(job, dict):
        return not (header.job_id and header.attempt)  # a run without a ledger names no job
    return bool(job.get("id") == header.job_id and job.get("attempt") == header.attempt)


def to_record(header: Header, slot: Slot) -> StepRecord:
    values = dict(slot.values)
    if header.flags & FLAG_STEP_TIME and slot.steps > 0:
        values[tm.STEP_TIME] = training_seconds(slot.elapsed, slot.phases) / slot.steps * 1000.0
    return StepRecord(
        step=slot.step,
        epoch=slot.epoch,
        rank=header.rank,
        time_stamp=header.wall(slot.end),
        steps_in_window=slot.steps,
        values=values,
        is_last=slot.is_last,
        started_at=header.wall(slot.previous_end),
        job={"id": header.job_id, "attempt": header.attempt} if header.job_id and header.attempt else None,
        recovered=True,
    )


def _read(fd: int) -> bytes:
    size = os.fstat(fd).st_size
    if size != FILE_BYTES:
        raise RingError(f"{size} bytes, not the {FILE_BYTES} of a ring")
    return os.pread(fd, FILE_BYTES, 0)


def _set_aside(path: Path, reason: str) -> None:
    aside = path.with_name(path.name + ".corrupt")
    try:
        os.replace(path, aside)
    except OSError:
        _logger.warning_once(
            str(path), "otel_mindformers: the flight ring %s cannot be read (%s); left out", path, reason
        )
        return
    _logger.warning_once(
        str(path),
        "otel_mindformers: the flight ring %s cannot be read (%s); kept as %s, nothing recovered",
        path,
        reason,
        aside.name,
    )


def take_tail(path: Path) -> Tail | None:
    """The tail of the ring at `path`, locked, when its writer is gone; None when it lives (or
    another process recovers it now), or the ring cannot be read (one warning)."""
    try:
        fd = os.open(path, os.O_RDWR)
    except FileNotFoundError:
        return None  # recovered and removed meanwhile
    except OSError as exc:
        _logger.warning_once(str(path), "otel_mindformers: cannot recover the flight ring %s (%s)", path, exc.strerror)
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                os.close(fd)  # its run lives, or another process recovers it now
                return None
            raise
        contents = parse_ring(_read(fd))
    except RingError as exc:
        os.close(fd)
        _set_aside(path, str(exc))
        return None
    except OSError as exc:
        os.close(fd)
        _logger.warning_once(
            str(path), "otel_mindformers: cannot recover the flight ring %s (%s)", path, exc.strerror or exc
        )
        return None
    if contents.damaged:
        _logger.warning_once(
            str(path),
            "otel_mindformers: the flight ring %s holds %d damaged slot(s); skipped, the rest recovered",
            path,
            contents.damaged,
        )
    written = contents.header.written_step
    return Tail(path, contents.header, [s for s in contents.slots if s.step > written], fd)


def tails_of_run(json_log_path: str, rank: int, job_id: str, own: Path | None = None) -> list[Tail]:
    """The dead rings of `job_id` on `rank` beside `json_log_path`, each locked, oldest run
    first. Another job's ring, or another rank's, is not touched: its tail is its job's."""
    tails = []
    for path in rings_beside(json_log_path, rank):
        if path == own or not _header_matches(path, rank, job_id):
            continue
        tail = take_tail(path)
        if tail is None:
            continue
        if tail.header.job_id != job_id or tail.header.rank != rank:  # changed since: not ours
            tail.release()
            continue
        tails.append(tail)
    tails.sort(key=lambda tail: (tail.header.created, tail.header.attempt))
    return tails


def _header_matches(path: Path, rank: int, job_id: str) -> bool:
    """Whether the ring at `path` is `job_id`'s on `rank` (a read, no lock); an unreadable
    one is left to `take_tail`, which warns."""
    try:
        header = parse_header(_read_file(path))
    except (OSError, RingError):
        return True
    return header.job_id == job_id and header.rank == rank


def _read_file(path: Path) -> bytes:
    with open(path, "rb") as stream:
        data = stream.read(FILE_BYTES + 1)
    if len(data) != FILE_BYTES:
        raise RingError(f"{len(data)} bytes, not the {FILE_BYTES} of a ring")
    return data


@dataclass(frozen=True)
class Finished:
    """How far a run got: its last finished job step (the step hook's store), the end of its
    last sampled step (Unix seconds; None without one), and whether its process lives (it
    holds the ring's lock)."""

    step: int
    last_sample: float | None
    alive: bool


def finished_steps(folder: Path, pattern: str = f"*{SUFFIX}") -> dict[tuple[int, str], Finished]:
    """(rank, attempt id) -> how far the run of each readable ring in `folder` got (a read,
    no lock: the step is one aligned 8-byte store, never torn)."""
    found: dict[tuple[int, str], Finished] = {}
    for path in sorted(folder.glob(pattern)):
        try:
            with open(path, "rb") as stream:
                contents = parse_ring(stream.read(FILE_BYTES + 1))
                alive = _locked(stream.fileno())
        except (OSError, RingError):
            continue
        header = contents.header
        last = contents.slots[-1] if contents.slots else None
        found[(header.rank, header.attempt_id)] = Finished(
            header.finished_step, header.wall(last.end) if last is not None else None, alive
        )
    return found


def _locked(fd: int) -> bool:
    """Whether another open file holds the ring's lock: its writer lives (or a process recovers it now)."""
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            return True
        raise
    fcntl.flock(fd, fcntl.LOCK_UN)
    return False


def finished_steps_of(json_log_path: str, rank: int) -> dict[str, Finished]:
    """attempt id -> how far each of `rank`'s runs beside `json_log_path` got."""
    path = Path(json_log_path)
    found = finished_steps(path.parent, f"{path.stem}.rank_{rank}.*{SUFFIX}")
    return {attempt_id: finished for (_, attempt_id), finished in found.items()}


__all__ = ["Finished", "Tail", "finished_steps", "finished_steps_of", "tails_of_run", "take_tail"]
