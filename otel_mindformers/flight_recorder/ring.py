"""The flight ring: one rank's sampled steps, in shared memory and in a file beside its JSON log.

A process that dies without running another line of Python (SIGKILL, the OOM killer,
`os._exit`, `abort()`, a segfault) leaves behind what it stored into a System V shared
memory segment (it stays until removed: flight_recorder/shm.py) and what it wrote into a
file. So the training thread stores here what it hands to the pipeline on a sampled step,
and the job's step on every step: plain memory stores, no system call; the pipeline worker
notes how far the outputs have written, and copies what changed into the ring's file after
each batch. What lies between the two is what a death would have lost.

    {json_log_path stem}.rank_{rank}.{attempt id}.flight

The segment holds the ring's whole image; the file holds the same bytes as of the worker's
last batch, and its header names the segment: the next process on this host (the same boot
and IPC namespace) reads the exact tail and last step from the segment, anyone else reads the
file. A segment's size is fixed at its creation: no other process can shrink it under a store
(a store into a file mapping that another process cut is a SIGBUS), and a file cut under the
worker's copy is written whole again (one warning). Where no segment can be had (shmget
refused), the ring is a private buffer copied into the file the same way, and each sampled
step's slot is also written into the file at once (one pwrite): a death then loses the steps
after the last sampled one.

One file per run (an attempt of its job): a ring is never reopened for writing, so the next
attempt can recover its predecessor's tail while it writes its own, and a recovery that
dies half way leaves the tail where it was. Layout, little-endian:

- the header page (HEADER_BYTES): magic, format version, its own size, slot size and count,
  rank, pid, flags, the run's (perf_counter, Unix time) origin, when it was created; the
  last finished job step (`FINISHED_OFFSET`: the step hook's store, every step); the step
  of the last record the outputs wrote (`WRITTEN_OFFSET`, the pipeline worker's); the
  attempt number and the slot layout's id; the first step an offline reader wrote into the
  JSON log without sending it over OTLP (`UNSENT_OFFSET`, 0: none); the job id, the attempt id and
  the JSON log's file name; at `SEGMENT_OFFSET` the segment's id (-1: none, or its bytes are in the file
  now), a random token, the boot id and IPC namespace it lives in, and the file's (device,
  inode): a reader takes a segment only when all of them, its owner and its header match;
- SLOT_COUNT slots of SLOT_BYTES (32 eight-byte words), used round-robin. A slot: its
  sequence number (0 = empty), the flags (is_last, the count of values), the values' table
  indexes (names/training.TABLE, one byte each, a bool's marked), then SampledStep's fields
  as `SLOT_FIELDS` lists them (core/sampled_step.py: the step, the window's size and its
  clock readings), the values, and the sequence number again in the last word. The first
  word is stored last: a death half way leaves an empty slot. A slot whose parts disagree
  (the two numbers, an index outside the table, a reading that is no time) is damaged: skipped.

The file is held under an exclusive `flock` while its run lives: the kernel drops it when
the process dies, however it dies, so a reader that gets the lock knows the writer is gone.

A ring is another process's file to whoever reads it: `parse_header` and `parse_ring`
refuse one whose header no run of this package could have written (a clock that is no
time, a name with a control character or a folder in it, a step past `MAX_STEP`), and
`segment_of` refuses a segment that is not the ring's own.
"""

from __future__ import annotations

import dataclasses
import errno
import fcntl
import glob
import math
import os
import re
import struct
import threading
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from otel_mindformers.core.guarded_log import get_logger
from otel_mindformers.core.sampled_step import SampledStep
from otel_mindformers.flight_recorder import shm
from otel_mindformers.names.training import BY_KEY, ORDER

_logger = get_logger(__name__)

