"""`stdout`: one compact line per sampled step."""

from __future__ import annotations

import sys
from typing import TextIO

from otel_mindformers import record as rec
from otel_mindformers.record import StepRecord

_FORMATS = {
    rec.LOSS: ("loss", "{:.4f}"),
    rec.LEARNING_RATE: ("lr", "{:.3e}"),
    rec.GRAD_NORM: ("grad_norm", "{:.4f}"),
    rec.STEP_TIME: ("step_time", "{:.1f}ms"),
    rec.SAMPLES_PER_SECOND: ("samples/s", "{:.1f}"),
    rec.TOKENS_PER_SECOND: ("tokens/s", "{:.0f}"),
    rec.LOSS_SCALE: ("scale", "{:g}"),
}


def format_line(record: StepRecord) -> str:
    parts = [f"[otel_mindformers] rank {record.rank} epoch {record.epoch} step {record.step}"]
    for name, value in record.ordered_values():
        if name == rec.OVERFLOW:
            parts.append(f"overflow {'YES' if value else 'no'}")
        elif name in _FORMATS:
            label, fmt = _FORMATS[name]
            parts.append(f"{label} {fmt.format(value)}")
    parts.extend(f"{key} {value:g}" for key, value in record.device.items())
    return " | ".join(parts)


class StdoutSink:
    name = "stdout"

    def __init__(self, stream: TextIO | None = None) -> None:
        self._stream = stream

    def write(self, record: StepRecord) -> None:
        stream = self._stream or sys.stdout
        stream.write(format_line(record) + "\n")
        stream.flush()

    def close(self) -> None:
        pass
