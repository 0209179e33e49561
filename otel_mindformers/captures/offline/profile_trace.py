"""A capture's profiler trace read back: the operators MindSpore's analysis wrote into
trace_view.json. No plotting library: `capture --plot` (capture_plot.py) and the HTML page
(analysis/html_report/) both draw from it.

trace_view.json carries no step markers; its operators' `ts` are wall-clock µs, matched
against the manifest's `step_windows_ns` (time.time_ns() at each step end).

The file is read as Chrome's trace format allows it: a list of events, or an object with
its `traceEvents`. An event that is not an operator with a finite start and duration is
left out; a file that is not such a trace at all (not JSON, nested too deep to read, another
shape) is one `TraceError` naming the file and why, never a traceback.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

CPU_OP = "CPU OP"


class TraceError(ValueError):
    """The trace cannot be read as a trace: the message names the file and why."""


def trace_operators(trace: Path) -> list[tuple[int, int, str]]:
    """(start ns, duration ns, name) of the operators in the trace's "CPU OP" process.
    Raises OSError (the file cannot be read) or TraceError (it is not a trace)."""
    text = trace.read_text(encoding="utf-8", errors="replace")
    try:
        loaded = json.loads(text)
    except RecursionError:
        raise TraceError(f"{trace}: not a trace (JSON nested too deep to read)") from None
    except ValueError as exc:
        raise TraceError(f"{trace}: not a trace (not JSON: {exc})") from None
    events = loaded.get("traceEvents") if isinstance(loaded, dict) else loaded
    if not isinstance(events, list):
        raise TraceError(f"{trace}: not a trace (neither a list of events nor an object with `traceEvents`)")
    events = [e for e in events if isinstance(e, dict)]
    pids = {_key(e.get("pid")) for e in events if e.get("ph") == "M" and _name_arg(e) == CPU_OP}
    found = []
    for event in events:
        if event.get("ph") != "X" or _key(event.get("pid")) not in pids:
            continue
        start, duration = _ns(event.get("ts")), _ns(event.get("dur"))
        if start is not None and duration is not None and duration >= 0:
            found.append((start, duration, str(event.get("name"))))
    return sorted(found)


def _key(value: Any) -> Any:
    """A pid as a set member: a list or an object (a malformed trace) is no pid."""
    return value if isinstance(value, (str, int, float)) else None


def _name_arg(event: dict[str, Any]) -> Any:
    args = event.get("args")
    return args.get("name") if isinstance(args, dict) else None


def _ns(microseconds: Any) -> int | None:
    """µs (a number or its text) in integer ns; None when it is not a finite number."""
    if isinstance(microseconds, bool):
        return None
    try:
        value = float(microseconds) * 1000
    except (TypeError, ValueError, OverflowError):
        return None
    return int(value) if math.isfinite(value) else None


def short_name(name: str) -> str:
    """An operator's leaf name, at most 28 characters."""
    leaf = name.rsplit("/", 1)[-1]  # GRAPH mode: Default/network-WithLossCell/.../MatMul-op0
    return leaf if len(leaf) <= 28 else leaf[:27] + "…"


__all__ = ["CPU_OP", "TraceError", "short_name", "trace_operators"]
