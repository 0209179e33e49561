"""Hangs: a rank that stops making progress, and what it was doing.

Live: `heartbeat_gauges.Heartbeat` (observable step/time gauges per rank, read from the run's
clock on the metric reader's thread), `stall_watchdog.StallWatchdog` (no step for
`stall_timeout` seconds), `dumps.StackDumper` / `dump_stacks(reason)` (every thread's stack
on a stall, SIGUSR1 or demand, via `stacks.py` and `signals.py`), and the per-rank
diagnosis file they write (`diagnosis_file.py`, shared with `nonfinite/`).
Offline (`offline/`): `otel-mindformers hang-report` and the diagnosis records' schema.
See docs/hangs.md.
"""

import importlib
from typing import Any

# Loaded on first use: semconv reads `names.diagnosis`, and importing the dumper here would
# import identity (which imports semconv) while semconv is still loading.
_EXPORTS = {
    "StackDumper": "otel_mindformers.hangs.dumps",
    "dump_stacks": "otel_mindformers.hangs.dumps",
    "Heartbeat": "otel_mindformers.hangs.heartbeat_gauges",
}


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'otel_mindformers.hangs' has no attribute {name!r}")


__all__ = ["Heartbeat", "StackDumper", "dump_stacks"]
