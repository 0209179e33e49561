"""The flight ring: one rank's sampled steps in a file beside its JSON log.

A process that dies without running another line of Python (SIGKILL, the OOM killer,
`os._exit`, `abort()`, a segfault) leaves what it wrote into a file in the page cache,
which the kernel writes back on its own: the next process that opens the file reads it.
So the training thread writes here what it hands to the pipeline on a sampled step, and
the job's step on every other step; the pipeline worker notes how far the outputs have written.
What lies between the two is what a death would have lost.

    {json_log_path stem}.rank_{rank}.{attempt id}.flight

Every write is a `pwrite(2)` of the ring's open descriptor, never a store into a shared
mapping: a mapping dies with a bus error (SIGBUS) on the first store past the end of a file
that another process shrank (`: > out/*`, logrotate's `copytruncate`, a size-based cleaner),
while a write into a shrunk file only grows it again. The pipeline worker finds a ring that
was cut and writes its header back (one warning).

One file per run (an attempt of its job): a ring is never reopened for writing, so the next
attempt can recover its predecessor's tail while it writes its own, and a recovery that
dies half way leaves the tail where it was. Layout, little-endian:

- the header page (HEADER_BYTES): magic, format version, its own size, slot size and count,
  rank, pid, flags, the run's (perf_counter, Unix time) origin, when it was created; the
  last finished job step (`FINISHED_OFFSET`: the step hook's write on every step it does
  not sample; a sampled step's slot holds its step); the step
  of the last record the outputs wrote (`WRITTEN_OFFSET`, the pipeline worker's); the
  attempt number and the slot layout's id; the job id, the attempt id and the JSON log's
  file name;
- SLOT_COUNT slots of SLOT_BYTES (32 eight-byte words), used round-robin, each written
  whole by one `pwrite`. A slot: its sequence number (0 = empty), the flags (is_last, the
  count of values), the values' table indexes (names/training.TABLE, one byte each, a
  bool's marked), then SampledStep's fields as `SLOT_FIELDS` lists them (core/
  sampled_step.py: the step, the window's size and its clock readings), the values, and
  the sequence number again in the last word. A slot whose parts disagree (the two numbers,
  an index outside the table, a reading that is no time) is damaged: skipped.

The file is held under an exclusive `flock` while its run lives: the kernel drops it when
the process dies, however it dies, so a reader that gets the lock knows the writer is gone.

A ring is another process's file to whoever reads it: `parse_header` and `parse_ring`
refuse one whose header no run of this package could have written (a clock that is no
time, a name with a control character or a folder in it, a step past `MAX_STEP`).
"""

from __future__ import annotations

import errno
import fcntl
import functools
import glob
import math
import operator
import os
import re
import struct
import threading
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from otel_mindformers.core.guarded_log import get_logger
from otel_mindformers.core.sampled_step import SampledStep
from otel_mindformers.names.training import BY_KEY, ORDER

_logger = get_logger(__name__)

MAGIC = b"OMFRING\x00"
FORMAT_VERSION = 2  # 2: written with pwrite, the slot's layout derived from SampledStep
SUFFIX = ".flight"
HEADER_BYTES = 4096  # one page
SLOT_BYTES = 256
# More than the pipeline's queue holds (1024) plus a batch: every record the worker has not
# written yet is still in the ring, unless training outran the outputs and records were dropped.
SLOT_COUNT = 1152
FILE_BYTES = HEADER_BYTES + SLOT_BYTES * SLOT_COUNT

FLAG_STEP_TIME = 1  # the run's monitored_metrics asked for the step time (recovery computes it)
_KNOWN_FLAGS = FLAG_STEP_TIME

# A step, an epoch or a window past this is no run's: JSON readers hold numbers as doubles,
# exact to 2**53.
MAX_STEP = 2**53
MAX_RANK = 1 << 20
_MAX_TIME = 2.0**33  # seconds: a Unix time, or a perf_counter reading, before the year 2242

