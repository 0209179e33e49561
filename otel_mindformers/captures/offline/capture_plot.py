"""A PNG timeline of a capture's profiler trace: one lane per operator, the profiled steps
shaded and named (`otel-mindformers capture --plot OUT.png DIR`).

trace_view.json carries no step markers; its operators' `ts` are wall-clock µs, matched
against the manifest's `step_windows_ns` (time.time_ns() at each step end). The full trace
opens in chrome://tracing, Perfetto (ui.perfetto.dev) and MindStudio Insight.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

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


def _short(name: str) -> str:
    leaf = name.rsplit("/", 1)[-1]  # GRAPH mode: Default/network-WithLossCell/.../MatMul-op0
    return leaf if len(leaf) <= 28 else leaf[:27] + "…"


def plot_capture(manifest: dict[str, Any], trace: Path, output: str | Path) -> Path:
    ops = trace_operators(trace)
    windows = manifest.get("step_windows_ns") or []
    origin = windows[0][1] if windows else (ops[0][0] if ops else 0)
    lanes: dict[str, int] = {}
    for _, _, name in ops:
        lanes.setdefault(_short(name), len(lanes))
    figure = Figure(figsize=(14, max(3.0, 0.28 * len(lanes) + 1.6)), dpi=110)
    axes = figure.subplots()
    for index, (step, start, end) in enumerate(windows):
        left, right = (start - origin) / 1e6, (end - origin) / 1e6
        inside = [(s, d) for s, d, _ in ops if start <= s < end]
        busy = sum(d for _, d in inside) / 1e6
        axes.axvspan(left, right, color="#dde8f5" if index % 2 == 0 else "#eef3fa", zorder=0)
        axes.text(
            (left + right) / 2,
            -0.6,
            f"step {step}\n{len(inside)} ops, {busy:.2f} ms",
            ha="center",
            va="bottom",
            fontsize=8,
        )
    # Operators often last microseconds in a step of milliseconds: each is drawn as a tick at
    # its start, and as a bar as long as it ran.
    for start, duration, name in ops:
        lane, left = lanes[_short(name)], (start - origin) / 1e6
        axes.plot([left], [lane], marker="|", markersize=9, color="#c0392b", linestyle="none")
        axes.barh(lane, duration / 1e6, left=left, height=0.6, color="#c0392b")
    axes.set_yticks(range(len(lanes)), list(lanes), fontsize=7)
    axes.set_ylim(-1.6, len(lanes))
    axes.invert_yaxis()
    axes.set_xlabel("ms since the first profiled step began")
    axes.set_title(
        f"capture: {manifest.get('trigger')} at step {manifest.get('step')} (rank {manifest.get('rank')}) - "
        f"{len(ops)} CPU operators in steps {manifest.get('first_step')}-{manifest.get('last_step')}",
        fontsize=10,
    )
    figure.tight_layout()
    output = Path(output)
    figure.savefig(output)
    return output
