"""`stdout`: one compact line per sampled step, labelled and formatted by the metric table."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import TextIO

from otel_mindformers.core.step_record import StepRecord
from otel_mindformers.names.training import BY_KEY


def format_line(record: StepRecord) -> str:
    parts = [f"[otel_mindformers] rank {record.rank} epoch {record.epoch} step {record.step}"]
    for key, value in record.ordered_values():
        row = BY_KEY.get(key)
        if row is not None:
            parts.append(f"{row.stdout_label} {row.stdout_format(value)}")
    if record.model_state:
        parts.extend(record.model_state.stdout_parts())  # aggregates only, never per parameter
    parts.extend(f"{key} {value:g}" for key, value in record.device.items())
    return " | ".join(parts)


class StdoutSink:
    name = "stdout"

    def __init__(self, stream: TextIO | None = None) -> None:
        self._stream = stream

    def write(self, records: Sequence[StepRecord]) -> None:
        stream = self._stream or sys.stdout
        stream.write("".join([format_line(record) + "\n" for record in records]))
        stream.flush()

    def close(self) -> None:
        pass
