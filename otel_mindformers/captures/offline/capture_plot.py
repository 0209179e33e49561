"""A PNG timeline of a capture's profiler trace: one lane per operator, the profiled steps
shaded and named (`otel-mindformers capture --plot OUT.png DIR`); the trace is read by
profile_trace.py. The full trace opens in chrome://tracing, Perfetto (ui.perfetto.dev) and
MindStudio Insight.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

from otel_mindformers.captures.offline.profile_trace import short_name, trace_operators


def plot_capture(manifest: dict[str, Any], trace: Path, output: str | Path) -> Path:
    ops = trace_operators(trace)
    windows = manifest.get("step_windows_ns") or []
    origin = windows[0][1] if windows else (ops[0][0] if ops else 0)
    lanes: dict[str, int] = {}
    for _, _, name in ops:
        lanes.setdefault(short_name(name), len(lanes))
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
        lane, left = lanes[short_name(name)], (start - origin) / 1e6
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