# magic, version, header bytes, slot bytes, slot count, rank, pid, flags, perf0, wall0, created
_HEADER = struct.Struct("<8sIIIIiiIddd")
FINISHED_OFFSET = 64  # int64: the last finished job step not sampled (the step hook's write)
WRITTEN_OFFSET = 72  # int64: the step of the last record the outputs wrote (the worker's)
_ATTEMPT = struct.Struct("<iI")  # the attempt number, the slot layout's id
_ATTEMPT_OFFSET = 80
_TEXT_OFFSET = 128  # job id, attempt id, JSON log name: each a 2-byte length and its bytes
_TEXT_LIMIT = 1024  # bytes each may take
_ATTEMPT_ID = re.compile(r"[0-9A-Za-z_-]{1,128}")  # a UUID's hex: it is part of the ring's name
_STEP = struct.Struct("<q")

# --- a slot's layout, from SampledStep's fields --------------------------------------------------
# Kept as whole numbers: the step and the window's size. The epoch is one too, but None when
# MindSpore gave none (stored as 0). `values` becomes the indexes and the values, `is_last` a
# flag; `model_state` is the worker's to summarise, not kept. Every other field is one of the
# window's clock readings: a float, kept in SampledStep's order.
_WHOLE = ("step", "steps")
_NOT_READINGS = frozenset({*_WHOLE, "epoch", "values", "model_state", "is_last"})
_FIELDS = SampledStep._fields
READINGS = tuple(name for name in _FIELDS if name not in _NOT_READINGS)
SLOT_FIELDS = ("epoch", *(name for name in _FIELDS if name in _WHOLE), *READINGS)
# seq, flags (is_last | count << 8), indexes (two words), then SLOT_FIELDS; the values; seq.
_HEAD_FORMAT = "<qqqq" + "q" * (len(SLOT_FIELDS) - len(READINGS)) + "d" * len(READINGS)
_HEAD_WORDS = struct.calcsize(_HEAD_FORMAT) // 8
MAX_VALUES = SLOT_BYTES // 8 - _HEAD_WORDS - 1
_EPOCH, _IS_LAST, _VALUES = (_FIELDS.index(name) for name in ("epoch", "is_last", "values"))
# SLOT_FIELDS after the epoch, as one C call on a SampledStep.
_KEPT = operator.itemgetter(*(_FIELDS.index(name) for name in SLOT_FIELDS[1:]))
_BOOL = 0x80  # on an index: the value was a bool (overflow)
_KEYS = tuple(BY_KEY)
# What a reader must agree on to read a slot: the fields in their order, the values' table.
LAYOUT_ID = zlib.crc32(repr((SLOT_FIELDS, _KEYS, MAX_VALUES)).encode())


class RingError(Exception):
    """A ring that cannot be read as one (another format, truncated, implausible, not ours):
    the message says why."""


def ring_name(json_log_path: str | os.PathLike[str], rank: int, attempt_id: str) -> Path:
    """Where rank `rank`'s run `attempt_id` keeps its ring: beside the JSON log."""
    path = Path(json_log_path)
    return path.with_name(f"{path.stem}.rank_{rank}.{attempt_id}{SUFFIX}")


_RING_NAME = re.compile(r"(?P<stem>.+)\.rank_(?P<rank>\d+)\.(?P<attempt_id>[0-9A-Za-z_-]+)" + re.escape(SUFFIX))


def name_parts(path: Path) -> tuple[str, int, str] | None:
    """(the JSON log's stem, rank, attempt id) of a ring's file name; None for another name."""
    match = _RING_NAME.fullmatch(path.name)
    return None if match is None else (match["stem"], int(match["rank"]), match["attempt_id"])


def rings_beside(json_log_path: str | os.PathLike[str], rank: int | None = None) -> list[Path]:
    """The rings beside `json_log_path`: of `rank`, or of every rank (its name is not a pattern)."""
    path = Path(json_log_path)
    pattern = f"{glob.escape(path.stem)}.rank_{'*' if rank is None else rank}.*{SUFFIX}"
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
    """One sampled step as the training thread handed it over: SLOT_FIELDS, by name."""

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


