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

Where the ring's header names a shared-memory segment on this host (the same boot and IPC
namespace) that is its own (ring.segment_of), the segment holds the exact tail and last
step: the recovering process writes it into the ring's file first, then removes it, so the
file alone holds the ring from then on. A segment that is gone or not the ring's leaves the
file as it is (one warning); one on another host or in a container that ended is not looked
for: the file holds the ring as of its run's last batch.

A ring is whoever planted it's: its records go only into the JSON log its own run wrote, in
the ring's own folder (`own_log`), never into a file its header merely names. A ring that
cannot be read as one (another format version, truncated, a header no run of this package
writes) gives one warning and is kept aside as `*.corrupt`. Damaged slots (their parts
disagree) give one warning and are skipped. Nothing here raises.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import glob
import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from otel_mindformers.core.guarded_log import get_logger
from otel_mindformers.core.step_record import StepRecord
from otel_mindformers.flight_recorder.ring import (
    FILE_BYTES,
    FLAG_STEP_TIME,
    SUFFIX,
    UNSENT_OFFSET,
    WRITTEN_OFFSET,
    Header,
    Held,
    NotItsSegment,
    RingContents,
    RingError,
    Slot,
    fold,
    name_parts,
    parse_ring,
    rings_beside,
    segment_of,
)
from otel_mindformers.names import training as tm
from otel_mindformers.outputs.jsonl import JsonLinesSink, last_job_id, last_step_line
from otel_mindformers.outputs.runs import is_set_aside
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

    def unsent(self, unlogged: list[StepRecord]) -> list[StepRecord]:
        """The tail's records that no process sent over OTLP: those an offline reader wrote
        into the JSON log (from the ring's first unsent step on), else `unlogged`, the
        records past the log's last line (what its run wrote into the log, it had sent)."""
        if not self.header.unsent_from:
            return unlogged
        return [record for record in self.records() if record.step >= self.header.unsent_from]

    def mark_logged(self, records: Sequence[StepRecord]) -> None:
        """`records` go into the JSON log (an offline reader's): the ring notes the first,
        unless an earlier reader noted one, so that the next attempt still sends them over
        OTLP; its written step stays the dead run's, and the tail with it."""
        if records and not self.header.unsent_from:
            os.pwrite(self._fd, records[0].step.to_bytes(8, "little", signed=True), UNSENT_OFFSET)

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

    def set_aside(self, reason: str) -> None:
        """Kept as `*.corrupt`, one warning: a ring whose records cannot be written (one
        this package cannot make sense of) is not tried again by every later process."""
        try:
            _set_aside(self.path, reason)
        finally:
            os.close(self._fd)


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


def write_log(records: Sequence[StepRecord], log: Path) -> None:
    """Recovered records into one JSON log, through the run's own output (outputs/): whole
    lines after what it holds. OSError when it cannot be written, or when a link took the
    log's place since `own_log` looked (it would have written wherever the link points);
    FileLocked when a writer holds it."""
    sink = JsonLinesSink(log, follow_links=False)
    try:
        sink.write(records)
    finally:
        sink.close()


# --- whose log ---------------------------------------------------------------------------------


def own_log(path: Path, header: Header) -> tuple[Path | None, str]:
    """The JSON log the records of the ring at `path` belong to, or None and why no log
    there is: the log its run wrote, a plain name in the ring's own folder that is its
    JSON log's (`{stem}.json`, `{stem}_rank_{r}.json`, as the ring's own name says), when it
    holds that job's lines on that rank, is empty, or does not exist yet (the run would have
    created it); or, when a later run set that log aside (outputs/runs.py), the set-aside
    one that holds the job's lines. Nothing else: not a file its header merely names, not a
    link, not a file of another job, another rank or no JSON lines at all."""
    parts = name_parts(path)
    name = header.json_name
    if parts is None:
        return None, "its own name is not a ring's"
    stem = Path(name).stem
    if not name or Path(name).name != name or stem not in (parts[0], f"{parts[0]}_rank_{header.rank}"):
        return None, f"the log it names ({name!r}) is not its run's"
    log = path.parent / name
    problem = _not_its_run(log, header)
    if problem is None:
        return log, ""
    suffix = Path(name).suffix
    kept = sorted(log.parent.glob(f"{glob.escape(stem)}.*{glob.escape(suffix)}"), reverse=True)  # newest first
    for candidate in kept:
        if is_set_aside(candidate) and candidate.name.endswith(suffix) and _holds_run(candidate, header):
            return candidate, ""
    if problem == "missing":
        return log, ""  # none of its lines was written yet: the log it would have created
    return None, f"{log} {problem}"


def _holds_run(log: Path, header: Header) -> bool:
    return _not_its_run(log, header) is None


