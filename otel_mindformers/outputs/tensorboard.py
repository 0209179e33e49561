"""`tensorboard`: scalars under `<tensorboard_path>/rank_<x>/`, one tag per metric."""

from __future__ import annotations

from pathlib import Path

from otel_mindformers.identity import Identity
from otel_mindformers.record import StepRecord


def rank_dir(tensorboard_path: str, identity: Identity) -> Path:
    return Path(tensorboard_path) / f"rank_{identity.rank}"


class TensorBoardSink:
    name = "tensorboard"

    def __init__(self, logdir: Path) -> None:
        from tensorboardX import SummaryWriter

        self.logdir = logdir
        self._writer = SummaryWriter(logdir=str(logdir))

    def write(self, record: StepRecord) -> None:
        for name, value in record.values.items():
            self._writer.add_scalar(name, float(value), record.step, walltime=record.time_stamp)
        for name, value in record.device.items():
            self._writer.add_scalar(f"device/{name}", value, record.step, walltime=record.time_stamp)

    def close(self) -> None:
        self._writer.close()
