"""`tensorboard`: scalars under `<tensorboard_path>/rank_<x>/`, one tag per metric.

Events are written synchronously on the pipeline's worker thread (tensorboardX's
`EventsWriter`), not through `SummaryWriter`: its own writer thread dies on a disk error,
after which every write and its exit handler block forever on a full queue. Here a disk
error raises (outputs/sink.py says it once, naming the file), and the next batch starts a
new event file: what the failed one holds past its last whole event is never appended to.
A new file that fails too is removed, so a disk that stays full gathers no empty files.
An event file removed while the run writes it (`rm -rf` of the folder) would take every
later event with it, unseen: the next batch finds it gone, says so once and starts a new one.

With `log_rotation.tensorboard_max_files`, the rank folder keeps at most that many event
files: the oldest go when a new one starts (at start-up, and past `log_rotation.max_bytes`).

One run per rank folder (outputs/runs.py): a new run moves the previous run's event files
into a subfolder named when it last wrote (`rank_0/20261105-101530/`, its own run in
TensorBoard's list); a resumed run writes on in the folder, starting with TensorBoard's
restart marker (a `SessionLog.START` at its first step, what `SummaryWriter(purge_step=)`
writes), so the steps the earlier attempt logged past the checkpoint are not shown twice.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import time
from collections.abc import Sequence
from pathlib import Path

from otel_mindformers.config import LogRotationConfig
from otel_mindformers.core.guarded_log import get_logger
from otel_mindformers.core.step_record import StepRecord
from otel_mindformers.job.identity import Identity
from otel_mindformers.outputs.event_bytes import scalar_event
from otel_mindformers.outputs.runs import free_name, stamp

_EVENT_FILES = "events.out.tfevents.*"
_logger = get_logger(__name__)

# tensorboardX names event files by the second: a per-process sequence number in the
# suffix keeps two files started within one second apart.
_event_file_numbers = itertools.count(1)

# TFRecord framing around each event: length (8 bytes) and two CRCs (4 bytes each).
_RECORD_FRAMING = 16


def rank_dir(tensorboard_path: str, identity: Identity) -> Path:
    return Path(tensorboard_path) / f"rank_{identity.rank}"


def set_previous_run_aside(logdir: Path) -> Path | None:
    """Move the event files a previous run left in `logdir` into `logdir/<when it last
    wrote>/`; that folder, or None if there were none. A failure is one warning: the run
    then writes beside them."""
    try:
        files = [p for p in logdir.glob(_EVENT_FILES) if p.is_file()]
        if not files:
            return None
        target = free_name(lambda when: logdir / when, stamp(max(p.stat().st_mtime for p in files)))
        target.mkdir()
        for path in files:
            os.replace(path, target / path.name)
    except OSError as exc:
        _logger.warning(
            "otel_mindformers: cannot move the previous run's event files in %s aside (%s)", logdir, exc.strerror
        )
        return None
    return target


class TensorBoardSink:
    name = "tensorboard"

    def __init__(
        self, logdir: Path, rotation: LogRotationConfig | None = None, purge_from_step: int | None = None
    ) -> None:
        """`purge_from_step`: a resumed run's first step; TensorBoard then hides what earlier
        event files hold from that step on."""
        self.logdir = logdir
        self._rotation = rotation or LogRotationConfig()
        self._failed = False  # the last write raised: its event file may end mid-event
        self._said_removed = False
        self._open_event_file()
        if purge_from_step is not None:
            self.mark_restart(purge_from_step)

    def mark_restart(self, step: int) -> None:
        """TensorBoard's restart marker (`SessionLog.START` at `step`, what
        `SummaryWriter(purge_step=)` writes): what earlier events hold from `step` on is hidden."""
        from tensorboardX.proto.event_pb2 import Event, SessionLog

        self._writer.write_event(
            Event(wall_time=time.time(), step=step, session_log=SessionLog(status=SessionLog.START))
        )

    def _open_event_file(self) -> None:
        from tensorboardX.event_file_writer import EventsWriter

        if self._rotation.tensorboard_max_files:
            self._prune(keep=self._rotation.tensorboard_max_files - 1)
        suffix = f".{os.getpid()}.{next(_event_file_numbers)}"
        self.logdir.mkdir(parents=True, exist_ok=True)
        self._writer = EventsWriter(str(self.logdir / "events"), filename_suffix=suffix)
        self._event_file = next(self.logdir.glob(f"events.out.tfevents.*{suffix}"))
        # Bytes handed to the writer: the file on disk lags behind until the next flush.
        self._written = self._event_file.stat().st_size

    def _prune(self, keep: int) -> None:
        files = sorted(self.logdir.glob(_EVENT_FILES), key=lambda p: p.stat().st_mtime)
        for old in files[: max(0, len(files) - keep)]:
            old.unlink(missing_ok=True)

    def _roll_over_if_full(self) -> None:
        rotation = self._rotation
        if rotation.tensorboard_max_files and 0 < rotation.max_bytes < self._written:
            self._writer.close()
            self._open_event_file()

    def write(self, records: Sequence[StepRecord]) -> None:
        new_file = None
        try:
            if self._failed or not self._event_file.exists():  # one stat per batch
                self._start_again()
                new_file = self._event_file
            for record in records:
                self._write_record(record)
            # Every batch reaches the file (the page cache): the flight ring's mark of what
            # the outputs wrote (flight_recorder/) then holds for TensorBoard too, and a kill
            # loses no event the ring does not keep. One write per batch, on the worker.
            self._writer.flush()
        except OSError as exc:
            self._failed = True
            if new_file is not None:  # a new file on a disk still full: leave none behind
                with contextlib.suppress(OSError):
                    new_file.unlink()
            raise OSError(f"cannot write {self._event_file}: {exc.strerror}") from exc
        self._failed = False

    def _start_again(self) -> None:
        """A new event file, after a failed write or with the current one removed."""
        if not self._failed and not self._said_removed:
            self._said_removed = True
            _logger.warning(
                "otel_mindformers: the TensorBoard event file %s was removed while the run wrote it; "
                "the run writes on in a new one", self._event_file,
            )  # fmt: skip
        with contextlib.suppress(OSError, ValueError):  # what it had not flushed goes with it; closed already
            self._writer.close()
        self._open_event_file()

    def _write_record(self, record: StepRecord) -> None:
        scalars = [(name, float(value)) for name, value in record.values.items()]
        scalars += [(f"device/{name}", float(value)) for name, value in record.device.items()]
        if record.model_state:
            scalars += [(tag, float(value)) for tag, value in record.model_state.scalars()]
        # The bytes tensorboardX's Event would serialize to, at a tenth of its CPU (event_bytes.py).
        event = scalar_event(record.time_stamp, record.step, scalars)
        # Checked before writing, so a new file starts only when a record is there for it.
        self._roll_over_if_full()
        self._write_serialized(event)
        self._written += len(event) + _RECORD_FRAMING

    def _write_serialized(self, event: bytes) -> None:
        write = getattr(self._writer, "_write_serialized_event", None)
        if write is not None:
            write(event)
        else:  # a tensorboardX without it: through its Event (the same bytes, slower)
            from tensorboardX.proto.event_pb2 import Event

            self._writer.write_event(Event.FromString(event))

    def close(self) -> None:
        try:
            self._writer.close()  # flushes what is buffered: a full disk shows here too
        except OSError as exc:
            raise OSError(f"cannot write {self._event_file}: {exc.strerror}") from exc
