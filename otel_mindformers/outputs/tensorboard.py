"""`tensorboard`: scalars under `<tensorboard_path>/rank_<x>/`, one tag per metric.

With `log_rotation.tensorboard_max_files`, the rank folder keeps at most that many event
files: the oldest go when a new one starts (at start-up, and past `log_rotation.max_bytes`).
"""

from __future__ import annotations

import itertools
import os
from pathlib import Path

from otel_mindformers.config import LogRotationConfig
from otel_mindformers.identity import Identity
from otel_mindformers.record import StepRecord

# tensorboardX names event files by the second: a per-process sequence number in the
# suffix keeps two files started within one second apart.
_event_file_numbers = itertools.count(1)


def rank_dir(tensorboard_path: str, identity: Identity) -> Path:
    return Path(tensorboard_path) / f"rank_{identity.rank}"


class TensorBoardSink:
    name = "tensorboard"

    def __init__(self, logdir: Path, rotation: LogRotationConfig | None = None) -> None:
        self.logdir = logdir
        self._rotation = rotation or LogRotationConfig()
        self._open_event_file()

    def _open_event_file(self) -> None:
        from tensorboardX import SummaryWriter

        if self._rotation.tensorboard_max_files:
            self._prune(keep=self._rotation.tensorboard_max_files - 1)
        suffix = f".{os.getpid()}.{next(_event_file_numbers)}"
        self._writer = SummaryWriter(logdir=str(self.logdir), filename_suffix=suffix)
        self._event_file = next(self.logdir.glob(f"events.out.tfevents.*{suffix}"))

    def _prune(self, keep: int) -> None:
        files = sorted(self.logdir.glob("events.out.tfevents.*"), key=lambda p: p.stat().st_mtime)
        for old in files[: max(0, len(files) - keep)]:
            old.unlink(missing_ok=True)

    def _roll_over_if_full(self) -> None:
        rotation = self._rotation
        if rotation.tensorboard_max_files and 0 < rotation.max_bytes < self._event_file.stat().st_size:
            self._writer.close()
            self._open_event_file()

    def write(self, record: StepRecord) -> None:
        for name, value in record.values.items():
            self._writer.add_scalar(name, float(value), record.step, walltime=record.time_stamp)
        for name, value in record.device.items():
            self._writer.add_scalar(f"device/{name}", value, record.step, walltime=record.time_stamp)
        self._roll_over_if_full()

    def close(self) -> None:
        self._writer.close()
