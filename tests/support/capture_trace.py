"""Reading a capture back: its manifest, and the operators of its profiler trace by step.

trace_view.json has no step markers: its `ts` (µs, as strings) are wall-clock Unix time, so
an operator belongs to the step whose window (the manifest's `step_windows_ns`, taken with
time.time_ns() at each step end) holds its start.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

CPU_OP = "CPU OP"


def manifest(folder: str | Path) -> dict[str, Any]:
    return json.loads((Path(folder) / "capture.json").read_text())


def wait_for_trace(folder: str | Path, timeout: float = 120.0) -> Path:
    """The analysed trace of a capture (the analysis runs in a process of its own)."""
    deadline = time.monotonic() + timeout
    while True:
        found = sorted(Path(folder).glob("profile/*_ascend_ms/ASCEND_PROFILER_OUTPUT/trace_view.json"))
        if found:
            try:
                json.loads(found[0].read_text())
                return found[0]
            except ValueError:  # still being written
                pass
        if time.monotonic() > deadline:
            raise AssertionError(f"no trace_view.json under {folder} after {timeout} s")
        time.sleep(0.2)


def cpu_ops(trace: str | Path) -> list[tuple[int, int, str]]:
    """(start ns, end ns, name) of every operator in the trace's "CPU OP" process."""
    events = json.loads(Path(trace).read_text())
    pids = {e["pid"] for e in events if e.get("ph") == "M" and e.get("args", {}).get("name") == CPU_OP}
    ops = []
    for event in events:
        if event.get("ph") == "X" and event.get("pid") in pids:
            start = int(float(event["ts"]) * 1000)
            ops.append((start, start + int(float(event["dur"]) * 1000), event["name"]))
    return sorted(ops)


def ops_by_step(trace: str | Path, windows: list[list[int]]) -> tuple[dict[int, list[str]], int]:
    """Operator names per step of the windows [[step, start ns, end ns], ...], and how many
    operators fell in no window."""
    by_step: dict[int, list[str]] = {step: [] for step, _, _ in windows}
    outside = 0
    for start, _end, name in cpu_ops(trace):
        for step, begin, end in windows:
            if begin <= start < end:
                by_step[step].append(name)
                break
        else:
            outside += 1
    return by_step, outside
