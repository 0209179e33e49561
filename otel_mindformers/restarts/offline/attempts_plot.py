"""`otel-mindformers plot --attempts`: a job's attempts as bars on a time axis.

One row per attempt, seconds since the job's first attempt began on the x axis. Each bar
is the attempt's time in the order it was spent: start-up, checkpoint load, compile (the
first step), productive steps, then what sat between them as totals (the wait for data,
evaluations, user phases, checkpoint saves), lost steps (computed again by the next attempt: the last ones), and the tail
after the last step. The downtime before an attempt (no process) is drawn on its row,
hatched, from the previous attempt's end.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from matplotlib.figure import Figure
from matplotlib.patches import Patch

DPI = 100
# (category, label, colour), in the order an attempt spends its time.
SEGMENTS: tuple[tuple[str, str, str], ...] = (
    ("startup", "start-up", "#9ecae1"),
    ("checkpoint_load", "checkpoint load", "#6a51a3"),
    ("compile", "compile (first step)", "#fdae6b"),
    ("productive", "productive", "#31a354"),
    ("data_wait", "waiting for data", "#fdd0a2"),
    ("evaluation", "evaluation", "#9e9ac8"),
    ("user_phases", "user phases", "#c7e9c0"),
    ("checkpoint_save", "checkpoint save", "#3182bd"),
    ("lost_progress", "lost (recomputed)", "#de2d26"),
    ("other", "after the last step", "#bdbdbd"),
)
DOWNTIME = ("no_process", "between attempts (no process)", "#636363")
OUTCOME_MARK = {"completed": "✓", "stopped": "■", "crashed": "✗", "killed": "☠", "running": "…"}


def plot_attempts(
    job: dict[str, Any], output: str | Path, *, size: tuple[int, int] = (1600, 600), title: str | None = None
) -> Path:
    """Write the attempts figure of `job` (restarts/offline/attempts_report.py `job_report`) to `output`."""
    output = Path(output)
    attempts_figure(job, size=size, title=title).savefig(output)
    return output


def attempts_figure(job: dict[str, Any], *, size: tuple[int, int] = (1600, 600), title: str | None = None) -> Figure:
    """The attempts figure of `job`: one axes, each attempt's bar its categories in order."""
    attempts = job["attempts"]
    origin = min(row["start"] for row in attempts)
    height = max(size[1], 160 + 70 * len(attempts))
    figure = Figure(figsize=(size[0] / DPI, height / DPI), dpi=DPI)
    axes = figure.add_subplot(1, 1, 1)
    previous_end: float | None = None
    for index, row in enumerate(attempts):
        y = len(attempts) - index
        if previous_end is not None and row["start"] > previous_end:
            axes.barh(
                y, row["start"] - previous_end, left=previous_end - origin, height=0.5,
                color="white", edgecolor=DOWNTIME[2], hatch="//",
            )  # fmt: skip
        left = row["start"] - origin
        for key, _label, colour in SEGMENTS:
            seconds = row["seconds"].get(key, 0.0)
            if seconds > 0:
                axes.barh(y, seconds, left=left, height=0.5, color=colour)
                left += seconds
        mark = OUTCOME_MARK.get(row["outcome"], "?")
        axes.text(
            row["end"] - origin, y, f"  {mark} {row['outcome']} at step {row['last_step']}"
            + (f", {row['lost_steps']} lost" if row["lost_steps"] else ""),
            va="center", fontsize=10,
        )  # fmt: skip
        previous_end = row["end"]
    labels = [
        f"attempt {row['attempt']}\n({len(row['ranks'])} rank{'s' if len(row['ranks']) > 1 else ''})"
        for row in attempts
    ]
    axes.set_yticks(range(len(attempts), 0, -1), labels)
    axes.set_xlabel("seconds since the job's first attempt began")
    end = max(row["end"] for row in attempts) - origin
    axes.set_xlim(0, end * 1.25 if end > 0 else 1)
    axes.set_ylim(0.3, len(attempts) + 0.7)
    axes.grid(axis="x", alpha=0.3)
    handles = [Patch(color=colour, label=label) for _key, label, colour in SEGMENTS]
    handles.append(Patch(facecolor="white", edgecolor=DOWNTIME[2], hatch="//", label=DOWNTIME[1]))
    axes.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.15), ncol=4, frameon=False)
    totals = job["totals"]
    goodput = totals["goodput"]
    summary = (
        f"job {job['job_id']}: goodput {'-' if goodput is None else f'{goodput:.1%}'}, "
        f"{totals['lost_steps']} steps lost, {totals['downtime_seconds']:.1f} s downtime"
    )
    axes.set_title(title or summary)
    figure.tight_layout()
    return figure


__all__ = ["attempts_figure", "plot_attempts"]
