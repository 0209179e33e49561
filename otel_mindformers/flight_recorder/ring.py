"""The flight ring: one rank's sampled steps in a memory-mapped file beside its JSON log.

A process that dies without running another line of Python (SIGKILL, the OOM killer,
`os._exit`, `abort()`, a segfault) leaves its stores to a shared file mapping in the page
cache, which the kernel writes back on its own: the next process that opens the file reads
them. So the training thread stores here what it hands to the pipeline on a sampled step,
and the pipeline worker notes how far the outputs have written; what lies between the two
is what a death would have lost.

    {json_log_path stem}.rank_{rank}.{attempt id}.flight

One file per run (an attempt of its job): a ring is never reopened for writing, so the next
attempt can recover its predecessor's tail while it writes its own, and a recovery that
dies half way leaves the tail where it was. Layout, little-endian:

- the header page (HEADER_BYTES): magic, format version, its own size, slot size and count,
  rank, pid, the run's (perf_counter, Unix time) origin, when it was created, flags; the
  last finished job step (`FINISHED_OFFSET`: one 8-byte store by the step hook, every
  step); the step of the last record the outputs wrote (`WRITTEN_OFFSET`, the pipeline
  worker's); the job id, the attempt id and number, and the JSON log's file name;
- SLOT_COUNT slots of SLOT_BYTES (32 eight-byte words), used round-robin. A slot: its
  sequence number (word 0: 0 = empty, zeroed first and stored last: the commit marker),
  the sequence number again, step, epoch, steps in the window, whether it was the run's last
  step with the count of values, the values' table indexes (names/training.TABLE, one byte
  each), the window's seven clock readings (perf_counter seconds: core/sampled_step.py),
  and the values. A slot whose parts disagree (the two numbers, an index outside the table)
  is damaged: skipped.

The file is held under an exclusive `flock` while its run lives: the kernel drops it when
the process dies, however it dies, so a reader that gets the lock knows the writer is gone.
"""

from __future__ import annotations

import errno
import fcntl
import mmap
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path

from otel_mindformers.core.guarded_log import get_logger
from otel_mindformers.names.training import BY_KEY, ORDER

_logger = get_logger(__name__)

MAGIC = b"OMFRING\x00"
FORMAT_VERSION = 1
SUFFIX = ".flight"
HEADER_BYTES = 4096  # one page
SLOT_BYTES = 256
# More than the pipeline's queue holds (1024) plus a batch: every record the worker has not
# written yet is still in the ring, unless training outran the outputs and records were dropped.
SLOT_COUNT = 1152
FILE_BYTES = HEADER_BYTES + SLOT_BYTES * SLOT_COUNT
HEADER_WORDS = HEADER_BYTES // 8

FLAG_STEP_TIME = 1  # the run's monitored_metrics asked for the step time (recovery computes it)

# magic, version, header bytes, slot bytes, slot count, rank, pid, flags, perf0, wall0, created
_HEADER = struct.Struct("<8sIIIIiiIddd")
FINISHED_OFFSET = 64  # int64: the last finished job step (the step hook's one store)
WRITTEN_OFFSET = 72  # int64: the step of the last record the outputs wrote (the worker's)
_ATTEMPT = struct.Struct("<i")
_ATTEMPT_OFFSET = 80
_TEXT_OFFSET = 128  # job id, attempt id, JSON log name: each a 2-byte length and its bytes
_TEXT_LIMIT = 1024  # bytes each may take

# A slot, in words: seq (the commit marker, stored last), seq again, step, epoch, steps in
# the window, is_last | count << 8, the values' table indexes (two words of bytes; a bool's
# index marked), the window's seven readings, one spare word, then the values.
SLOT_WORDS = SLOT_BYTES // 8
_W_SEQ, _W_INNER, _W_STEP, _W_EPOCH, _W_STEPS, _W_FLAGS, _W_KEYS = range(7)
_W_READINGS = 8  # SampledStep's elapsed .. breakdown_at
_W_VALUES = 16
MAX_VALUES = SLOT_WORDS - _W_VALUES  # the table's 16 keys fit
_BOOL = 0x80  # on an index: the value was a bool (overflow)
_KEYS = tuple(BY_KEY)


