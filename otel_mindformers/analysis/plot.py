"""`otel-mindformers plot`: loss, learning rate, grad norm and step time against step."""

from __future__ import annotations

import math
from pathlib import Path

# A bare Figure renders through Agg without pyplot: no display needed, and no global
# backend switch in the caller's process.
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from otel_mindformers.names import training as tm
from otel_mindformers.names.model_state import ADAM_V_NORM, GRAD_NORM
from otel_mindformers.outputs.jsonl_reader import Series, StepPoint

# (metric, title, y scale). Step time is on a log scale: the first step carries graph
# compilation and would otherwise flatten every later step, and stragglers, to the floor.
PANELS: tuple[tuple[str, str, str], ...] = (
    (tm.LOSS, "loss", "linear"),
    (tm.LEARNING_RATE, "learning rate", "linear"),
    (tm.GRAD_NORM, "grad norm", "linear"),
    (tm.STEP_TIME, "step time (ms, log scale)", "log"),
)
DEFAULT_SIZE = (1600, 1000)  # pixels
DPI = 100
NONFINITE_COLOR = "red"
ALERT_COLOR = "darkorange"


def ema(values: list[float], weight: float) -> list[float]:
    """Debiased exponential moving average (TensorBoard's smoothing); NaN stays a hole.

    Debiasing keeps the first points from being pulled towards zero.
    """
    out: list[float] = []
    accumulated, norm = 0.0, 0.0
    for value in values:
        if math.isnan(value):
            out.append(math.nan)
            continue
        accumulated = accumulated * weight + (1.0 - weight) * value
        norm = norm * weight + (1.0 - weight)
        out.append(accumulated / norm)
    return out


def plot(
    series: list[Series],
    output: str | Path,
    *,
    smoothing: float | None = None,
    size: tuple[int, int] = DEFAULT_SIZE,
    title: str | None = None,
) -> Path:
    """Write the four-panel figure to `output` (format from its suffix: .png, .svg, .pdf);
    logs with per-layer norms (model_state) get a fifth and sixth panel: the gradient and
    Adam v-norm per layer of the first series that has them."""
    output = Path(output)
    layered = next((one for one in series if any(p.model_state for p in one.points)), None)
    rows = 3 if layered is not None else 2
    fig = Figure(figsize=(size[0] / DPI, size[1] * rows / 2 / DPI), dpi=DPI)
    axes = fig.subplots(rows, 2, sharex=True)
    for ax, (metric, label, scale) in zip(axes.flat, PANELS):
        if _panel(ax, series, metric, label, smoothing):
            ax.set_yscale(scale)
            _widen_flat_range(ax)
    if layered is not None:
        for ax, family in zip(axes[2], (GRAD_NORM, ADAM_V_NORM)):
            _layer_panel(ax, layered, family)
    for ax in axes[-1]:
        ax.set_xlabel("step")
    fig.suptitle(title or "training run", y=0.99)
    fig.legend(
        handles=_legend_handles(series),
        loc="upper center",
        bbox_to_anchor=(0.5, 0.97),
        ncol=min(len(series) + 2, 8),
        fontsize="small",
        frameon=False,
    )
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    output.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(output)
    return output


def _panel(ax, series: list[Series], metric: str, label: str, smoothing: float | None) -> bool:
    """Draw one metric for every series; False when no series has it."""
    ax.set_title(label)
    ax.grid(True, alpha=0.3)
    drawn = False
    for index, one in enumerate(series):
        color = f"C{index % 10}"
        for segment in _segments(one.points):
            steps = [p.step for p in segment]
            values = [p.value(metric) for p in segment]
            if all(math.isnan(v) for v in values):
                continue
            drawn = True
            if smoothing is None:
                ax.plot(steps, values, color=color, linewidth=1.2)
            else:
                ax.plot(steps, values, color=color, linewidth=0.8, alpha=0.3)
                ax.plot(steps, ema(values, smoothing), color=color, linewidth=1.6)
        _mark_anomalies(ax, one)
    if not drawn:
        ax.text(0.5, 0.5, "no data", transform=ax.transAxes, ha="center", va="center", color="grey")
    return drawn


def _layer_panel(ax, one: Series, family: str) -> None:
    """One line per layer: `family`'s per-layer norm over the run (log scale)."""
    ax.set_title(f"{family} per layer ({one.label})")
    ax.grid(True, alpha=0.3)
    by_layer: dict[str, tuple[list[int], list[float]]] = {}
    for point in one.points:
        for layer, value in ((point.model_state or {}).get(family) or {}).get("layer", {}).items():
            if value is not None:
                steps, values = by_layer.setdefault(layer, ([], []))
                steps.append(point.step)
                values.append(value)
    if not by_layer:
        ax.text(0.5, 0.5, "no data", transform=ax.transAxes, ha="center", va="center", color="grey")
        return
    for index, layer in enumerate(sorted(by_layer, key=int)):
        steps, values = by_layer[layer]
        ax.plot(steps, values, color=f"C{index % 10}", linewidth=1.0, label=f"layer {layer}")
    ax.set_yscale("log")
    ax.legend(fontsize="x-small", ncol=max(1, len(by_layer) // 8), frameon=False)


def _widen_flat_range(ax) -> None:
    """A constant curve (a fixed learning rate) gets a ±10 % axis instead of matplotlib's
    ±1e-16 around it, which labels every tick with the value plus an offset."""
    low, high = ax.dataLim.intervaly
    if ax.get_yscale() == "linear" and math.isfinite(low) and high - low <= 1e-9 * max(abs(low), abs(high)):
        margin = abs(high) * 0.1 or 1.0
        ax.set_ylim(low - margin, high + margin)


def _segments(points: list[StepPoint]) -> list[list[StepPoint]]:
    """Split where the step number goes back (a restarted run), so no line jumps backwards."""
    segments: list[list[StepPoint]] = []
    for point in points:
        if not segments or point.step <= segments[-1][-1].step:
            segments.append([])
        segments[-1].append(point)
    return segments


def _mark_anomalies(ax, one: Series) -> None:
    for point in one.points:
        if point.counted_nonfinite:
            ax.axvline(point.step, color=NONFINITE_COLOR, linestyle=":", linewidth=2.0)
    for alert in one.alerts:
        if alert.step is not None:
            ax.axvline(alert.step, color=ALERT_COLOR, linestyle="--", linewidth=2.0)


def _legend_handles(series: list[Series]) -> list[Line2D]:
    handles = [Line2D([], [], color=f"C{i % 10}", linewidth=1.6, label=s.label) for i, s in enumerate(series)]
    if any(p.counted_nonfinite for s in series for p in s.points):
        handles.append(Line2D([], [], color=NONFINITE_COLOR, linestyle=":", label="non-finite"))
    if any(a.step is not None for s in series for a in s.alerts):
        handles.append(Line2D([], [], color=ALERT_COLOR, linestyle="--", label="alert"))
    return handles