MAGIC = b"OMFRING\x00"
FORMAT_VERSION = 3  # 2: the slot's layout derived from SampledStep; 3: the shared-memory segment it names
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
FINISHED_OFFSET = 64  # int64: the last finished job step (the step hook's store)
WRITTEN_OFFSET = 72  # int64: the step of the last record the outputs wrote (the worker's)
_ATTEMPT = struct.Struct("<iI")  # the attempt number, the slot layout's id
_ATTEMPT_OFFSET = 80
# int64: the first step of the tail that an offline reader (`report`) wrote into the JSON log
# before the next attempt took the ring, 0: none. From it on, no process sent the tail over
# OTLP: the next attempt still does. Its run writes 0 there (a ring of an older version too).
UNSENT_OFFSET = 88
_TEXT_OFFSET = 128  # job id, attempt id, JSON log name: each a 2-byte length and its bytes
_TEXT_LIMIT = 1024  # bytes each may take
# The segment: its id (-1: none), a token, boot id, IPC namespace, the file's (device, inode).
_SEGMENT = struct.Struct("<i4x16s16sQQQ")
SEGMENT_OFFSET = HEADER_BYTES - 512  # past the names (128 + 3 x 1024)
_NO_SEGMENT = struct.pack("<i", -1)
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
# Where the writer finds SLOT_FIELDS after the epoch in a SampledStep, and the slot's words.
_FIRST_WHOLE, _SECOND_WHOLE = (_FIELDS.index(name) for name in SLOT_FIELDS[1 : 1 + len(_WHOLE)])
_READINGS_AT = tuple(_FIELDS.index(name) for name in READINGS)
_SLOT_WORDS = SLOT_BYTES // 8
_SLOTS_AT = HEADER_BYTES // 8
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
class SegmentRef:
    """The shared-memory segment a ring's header names, and what proves a segment is its."""

    id: int  # -1: none (a ring in its file alone, or one whose segment's bytes are in the file now)
    token: bytes  # random, in the segment's header too: an id the kernel gave to another segment is not it
    boot: bytes  # the boot id and IPC namespace the segment lives in: elsewhere the id names none
    namespace: int
    file: tuple[int, int]  # (device, inode) of the ring's file: a copy of the file is not the ring


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
    unsent_from: int
    attempt: int
    job_id: str
    attempt_id: str
    json_name: str
    segment: SegmentRef

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


_Layout = tuple[int, int, int, tuple[str, ...] | None]


