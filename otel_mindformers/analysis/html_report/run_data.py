"""What the page is built from: exactly what `report --json` reads and says, plus each
rank's series for the charts, in one pass over the logs.

`PageStats` is the report's running summary (`SeriesStats`) that also keeps, per rank, the
steps and values the charts draw (16 bytes a value); the report is then made from the same
sinks (`report_scanned`), so every number the page shows is the JSON report's.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from otel_mindformers.analysis.report import Report, SeriesStats, json_body, read_job, report_scanned
from otel_mindformers.captures import store
from otel_mindformers.names import training as tm
from otel_mindformers.outputs.jsonl_reader import Scanned, StepPoint, scan_logs

# The training values drawn against the step, in the order the page shows them.
CURVES = (tm.LOSS, tm.LEARNING_RATE, tm.GRAD_NORM, tm.STEP_TIME, tm.SAMPLES_PER_SECOND, tm.TOKENS_PER_SECOND, tm.MFU)
# Device readings drawn against time: the JSON keys of the device sources' snapshots
# (devices/ascend.py, nvidia.py, mindspore_memory.py, host.py), with a title and unit each.
DEVICE_READINGS: tuple[tuple[str, str, str], ...] = (
    ("npu_utilization", "NPU AI-core utilisation", "%"),
    ("npu_hbm_used_mb", "NPU HBM used", "MB"),
    ("npu_temperature_c", "NPU temperature", "°C"),
    ("npu_power_w", "NPU power", "W"),
    ("gpu_utilization", "GPU utilisation", "%"),
    ("gpu_memory_used_mb", "GPU memory used", "MB"),
    ("gpu_temperature_c", "GPU temperature", "°C"),
    ("gpu_power_w", "GPU power", "W"),
    ("device_memory_allocated_mb", "Device memory allocated (MindSpore)", "MB"),
    ("host_rss_mb", "Process resident memory (host)", "MB"),
    ("host_memory_percent", "Host memory used", "%"),
)
_CURVE_KEYS = frozenset(CURVES)
_DEVICE_KEYS = frozenset(key for key, _, _ in DEVICE_READINGS)


class Column:
    """One value's points in a series, in the order they were logged: x and y."""

    __slots__ = ("xs", "ys")

    def __init__(self) -> None:
        self.xs = array("d")
        self.ys = array("d")


class PageStats(SeriesStats):
    """The report's summary of a series, and the points its charts draw: the training
    values by step, device readings by time stamp, and (kept by `SeriesStats`) the
    sampled windows' sections."""

    def __init__(self) -> None:
        super().__init__()
        self.curves: dict[str, Column] = {}
        self.devices: dict[str, Column] = {}

    def add(self, point: StepPoint) -> None:
        super().add(point)
        stamp = point.time_stamp
        for key, value in point.values.items():
            if key in _CURVE_KEYS:  # NaN (non-finite) is kept: a gap in the line
                column = self.curves.get(key)
                if column is None:
                    column = self.curves[key] = Column()
                column.xs.append(point.step)
                column.ys.append(value)
            elif key in _DEVICE_KEYS and stamp is not None and math.isfinite(value):
                column = self.devices.get(key)
                if column is None:
                    column = self.devices[key] = Column()
                column.xs.append(stamp)
                column.ys.append(value)


@dataclass
class RunData:
    """The page's input: the report and its JSON body (the job and captures included when
    `report --json` would include them), and every series as read."""

    report: Report
    body: dict[str, Any]  # what `report --json` prints
    job: dict[str, Any] | None
    captures: list[dict[str, Any]] | None  # with `--captures DIR`
    series: list[Scanned[PageStats]]

    @property
    def first_time_stamp(self) -> float | None:
        stamps = [one.sink.first_stamp for one in self.series if one.sink.first_stamp is not None]
        return min(stamps) if stamps else None


def read_run(
    inputs: Sequence[str | Path], straggler_threshold: float, captures_dir: str | Path | None = None
) -> RunData:
    """Read the logs once: `report`'s loading path, so bad input fails the same way (one
    `AnalysisError` naming the file and why)."""
    series = scan_logs(inputs, PageStats, one_run_per_folder=True)
    report = report_scanned(series, straggler_threshold)
    job = read_job(report, inputs)
    body = json_body(report)
    if job is not None:
        body["job"] = job
    captures = store.list_captures(captures_dir) if captures_dir is not None else None
    if captures is not None:
        body["captures"] = captures
    return RunData(report, body, job, captures, series)


__all__ = ["CURVES", "DEVICE_READINGS", "Column", "PageStats", "RunData", "read_run"]