class RingError(Exception):
    """A ring that cannot be read as one (another format, truncated, not ours): the message says why."""


def ring_name(json_log_path: str | os.PathLike[str], rank: int, attempt_id: str) -> Path:
    """Where rank `rank`'s run `attempt_id` keeps its ring: beside the JSON log."""
    path = Path(json_log_path)
    return path.with_name(f"{path.stem}.rank_{rank}.{attempt_id}{SUFFIX}")


def rings_beside(json_log_path: str | os.PathLike[str], rank: int | None = None) -> list[Path]:
    """The rings beside `json_log_path`: of `rank`, or of every rank."""
    path = Path(json_log_path)
    pattern = f"{path.stem}.rank_{'*' if rank is None else rank}.*{SUFFIX}"
    return sorted(path.parent.glob(pattern))


@dataclass(frozen=True)
class Header:
    rank: int
    pid: int
    flags: int
    perf0: float
    wall0: float
    created: float
    finished_step: int
    written_step: int
    attempt: int
    job_id: str
    attempt_id: str
    json_name: str

    def wall(self, perf: float) -> float:
        """Unix time of one of the run's perf_counter readings (core/clock.py WallClock)."""
        return self.wall0 + (perf - self.perf0)


@dataclass(frozen=True)
class Slot:
    """One sampled step as the training thread handed it over."""

    seq: int
    step: int
    epoch: int
    steps: int
    is_last: bool
    elapsed: float
    previous_end: float
    step_begin: float
    end: float
    data_wait: float
    phases: float
    breakdown_at: float
    values: dict[str, float | bool] = field(default_factory=dict)


@dataclass(frozen=True)
class RingContents:
    header: Header
    slots: list[Slot]  # the valid ones, oldest first
    damaged: int  # slots in use whose parts disagree


# --- writing (the run's own ring) --------------------------------------------------------------


def _text(value: str) -> bytes:
    data = value.encode("utf-8")[: _TEXT_LIMIT - 2]
    return struct.pack("<H", len(data)) + data