def _not_its_run(log: Path, header: Header) -> str | None:
    """Why `log` is not the run's of `header` ("missing" when it does not exist); None when it is."""
    try:
        info = os.lstat(log)
    except FileNotFoundError:
        return "missing"
    except OSError as exc:
        return f"cannot be read ({exc.strerror})"
    if not stat.S_ISREG(info.st_mode):
        return "is not a plain file"
    if info.st_size == 0:
        return None
    line = last_step_line(log)
    if line is None:
        return "holds no step lines"
    if line.get("rank", header.rank) != header.rank:
        return f"holds rank {line.get('rank')!r}'s lines"
    logged_job = last_job_id(log)
    if logged_job is not None and logged_job != header.job_id:
        return f"now holds job {logged_job!r}'s lines"
    return None


# --- taking a dead ring ------------------------------------------------------------------------


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


def take_tail(path: Path, rank: int | None = None) -> Tail | None:
    """The tail of the ring at `path`, locked, when its writer is gone (and it is `rank`'s,
    when given); None when it lives (or another process recovers it now), is another rank's
    (left as it is), or cannot be read (one warning). A ring with a segment here that is its
    own is read from it, and its file takes the segment's bytes (the segment is removed)."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW)
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
        if rank is not None and contents.header.rank != rank:  # named for this rank, written by another
            os.close(fd)
            return None
        held = _segment_held(path, fd, contents.header)
        if held is not None:
            fold(fd, held)
            contents = held.contents
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


def _segment_held(path: Path, fd: int, header: Header) -> Held | None:
    """The segment of the dead ring at `path` (its file open and locked at `fd`), when it
    names one here that is its own: the exact tail and last step (the file holds them as of
    the worker's last batch). None otherwise, with one warning when the segment named here
    is gone or not its own."""
    try:
        return segment_of(header, os.fstat(fd))
    except NotItsSegment as exc:
        _logger.warning_once(
            f"{path} segment",
            "otel_mindformers: the flight ring %s names shared memory that cannot be taken as its own (%s); "
            "recovered from its file alone, as of its outputs' last batch",
            path,
            exc,
        )
        return None


def dead_rings(json_log_path: str, rank: int, own: Path | None = None) -> list[Tail]:
    """The dead rings of `rank` beside `json_log_path` (every job's), each locked, oldest
    run first. Another rank's ring is not touched: its tail is its rank's."""
    tails = []
    for path in rings_beside(json_log_path, rank):
        if path == own:
            continue
        tail = take_tail(path, rank)
        if tail is not None:
            tails.append(tail)
    tails.sort(key=lambda tail: (tail.header.created, tail.header.attempt))
    return tails


@dataclass(frozen=True)
class Finished:
    """How far a run got: its last finished job step (the step hook's write), the end of its
    last sampled step (Unix seconds; None without one), and whether its process lives (it
    holds the ring's lock)."""

    step: int
    last_sample: float | None
    alive: bool


def finished_steps(folder: Path, pattern: str = f"*{SUFFIX}") -> dict[tuple[int, str], Finished]:
    """(rank, attempt id) -> how far the run of each readable ring in `folder` got (a read,
    no lock: the step is one 8-byte store), from its segment where it has one here, else
    from its file: the header's step, or its last slot's (a sampled step's slot holds its
    step; without a segment, the header's is as of the worker's last copy)."""
    found: dict[tuple[int, str], Finished] = {}
    for path in sorted(folder.glob(pattern)):
        try:
            with open(path, "rb") as stream:
                contents = _as_held(stream)
                alive = _locked(stream.fileno())
        except (OSError, RingError):
            continue
        header = contents.header
        last = contents.slots[-1] if contents.slots else None
        found[(header.rank, header.attempt_id)] = Finished(
            max(header.finished_step, last.step if last is not None else 0),
            header.wall(last.end) if last is not None else None,
            alive,
        )
    return found


def _as_held(stream: BinaryIO) -> RingContents:
    """A ring as its segment holds it (a live run's too: read, never removed), or as its
    file does; the file read again where its segment is gone (a recovery folded it in just now)."""
    contents = parse_ring(stream.read(FILE_BYTES + 1))
    try:
        held = segment_of(contents.header, os.fstat(stream.fileno()))
    except NotItsSegment:
        stream.seek(0)
        return parse_ring(stream.read(FILE_BYTES + 1))
    return contents if held is None else held.contents


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
    found = finished_steps(path.parent, f"{glob.escape(path.stem)}.rank_{rank}.*{SUFFIX}")
    return {attempt_id: finished for (_, attempt_id), finished in found.items()}


__all__ = [
    "Finished", "Tail", "dead_rings", "finished_steps", "finished_steps_of", "own_log", "take_tail", "write_log",
]  # fmt: skip
