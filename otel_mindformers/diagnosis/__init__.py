"""Diagnosing a job that hangs or goes bad: heartbeats, stack dumps, the first bad rank.

- `Heartbeat.start(observables, progress, point_attributes)`: observable step/time gauges per rank;
- `StackDumper` / `dump_stacks(reason)`: every thread's stack on stall, SIGUSR1 or demand;
- `FirstNonFinite`: the run's first NaN/Inf on a rank (`nonfinite_check: all_ranks`);
- `hang_report`: the `otel-mindformers hang-report` command. See docs/hangs.md.
"""

import importlib
from typing import Any

# Loaded on first use: semconv reads `diagnosis.names`, and importing the dumper here would
# import identity (which imports semconv) while semconv is still loading.
_EXPORTS = {
    "StackDumper": "otel_mindformers.diagnosis.dumps",
    "dump_stacks": "otel_mindformers.diagnosis.dumps",
    "Heartbeat": "otel_mindformers.diagnosis.heartbeat",
    "FirstNonFinite": "otel_mindformers.diagnosis.nonfinite",
}


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'otel_mindformers.diagnosis' has no attribute {name!r}")


__all__ = ["FirstNonFinite", "Heartbeat", "StackDumper", "dump_stacks"]