_Layout = tuple[struct.Struct, int, int, int, tuple[str, ...] | None]


class RingWriter:
    """A new ring for one run, created whole, open and locked until `close`.

    `finished` is the int64 the step hook stores the job's step into (`finished[0] = step`)
    and `keep()` writes it into the ring (C calls only: no Python frame on the hot path);
    `write(sampled)` writes a sampled step (training thread); `written(step)` notes that the
    outputs wrote every record up to `step`, and puts back a header another process cut
    (pipeline worker)."""

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
        header = bytearray(HEADER_BYTES)
        _HEADER.pack_into(
            header, 0, MAGIC, FORMAT_VERSION, HEADER_BYTES, SLOT_BYTES, SLOT_COUNT, rank, os.getpid(), flags,
            perf0, wall0, created,
        )  # fmt: skip
        _ATTEMPT.pack_into(header, _ATTEMPT_OFFSET, attempt, LAYOUT_ID)
        text = b"".join(_text(v) for v in (job_id, attempt_id, json_name))
        header[_TEXT_OFFSET : _TEXT_OFFSET + len(text)] = text
        temporary = path.with_name(f".{path.name}.tmp")
        fd = os.open(temporary, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # ours: nobody else has seen the file
            # Written whole, zeros included, not a sparse file: every block is there, so a
            # write into the ring never needs a new one (a full disk cannot refuse it).
            whole = bytes(header) + bytes(FILE_BYTES - HEADER_BYTES)
            if os.pwrite(fd, whole, 0) != FILE_BYTES:
                raise OSError(errno.ENOSPC, "No space left on device")
            # Whole before it has its name: a reader never sees a ring without its header.
            os.rename(temporary, path)
        except BaseException:
            os.close(fd)
            try:
                os.unlink(temporary)
            except OSError:
                pass
            raise
        self._fd = fd  # open (and locked) while the run lives
        self._header = bytes(header)
        finished = bytearray(8)
        self.finished = memoryview(finished).cast("q")
        self.keep: Callable[[], object] = functools.partial(os.pwrite, fd, finished, FINISHED_OFFSET)
        self._seq = 0
        self._last_step = 0  # the step of the last slot written
        self._written = 0
        self._failed = False
        self._cut_warned = False
        self._closing = threading.Lock()  # the worker's `written` against `close`: a closed number is reused
        self._layouts: dict[tuple[str, ...], _Layout] = {}

    def write(self, sampled: tuple) -> None:
        """Write a sampled step (MonitorRun.sample's SampledStep) into the next slot, whole,
        in one `pwrite`: a death cannot leave part of it (the slot's number, first and last,
        says so if a write was ever cut short)."""
        values = sampled[_VALUES]
        packer, flags, keys_low, keys_high, kept = self._layouts.get(tuple(values)) or self._layout(values)
        seq = self._seq + 1
        try:
            data = packer.pack(
                seq, flags | sampled[_IS_LAST], keys_low, keys_high, sampled[_EPOCH] or 0, *_KEPT(sampled),
                *(values.values() if kept is None else map(values.__getitem__, kept)), seq,
            )  # fmt: skip
            os.pwrite(self._fd, data, HEADER_BYTES + seq % SLOT_COUNT * SLOT_BYTES)
        except (struct.error, TypeError, ValueError, OSError) as exc:  # a value that is no number, a disk error
            self._refused(exc)
            return
        self._seq = seq
        self._last_step = sampled[0]

    def _refused(self, exc: Exception) -> None:
        if not self._failed:
            self._failed = True
            _logger.warning("otel_mindformers: the flight ring %s cannot keep a step: %s", self.path, exc)

    def _layout(self, values: dict) -> _Layout:
        """How a key set is stored: the slot's packer, the count (shifted past is_last), its
        table indexes (bool values marked) as two words of bytes, and the keys kept when some
        are left out (keys outside the table, and any past MAX_VALUES)."""
        keys = tuple(values)
        kept = tuple(key for key in keys if key in ORDER)[:MAX_VALUES]
        indexes = bytes(ORDER[key] | (_BOOL if type(values[key]) is bool else 0) for key in kept).ljust(16, b"\0")
        layout = (
            struct.Struct(f"{_HEAD_FORMAT}{len(kept)}d{(MAX_VALUES - len(kept)) * 8}xq"),
            len(kept) << 8,
            int.from_bytes(indexes[:8], "little", signed=True),
            int.from_bytes(indexes[8:], "little", signed=True),
            None if kept == keys else kept,
        )
        self._layouts[keys] = layout
        return layout

    def written(self, step: int) -> None:
        """The outputs wrote every record up to `step` (pipeline worker, after each batch).
        A ring another process cut gets its header back here, with one warning."""
        with self._closing:
            if self._fd < 0:  # closed: a worker that outlived the run's deadline
                return
            try:
                os.pwrite(self._fd, _STEP.pack(step), WRITTEN_OFFSET)
                self._written = step
                size = os.fstat(self._fd).st_size
                if size != FILE_BYTES or os.pread(self._fd, FINISHED_OFFSET, 0) != self._header[:FINISHED_OFFSET]:
                    self._put_back(size)
            except OSError as exc:
                self._refused(exc)

    def _put_back(self, size: int) -> None:
        """Another process cut (or overwrote) the file: its header again, at its size. The
        slots it took are gone; the finished step comes back with the next step's write."""
        if size < FILE_BYTES:
            os.ftruncate(self._fd, FILE_BYTES)
        os.pwrite(self._fd, self._header[:FINISHED_OFFSET], 0)
        os.pwrite(self._fd, self._header[_ATTEMPT_OFFSET:], _ATTEMPT_OFFSET)
        os.pwrite(self._fd, _STEP.pack(self._written), WRITTEN_OFFSET)
        if size > FILE_BYTES:
            os.ftruncate(self._fd, FILE_BYTES)
        if not self._cut_warned:
            self._cut_warned = True
            _logger.warning(
                "otel_mindformers: the flight ring %s was cut or overwritten by another process (%d bytes); its "
                "header is written back (the steps it held before are gone from it; leave *%s files to their run)",
                self.path, size, SUFFIX,
            )  # fmt: skip

    @property
    def all_written(self) -> bool:
        """Whether the outputs wrote the last step stored."""
        return not self._seq or self._written >= self._last_step

    def close(self, *, remove: bool) -> None:
        """Unlock; with `remove`, the file goes too (nothing in it is left to recover). A
        write after this is none: the descriptor's number may be another file's by then."""
        self.keep = tuple  # a C callable that does nothing
        with self._closing:
            fd, self._fd = self._fd, -1
        try:
            if remove:
                try:
                    os.unlink(self.path)
                except FileNotFoundError:  # another process removed it
                    pass
        finally:
            os.close(fd)


# --- reading (another run's ring) --------------------------------------------------------------


def _read_text(data: bytes, offset: int) -> tuple[str, int]:
    (length,) = struct.unpack_from("<H", data, offset)
    if length > _TEXT_LIMIT - 2 or offset + 2 + length > HEADER_BYTES:
        raise RingError("a name in its header runs past the header")
    return data[offset + 2 : offset + 2 + length].decode("utf-8"), offset + 2 + length


def _plain_time(value: float) -> bool:
    """A Unix time or a perf_counter reading (or a sum of them): a number, and no later than 2242."""
    return math.isfinite(value) and abs(value) < _MAX_TIME


def parse_header(data: bytes) -> Header:
    """The header of a ring's bytes; RingError naming what is wrong, or implausible."""
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
    attempt, layout = _ATTEMPT.unpack_from(data, _ATTEMPT_OFFSET)
    if layout != LAYOUT_ID:
        raise RingError("its slots are laid out for another version of this package")
    try:
        job_id, offset = _read_text(data, _TEXT_OFFSET)
        attempt_id, offset = _read_text(data, offset)
        json_name, _ = _read_text(data, offset)
    except UnicodeDecodeError as exc:
        raise RingError("a name in its header is not UTF-8") from exc
    (finished,) = _STEP.unpack_from(data, FINISHED_OFFSET)
    (written,) = _STEP.unpack_from(data, WRITTEN_OFFSET)
    problem = (
        f"rank {rank}" if not 0 <= rank < MAX_RANK
        else f"pid {pid}" if pid <= 0
        else f"flags {flags:#x}" if flags & ~_KNOWN_FLAGS
        else f"clock ({perf0!r}, {wall0!r}, {created!r})" if not all(map(_plain_time, (perf0, wall0, created)))
        else f"last step {finished}, written step {written}" if not (0 <= finished <= MAX_STEP and 0 <= written <= MAX_STEP)
        else f"attempt {attempt}" if attempt < 0
        else f"job id {job_id!r}" if not job_id.isprintable()
        else f"attempt id {attempt_id!r}" if not _ATTEMPT_ID.fullmatch(attempt_id)
        else f"log name {json_name!r}" if not _plain_name(json_name)
        else None
    )  # fmt: skip
    if problem is not None:
        raise RingError(f"its header is no run's: {problem}")
    return Header(
        rank=rank, pid=pid, flags=flags, perf0=perf0, wall0=wall0, created=created, finished_step=finished,
        written_step=written, attempt=attempt, job_id=job_id, attempt_id=attempt_id, json_name=json_name,
    )  # fmt: skip


def _plain_name(name: str) -> bool:
    """A file name in the ring's own folder (or none): no folder, no control character."""
    return name == "" or (name.isprintable() and "/" not in name and name not in (".", ".."))


_HEAD = struct.Struct(_HEAD_FORMAT)
_NUMBERS = struct.Struct(f"<{MAX_VALUES}dq")


def _parse_slot(data: bytes, offset: int) -> Slot | None:
    """The slot at `offset`; None when it is empty (ValueError: damaged, its parts disagree)."""
    seq, flags, keys_low, keys_high, *kept = _HEAD.unpack_from(data, offset)
    if seq == 0:
        return None
    *numbers, last_seq = _NUMBERS.unpack_from(data, offset + _HEAD.size)
    is_last, count = flags & 0xFF, flags >> 8
    if last_seq != seq or seq < 0 or count > MAX_VALUES or is_last > 1:
        raise ValueError("its parts disagree")
    fields = dict(zip(SLOT_FIELDS, kept))
    if not (1 <= fields["step"] <= MAX_STEP and 0 <= fields["epoch"] <= MAX_STEP and 0 <= fields["steps"] <= MAX_STEP):
        raise ValueError("a step no run reaches")
    if not all(map(_plain_time, (fields[name] for name in READINGS))):
        raise ValueError("a clock reading that is no time")
    indexes = (keys_low.to_bytes(8, "little", signed=True) + keys_high.to_bytes(8, "little", signed=True))[:count]
    values: dict[str, float | bool] = {}
    for index, number in zip(indexes, numbers):
        if index & ~_BOOL >= len(_KEYS):
            raise ValueError("a value outside the table")
        values[_KEYS[index & ~_BOOL]] = bool(number) if index & _BOOL else number
    return Slot(seq=seq, is_last=bool(is_last), values=values, **fields)


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
    "FILE_BYTES", "FINISHED_OFFSET", "FORMAT_VERSION", "Header", "MAX_STEP", "READINGS", "RingContents", "RingError",
    "RingWriter", "SLOT_FIELDS", "SUFFIX", "Slot", "WRITTEN_OFFSET", "name_parts", "parse_header", "parse_ring",
    "ring_name", "rings_beside",
]  # fmt: skip
