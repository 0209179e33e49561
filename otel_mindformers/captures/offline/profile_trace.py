"""A capture's profiler trace read back: the operators MindSpore's analysis wrote into
trace_view.json. No plotting library: `capture --plot` (capture_plot.py) and the HTML page
(analysis/html_report/) both draw from it.

trace_view.json carries no step markers; its operators' `ts` are wall-clock µs, matched
against the manifest's `step_windows_ns` (time.time_ns() at each step end).
"""

from __future__ import annotations

import json
from pathlib import Path

CPU_OP = "CPU OP"


def trace_operators(trace: Path) -> list[tuple[int, int, str]]:
    """(start ns, duration ns, name) of the operators in the trace's "CPU OP" process."""
    events = json.loads(trace.read_text(encoding="utf-8"))
    pids = {e.get("pid") for e in events if e.get("ph") == "M" and e.get("args", {}).get("name") == CPU_OP}
    return sorted(
        (int(float(e["ts"]) * 1000), int(float(e["dur"]) * 1000), str(e["name"]))
        for e in events
        if e.get("ph") == "X" and e.get("pid") in pids
    )


def short_name(name: str) -> str:
    """An operator's leaf name, at most 28 characters."""
    leaf = name.rsplit("/", 1)[-1]  # GRAPH mode: Default/network-WithLossCell/.../MatMul-op0
    return leaf if len(leaf) <= 28 else leaf[:27] + "…"


__all__ = ["CPU_OP", "short_name", "trace_operators"]