class RingWriter:
    """A new ring for one run, created whole, mapped and locked until `close`.

    `finished` is the int64 view the step hook stores the job's step into (`finished[0] = step`);
    `write(sampled)` stores a sampled step (training thread); `written(step)` notes that the
    outputs wrote every record up to `step` (pipeline worker)."""

    def __init__(
        self,
        path: Path,
        *,
        rank: int,
        job_id: str,
        attempt_id: str,
        attempt: int,
        json_name: str,
        perf0: float,
        wall0: float,
        created: float,
        flags: int = 0,
    ) -> None:
        self.path = path
        temporary = path.with_name(f".{path.name}.tmp")
        fd = os.open(temporary, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # ours: nobody else has seen the file
            header = bytearray(FILE_BYTES)
            _HEADER.pack_into(
                header, 0, MAGIC, FORMAT_VERSION, HEADER_BYTES, SLOT_BYTES, SLOT_COUNT, rank, os.getpid(), flags,
                perf0, wall0, created,
            )  # fmt: skip
            _ATTEMPT.pack_into(header, _ATTEMPT_OFFSET, attempt)
            text = b"".join(_text(v) for v in (job_id, attempt_id, json_name))
            header[_TEXT_OFFSET : _TEXT_OFFSET + len(text)] = text
            # Written whole, zeros included, not a sparse file: a store into a page the file
            # system has no block for is a SIGBUS when the disk is full. With every block
            # there, a full disk later cannot touch the training process through the ring.
            if os.pwrite(fd, header, 0) != FILE_BYTES:
                raise OSError(errno.ENOSPC, "No space left on device")
            # Whole before it has its name: a reader never sees a ring without its header.
            os.rename(temporary, path)
            self._map = mmap.mmap(fd, FILE_BYTES, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            os.close(fd)
            try:
                os.unlink(temporary)
            except OSError:
                pass
            raise
        self._fd = fd  # open (and locked) while the run lives
        words = memoryview(self._map).cast("q")
        self.finished = words[FINISHED_OFFSET // 8 : FINISHED_OFFSET // 8 + 1]
        self._written = words[WRITTEN_OFFSET // 8 : WRITTEN_OFFSET // 8 + 1]
        self._words = words
        self._floats = memoryview(self._map).cast("d")
        self._seq = 0
        self._failed = False
        self._layouts: dict[tuple[str, ...], tuple[int, int, int, tuple[str, ...] | None]] = {}

    def write(self, sampled: tuple) -> None:
        """Store a sampled step (MonitorRun.sample's SampledStep: step, epoch, values, model
        state, is_last, then the window's readings) in the next slot.

        Word by word into the map, no struct and no call: inside Model.train everything this
        touches is a cache miss (docs/performance.md), and a `pack_into` of the slot cost
        twice these stores there. The slot's number is zeroed first and stored again last
        (the commit marker): a death between these stores leaves an empty slot, never a
        half-written one that reads as whole."""
        values = sampled[2]
        flags, keys_low, keys_high, kept = self._layouts.get(tuple(values)) or self._layout(values)
        seq = self._seq + 1
        base = HEADER_WORDS + seq % SLOT_COUNT * SLOT_WORDS
        words, floats = self._words, self._floats
        words[base] = 0
        try:
            words[base + 1] = seq
            words[base + 2] = sampled[0]
            words[base + 3] = sampled[1] or 0
            words[base + 4] = sampled[5]
            words[base + 5] = flags | sampled[4]
            words[base + 6] = keys_low
            words[base + 7] = keys_high
            floats[base + 8] = sampled[6]
            floats[base + 9] = sampled[7]
            floats[base + 10] = sampled[8]
            floats[base + 11] = sampled[9]
            floats[base + 12] = sampled[10]
            floats[base + 13] = sampled[11]
            floats[base + 14] = sampled[12]
            at = base + _W_VALUES
            for value in values.values() if kept is None else (values[key] for key in kept):
                floats[at] = value
                at += 1
        except (TypeError, ValueError) as exc:  # a value that is no number: the step is not kept
            self._refused(exc)
            return
        self._seq = seq
        words[base] = seq  # the commit marker, last

    def _refused(self, exc: Exception) -> None:
        if not self._failed:
            self._failed = True
            _logger.warning("otel_mindformers: the flight ring %s cannot keep a step: %s", self.path, exc)

    def _layout(self, values: dict) -> tuple[int, int, int, tuple[str, ...] | None]:
        """How a key set is stored: the count (shifted past is_last), its table indexes (bool
        values marked) as two words of bytes, and the keys kept when some are left out (keys
        outside the table, and any past MAX_VALUES)."""
        keys = tuple(values)
        kept = tuple(key for key in keys if key in ORDER)[:MAX_VALUES]
        indexes = bytes(ORDER[key] | (_BOOL if type(values[key]) is bool else 0) for key in kept).ljust(16, b"\0")
        layout = (
            len(kept) << 8,
            int.from_bytes(indexes[:8], "little", signed=True),
            int.from_bytes(indexes[8:], "little", signed=True),
            None if kept == keys else kept,
        )
        self._layouts[keys] = layout
        return layout

    def written(self, step: int) -> None:
        """The outputs wrote every record up to `step` (pipeline worker)."""
        self._written[0] = step

    @property
    def all_written(self) -> bool:
        """Whether the outputs wrote the last step stored (its slot's step against the mark)."""
        if not self._seq:
            return True
        last_step = self._words[HEADER_WORDS + self._seq % SLOT_COUNT * SLOT_WORDS + _W_STEP]
        return bool(self._written[0] >= last_step)

    def close(self, *, remove: bool) -> None:
        """Unmap and unlock; with `remove`, the file goes too (nothing in it is left to recover)."""
        self.finished.release()
        self._written.release()
        self._words.release()
        self._floats.release()
        try:
            if remove:
                os.unlink(self.path)
            self._map.close()
        finally:
            os.close(self._fd)


# --- reading (another run's ring) --------------------------------------------------------------


def _read_text(data: bytes, offset: int) -> tuple[str, int]:
    (length,) = struct.unpack_from("<H", data, offset)
    if length > _TEXT_LIMIT - 2 or offset + 2 + length > HEADER_BYTES:
        raise RingError("a name in its header runs past the header")
    return data[offset + 2 : offset + 2 + length].decode("utf-8"), offset + 2 + length


def parse_header(data: bytes) -> Header:
    """The header of a ring's bytes; RingError naming what is wrong."""
    if len(data) < HEADER_BYTES:
        raise RingError(f"{len(data)} bytes: shorter than its header")
    fields = _HEADER.unpack_from(data, 0)
    magic, version, header_bytes, slot_bytes, slot_count, rank, pid, flags, perf0, wall0, created = fields
    if magic != MAGIC:
        raise RingError("not a flight ring (its first bytes are not the ring's magic)")
    if version != FORMAT_VERSION:
        raise RingError(f"ring format {version}, this package reads format {FORMAT_VERSION}")
    if (header_bytes, slot_bytes, slot_count) != (HEADER_BYTES, SLOT_BYTES, SLOT_COUNT) or len(data) != FILE_BYTES:
        raise RingError(f"{len(data)} bytes, slots {slot_count} x {slot_bytes}: not this format's sizes")
    try:
        job_id, offset = _read_text(data, _TEXT_OFFSET)
        attempt_id, offset = _read_text(data, offset)
        json_name, _ = _read_text(data, offset)
    except UnicodeDecodeError as exc:
        raise RingError("a name in its header is not UTF-8") from exc
    (finished,) = struct.unpack_from("<q", data, FINISHED_OFFSET)
    (written,) = struct.unpack_from("<q", data, WRITTEN_OFFSET)
    (attempt,) = _ATTEMPT.unpack_from(data, _ATTEMPT_OFFSET)
    return Header(
        rank=rank, pid=pid, flags=flags, perf0=perf0, wall0=wall0, created=created, finished_step=finished,
        written_step=written, attempt=attempt, job_id=job_id, attempt_id=attempt_id, json_name=json_name,
    )  # fmt: skip


_SLOT = struct.Struct(f"<8q8d{MAX_VALUES}d")


def _parse_slot(data: bytes, offset: int) -> Slot | None:
    """The slot at `offset`; None when it is empty (ValueError: damaged, its parts disagree)."""
    seq, inner_seq, step, epoch, steps, flags, keys_low, keys_high, *rest = _SLOT.unpack_from(data, offset)
    if seq == 0:
        return None
    is_last, count = flags & 0xFF, flags >> 8
    if inner_seq != seq or count > MAX_VALUES or is_last > 1 or steps < 0:
        raise ValueError("its parts disagree")
    indexes = (keys_low.to_bytes(8, "little", signed=True) + keys_high.to_bytes(8, "little", signed=True))[:count]
    numbers = rest[_W_VALUES - _W_READINGS :][:count]
    values: dict[str, float | bool] = {}
    for index, number in zip(indexes, numbers):
        if index & ~_BOOL >= len(_KEYS):
            raise ValueError("a value outside the table")
        values[_KEYS[index & ~_BOOL]] = bool(number) if index & _BOOL else number
    elapsed, previous_end, step_begin, end, data_wait, phases, breakdown_at = rest[:7]
    return Slot(
        seq=seq, step=step, epoch=epoch, steps=steps, is_last=bool(is_last), elapsed=elapsed,
        previous_end=previous_end, step_begin=step_begin, end=end, data_wait=data_wait, phases=phases,
        breakdown_at=breakdown_at, values=values,
    )  # fmt: skip


def parse_ring(data: bytes) -> RingContents:
    """A ring's header and valid slots (oldest first); RingError when the header is unreadable."""
    header = parse_header(data)
    slots: list[Slot] = []
    damaged = 0
    for index in range(SLOT_COUNT):
        try:
            slot = _parse_slot(data, HEADER_BYTES + index * SLOT_BYTES)
        except (ValueError, struct.error):
            damaged += 1
            continue
        if slot is not None:
            slots.append(slot)
    slots.sort(key=lambda slot: slot.seq)
    return RingContents(header, slots, damaged)


__all__ = [
    "FILE_BYTES", "FINISHED_OFFSET", "FORMAT_VERSION", "Header", "RingContents", "RingError", "RingWriter", "SUFFIX",
    "Slot", "WRITTEN_OFFSET", "parse_header", "parse_ring", "ring_name", "rings_beside",
]  # fmt: skip