class RingWriter:
    """A new ring for one run, created whole, its file open and locked until `close`.

    `finished` is the int64 the step hook stores the job's step into (`finished[0] = step`:
    the ring's memory, no call); `write(sampled)` stores a sampled step (training thread);
    `written(step)` notes that the outputs wrote every record up to `step` and copies what
    changed into the file, putting back a file another process cut (pipeline worker)."""

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
        try:
            segment: shm.Attachment | None = shm.create(FILE_BYTES)
            unavailable = None
        except OSError as exc:  # a sandbox that forbids it, the system's limits
            segment, unavailable = None, exc
        temporary = path.with_name(f".{path.name}.tmp")
        try:
            fd = os.open(temporary, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        except BaseException:
            _drop(segment)
            raise
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # ours: nobody else has seen the file
            header = bytearray(HEADER_BYTES)
            _HEADER.pack_into(
                header, 0, MAGIC, FORMAT_VERSION, HEADER_BYTES, SLOT_BYTES, SLOT_COUNT, rank, os.getpid(), flags,
                perf0, wall0, created,
            )  # fmt: skip
            _ATTEMPT.pack_into(header, _ATTEMPT_OFFSET, attempt, LAYOUT_ID)
            text = b"".join(_text(v) for v in (job_id, attempt_id, json_name))
            header[_TEXT_OFFSET : _TEXT_OFFSET + len(text)] = text
            info = os.fstat(fd)
            _SEGMENT.pack_into(
                header, SEGMENT_OFFSET, -1 if segment is None else segment.id, os.urandom(16), *shm.namespace(),
                info.st_dev, info.st_ino,
            )  # fmt: skip
            image = memoryview(bytearray(FILE_BYTES)) if segment is None else segment.view
            image[:HEADER_BYTES] = header
            # Written whole, zeros included, not a sparse file: every block is there, so a
            # later write into the ring never needs a new one (a full disk cannot refuse it).
            if os.pwrite(fd, image, 0) != FILE_BYTES:
                raise OSError(errno.ENOSPC, "No space left on device")
            # Whole before it has its name: a reader never sees a ring without its header.
            os.rename(temporary, path)
        except BaseException:
            os.close(fd)
            try:
                os.unlink(temporary)
            except OSError:
                pass
            _drop(segment)
            raise
        if unavailable is not None:  # one warning for the run, which opens one ring
            _logger.warning(
                "otel_mindformers: no shared memory for the flight ring %s (%s); it is kept in its file alone, "
                "each sampled step written as it is taken: a death of this process loses the steps after the "
                "last sampled one (the last finished step it tells is the last sampled step, or the step the "
                "outputs' last batch saw)",
                path, unavailable.strerror or unavailable,
            )  # fmt: skip
        self._fd = fd  # open (and locked) while the run lives
        self._segment = segment
        self._image = image  # the segment's memory, or the private buffer the file is written from
        self._words = image.cast("q")
        self._floats = image.cast("d")
        self.finished = self._words[FINISHED_OFFSET // 8 : FINISHED_OFFSET // 8 + 1]
        self.write: Callable[[tuple], None] = self._store if segment is not None else self._store_and_write
        self._seq = 0
        self._last_step = 0  # the step of the last slot stored
        self._copied = 0  # the last slot the file holds
        self._written = 0
        self._failed = False
        self._cut_warned = False
        self._closing = threading.Lock()  # the worker's `written` against `close`: the memory goes
        self._layouts: dict[tuple[str, ...], _Layout] = {}

    def _store(self, sampled: tuple) -> None:
        """Store a sampled step (MonitorRun.sample's SampledStep) in the next slot, word by
        word: no struct and no call (inside Model.train a `Struct.pack_into` of the slot
        cost twice these stores). The slot's first word is zeroed first and its number
        stored there last: a death between leaves an empty slot, never a half-written one
        that reads as whole. The worker copies slots holding the GIL, between two of these
        stores at worst: a slot it copies reads as empty or whole."""
        values = sampled[_VALUES]
        flags, keys_low, keys_high, kept = self._layouts.get(tuple(values)) or self._layout(values)
        seq = self._seq + 1
        base = _SLOTS_AT + seq % SLOT_COUNT * _SLOT_WORDS
        words, floats = self._words, self._floats
        words[base] = 0
        try:
            words[base + 1] = flags | sampled[_IS_LAST]
            words[base + 2] = keys_low
            words[base + 3] = keys_high
            words[base + 4] = sampled[_EPOCH] or 0
            words[base + 5] = sampled[_FIRST_WHOLE]
            words[base + 6] = sampled[_SECOND_WHOLE]
            at = base + 7
            for index in _READINGS_AT:
                floats[at] = sampled[index]
                at += 1
            for value in values.values() if kept is None else map(values.__getitem__, kept):
                floats[at] = value
                at += 1
        except (TypeError, ValueError) as exc:  # a value that is no number: the step is not kept
            self._refused(exc)
            return
        words[base + _SLOT_WORDS - 1] = seq
        words[base] = seq
        self._seq = seq
        self._last_step = sampled[0]

    def _store_and_write(self, sampled: tuple) -> None:
        """Without a segment: the slot into the file at once (one pwrite), which the
        process's death cannot take."""
        self._store(sampled)
        offset = HEADER_BYTES + self._seq % SLOT_COUNT * SLOT_BYTES
        try:
            os.pwrite(self._fd, self._image[offset : offset + SLOT_BYTES], offset)
        except OSError as exc:  # a disk error
            self._refused(exc)

    def _refused(self, exc: Exception) -> None:
        if not self._failed:
            self._failed = True
            _logger.warning("otel_mindformers: the flight ring %s cannot keep a step: %s", self.path, exc)

    def _layout(self, values: dict) -> _Layout:
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
        """The outputs wrote every record up to `step` (pipeline worker, after each batch):
        noted, and the ring's memory copied into its file (its header, the slots stored
        since the last copy). A file another process cut or overwrote is written whole
        again, with one warning."""
        with self._closing:
            if self._fd < 0:  # closed: a worker that outlived the run's deadline
                return
            self._words[WRITTEN_OFFSET >> 3] = step
            self._written = step
            try:
                self._copy()
            except OSError as exc:
                self._refused(exc)

    def _copy(self) -> None:
        seq, fd = self._seq, self._fd
        header = bytes(self._image[:HEADER_BYTES])  # a copy under the GIL: no store lands half in it
        size = os.fstat(fd).st_size
        if size != FILE_BYTES or not _same_header(os.pread(fd, HEADER_BYTES, 0), header):
            self._put_back(size, seq)
            return
        parts = [(0, header)]
        first = max(self._copied + 1, seq - SLOT_COUNT + 1)
        if first <= seq:
            low, high = first % SLOT_COUNT, seq % SLOT_COUNT
            for begin, end in [(low, high)] if low <= high else [(low, SLOT_COUNT - 1), (0, high)]:
                offset = HEADER_BYTES + begin * SLOT_BYTES
                parts.append((offset, bytes(self._image[offset : HEADER_BYTES + (end + 1) * SLOT_BYTES])))
        for offset, data in parts:
            os.pwrite(fd, data, offset)
        self._copied = seq

    def _put_back(self, size: int, seq: int) -> None:
        """Another process cut (or overwrote) the file: the whole ring again, at its size."""
        os.pwrite(self._fd, bytes(self._image), 0)
        if size > FILE_BYTES:
            os.ftruncate(self._fd, FILE_BYTES)
        self._copied = seq
        if not self._cut_warned:
            self._cut_warned = True
            _logger.warning(
                "otel_mindformers: the flight ring %s was cut or overwritten by another process (%d bytes); it is "
                "written whole again from the ring's memory (leave *%s files to their run)",
                self.path, size, SUFFIX,
            )  # fmt: skip

    @property
    def all_written(self) -> bool:
        """Whether the outputs wrote the last step stored."""
        return not self._seq or self._written >= self._last_step

    def close(self, *, remove: bool) -> None:
        """Unlock and let go of the ring's memory; with `remove`, the file goes too (nothing
        in it is left to recover), and without, the whole ring is written into the file,
        which then names no segment. Either way nothing stays in shared memory, unless the
        file could not take it (the next process reads the segment then). A store after
        this is none (its views are released: a ValueError, never memory that is gone)."""
        with self._closing:
            fd, self._fd = self._fd, -1
        segment = self._segment
        kept = False  # the segment, for the next process: where the file could not take it
        try:
            if remove:
                try:
                    os.unlink(self.path)
                except FileNotFoundError:  # another process removed it
                    pass
            elif segment is not None:
                kept = not self._into_file(fd)
        finally:
            self.finished.release()
            self._words.release()
            self._floats.release()
            self._image.release()
            if segment is not None:
                if not kept:
                    shm.remove(segment.id)
                segment.detach()
            os.close(fd)

    def _into_file(self, fd: int) -> bool:
        """The whole ring into its file, naming no segment; False (one warning) where it cannot be written."""
        image = bytearray(self._image)
        image[SEGMENT_OFFSET : SEGMENT_OFFSET + 4] = _NO_SEGMENT
        try:
            os.pwrite(fd, image, 0)
            if os.fstat(fd).st_size > FILE_BYTES:
                os.ftruncate(fd, FILE_BYTES)
        except OSError as exc:  # a disk error
            _logger.warning(
                "otel_mindformers: cannot write the flight ring %s at the run's end (%s); its shared memory "
                "stays for the next process", self.path, exc.strerror or exc,
            )  # fmt: skip
            return False
        return True


def _drop(segment: shm.Attachment | None) -> None:
    if segment is not None:
        segment.detach()
        shm.remove(segment.id)


def _same_header(data: bytes, header: bytes) -> bool:
    """Whether the file's header is the ring's, but for the two steps that move."""
    return data[:FINISHED_OFFSET] == header[:FINISHED_OFFSET] and data[_ATTEMPT_OFFSET:] == header[_ATTEMPT_OFFSET:]


# --- reading (another run's ring) --------------------------------------------------------------


def _read_text(data: bytes, offset: int) -> tuple[str, int]:
    (length,) = struct.unpack_from("<H", data, offset)
    if length > _TEXT_LIMIT - 2 or offset + 2 + length > SEGMENT_OFFSET:
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
    (unsent_from,) = _STEP.unpack_from(data, UNSENT_OFFSET)
    segment_id, token, boot, namespace, device, inode = _SEGMENT.unpack_from(data, SEGMENT_OFFSET)
    problem = (
        f"rank {rank}" if not 0 <= rank < MAX_RANK
        else f"pid {pid}" if pid <= 0
        else f"flags {flags:#x}" if flags & ~_KNOWN_FLAGS
        else f"clock ({perf0!r}, {wall0!r}, {created!r})" if not all(map(_plain_time, (perf0, wall0, created)))
        else f"last step {finished}, written step {written}" if not (0 <= finished <= MAX_STEP and 0 <= written <= MAX_STEP)
        else f"first unsent step {unsent_from}" if not 0 <= unsent_from <= MAX_STEP
        else f"attempt {attempt}" if attempt < 0
        else f"job id {job_id!r}" if not job_id.isprintable()
        else f"attempt id {attempt_id!r}" if not _ATTEMPT_ID.fullmatch(attempt_id)
        else f"log name {json_name!r}" if not _plain_name(json_name)
        else f"segment {segment_id}" if segment_id < -1
        else None
    )  # fmt: skip
    if problem is not None:
        raise RingError(f"its header is no run's: {problem}")
    return Header(
        rank=rank, pid=pid, flags=flags, perf0=perf0, wall0=wall0, created=created, finished_step=finished,
        written_step=written, unsent_from=unsent_from, attempt=attempt, job_id=job_id, attempt_id=attempt_id, json_name=json_name,
        segment=SegmentRef(segment_id, token, boot, namespace, (device, inode)),
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


class NotItsSegment(Exception):
    """The segment a ring's header names cannot be taken as its own: the message says why."""


class Held(NamedTuple):
    """A ring's segment, read: its bytes and what they hold."""

    data: bytes
    contents: RingContents


def segment_of(header: Header, file: os.stat_result) -> Held | None:
    """What the segment named by `header` (of the ring whose open file is `file`) holds; None
    where it names none here (none at all, or one of another host, boot or IPC namespace:
    the file is all there is). NotItsSegment when the segment named here is gone or is not
    the ring's: another owner or creator than the file's owner, open to others, another
    size, another token or header, or the file is a copy of the ring that named it. (Not
    its creator's pid, which another PID namespace, a restarted container's, sees as 0;
    nor whether a process is attached: readers attach too, and the ring's lock says
    whether its writer lives.)"""
    ref = header.segment
    if ref.id < 0 or (ref.boot, ref.namespace) != shm.namespace():
        return None
    if ref.file != (file.st_dev, file.st_ino):
        raise NotItsSegment(f"segment {ref.id} is the ring's this file was copied from")
    try:
        info = shm.stat(ref.id)
    except OSError as exc:
        raise NotItsSegment(f"segment {ref.id} is gone or not ours to read ({exc.strerror})") from None
    problem = (
        f"owned by uid {info.uid}, created by uid {info.cuid}, not the file's {file.st_uid}"
        if not info.uid == info.cuid == file.st_uid
        else f"mode {info.mode:o}: others may use it" if info.mode != 0o600
        else f"{info.size} bytes" if info.size != FILE_BYTES
        else None
    )  # fmt: skip
    if problem is None:
        try:
            data = shm.read(ref.id, FILE_BYTES)
        except OSError as exc:
            raise NotItsSegment(f"segment {ref.id} cannot be read ({exc.strerror})") from None
        try:
            contents = parse_ring(data)
        except RingError as exc:
            problem = str(exc)
        else:
            steps = dataclasses.replace(
                contents.header,
                finished_step=header.finished_step,
                written_step=header.written_step,
                unsent_from=header.unsent_from,
            )
            if steps == header:
                return Held(data, contents)
            problem = "its header is another ring's"
    raise NotItsSegment(f"segment {ref.id} is not this ring's: {problem}")


def fold(fd: int, held: Held) -> None:
    """A dead run's segment into its ring's file (open at `fd`), then removed: the file holds
    the ring whole and names no segment. A death half way leaves the segment named and there."""
    os.pwrite(fd, held.data, 0)
    shm.remove(held.contents.header.segment.id)
    os.pwrite(fd, _NO_SEGMENT, SEGMENT_OFFSET)


__all__ = [
    "FILE_BYTES", "FINISHED_OFFSET", "FORMAT_VERSION", "Header", "Held", "MAX_STEP", "NotItsSegment", "READINGS",
    "RingContents", "RingError", "RingWriter", "SEGMENT_OFFSET", "SLOT_FIELDS", "SUFFIX", "SegmentRef", "Slot", "UNSENT_OFFSET",
    "WRITTEN_OFFSET",
    "fold", "name_parts", "parse_header", "parse_ring", "ring_name", "rings_beside", "segment_of",
]  # fmt: skip
