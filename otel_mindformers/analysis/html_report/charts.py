"""The page's charts as inline SVG, drawn here in Python: no chart library, nothing to fetch,
every series, mark and cell an element of the page (a test counts them in the DOM).

Each function returns one `<figure>`; colours come from CSS classes (page.css), so a cell or
a segment costs a few bytes. Hover read-outs are a small JSON block beside the SVG that
page_hover.js reads; the page works without them.
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from otel_mindformers.analysis.html_report.binning import Axis, Band, Cell, RankRows

WIDTH = 920
_LEFT, _RIGHT, _TOP, _BOTTOM = 70, 14, 12, 36
PALETTE_SIZE = 10  # series colours s0..s9 in page.css
HEAT_LEVELS = 16  # heatmap colours h0..h15 in page.css
MARK_KINDS = ("restart", "capture", "alert", "nonfinite", "overflow")
MARK_TITLES = {
    "restart": "restart",
    "capture": "capture",
    "alert": "alert",
    "nonfinite": "non-finite value",
    "overflow": "overflow",
}


def esc(text: object) -> str:
    return html.escape(str(text), quote=True)


def fmt(value: float | None, unit: str = "") -> str:
    """A value for people: 4 significant digits, its unit after it."""
    if value is None or not math.isfinite(value):
        return "-"
    text = f"{value:.4g}"
    return f"{text} {unit}".rstrip() if unit and unit != "%" else f"{text}{unit}"


def tick(value: float) -> str:
    """An axis label: short (10k, 1.5M, 0.0003)."""
    size = abs(value)
    for limit, unit, suffix in ((1e9, 1e9, "G"), (1e6, 1e6, "M"), (1e4, 1e3, "k")):
        if size >= limit:
            return f"{value / unit:.4g}{suffix}"
    return f"{value:.4g}"


def _c(value: float) -> str:
    """A coordinate: one decimal is finer than a pixel."""
    text = f"{value:.1f}"
    return text[:-2] if text.endswith(".0") else text


def json_block(css_class: str, data: object) -> str:
    """Data for page_hover.js: a JSON block, closed safely inside HTML."""
    text = json.dumps(data, separators=(",", ":"), allow_nan=False).replace("</", "<\\/")
    return f'<script type="application/json" class="{css_class}">{text}</script>'


def _round(value: float) -> float | None:
    return float(f"{value:.4g}") if math.isfinite(value) else None


def nice_ticks(low: float, high: float, count: int = 5) -> list[float]:
    """Round tick values covering [low, high]."""
    if not (math.isfinite(low) and math.isfinite(high)) or high <= low:
        return [low]
    raw = (high - low) / max(count, 1)
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw)
    first = math.ceil(low / step) * step
    ticks = []
    value = first
    while value <= high + step * 1e-9:
        ticks.append(round(value, 12))
        value += step
    return ticks


def _log_ticks(low: float, high: float) -> list[float]:
    ticks = [10.0**e for e in range(math.floor(math.log10(low)), math.ceil(math.log10(high)) + 1)]
    inside = [t for t in ticks if low <= t <= high]
    return inside if len(inside) >= 2 else [low, high]


@dataclass
class Scale:
    """Data to pixels on one axis, linear or logarithmic."""

    low: float
    high: float
    start: float  # pixel of `low`
    end: float  # pixel of `high`
    log: bool = False

    def __call__(self, value: float) -> float:
        if self.log:
            value, low, high = math.log10(value), math.log10(self.low), math.log10(self.high)
        else:
            low, high = self.low, self.high
        return self.start + (value - low) / (high - low) * (self.end - self.start)

    def ticks(self) -> list[float]:
        return _log_ticks(self.low, self.high) if self.log else nice_ticks(self.low, self.high)


def _axes(x: Scale, y: Scale, x_label: str, unit: str, height: float) -> str:
    parts = ['<g class="axes">']
    for value in y.ticks():
        py = y(value)
        parts.append(
            f'<line class="grid" x1="{_LEFT}" x2="{WIDTH - _RIGHT}" y1="{_c(py)}" y2="{_c(py)}"/>'
            f'<text class="tick" x="{_LEFT - 6}" y="{_c(py + 4)}" text-anchor="end">{esc(tick(value))}</text>'
        )
    for value in x.ticks():
        px = x(value)
        parts.append(
            f'<line class="tickmark" x1="{_c(px)}" x2="{_c(px)}" y1="{_c(height - _BOTTOM)}" y2="{_c(height - _BOTTOM + 4)}"/>'
            f'<text class="tick" x="{_c(px)}" y="{_c(height - _BOTTOM + 16)}" text-anchor="middle">{esc(tick(value))}</text>'
        )
    parts.append(
        f'<line class="axis" x1="{_LEFT}" x2="{WIDTH - _RIGHT}" y1="{_c(height - _BOTTOM)}" y2="{_c(height - _BOTTOM)}"/>'
        f'<text class="label" x="{(WIDTH + _LEFT) / 2:.0f}" y="{height - 4:.0f}" text-anchor="middle">{esc(x_label)}</text>'
    )
    if unit:  # along the left edge, where the tick labels do not reach
        middle = (_TOP + height - _BOTTOM) / 2
        parts.append(
            f'<text class="label" x="12" y="{middle:.0f}" transform="rotate(-90 12 {middle:.0f})" '
            f'text-anchor="middle">{esc(unit)}</text>'
        )
    parts.append("</g>")
    return "".join(parts)


@dataclass
class Line:
    """One drawn series: segments of (x, y) points, a palette colour, its label."""

    label: str
    segments: list[list[tuple[float, float]]]
    colour: int
    emphasis: bool = False


@dataclass
class Mark:
    """Something that happened at a step (or a span of steps), drawn across a chart."""

    kind: str  # one of MARK_KINDS
    x0: float
    x1: float | None
    text: str


@dataclass
class Hover:
    """What the read-out shows at each column: the x values and each series' value there."""

    xs: list[float]
    series: list[tuple[str, list[float | None]]] = field(default_factory=list)

    def data(self, unit: str) -> dict:
        return {
            "x": [_round(x) for x in self.xs],
            "s": [[label, [None if v is None else _round(v) for v in values]] for label, values in self.series],
            "u": unit,
        }


def _path(points: Sequence[tuple[float, float]], x: Scale, y: Scale) -> str:
    return "M" + "L".join(f"{_c(x(px))} {_c(y(py))}" for px, py in points)


def _y_scale(values: list[float], height: float, log: bool) -> Scale:
    finite = [v for v in values if math.isfinite(v)]
    use_log = log and bool(finite) and min(finite) > 0 and max(finite) / min(finite) > 20
    low, high = (min(finite), max(finite)) if finite else (0.0, 1.0)
    if use_log:
        return Scale(low, high, height - _BOTTOM, _TOP, log=True)
    if high <= low:
        low, high = low - (abs(low) or 1.0) * 0.5, high + (abs(high) or 1.0) * 0.5
    pad = (high - low) * 0.05
    return Scale(low - pad, high + pad, height - _BOTTOM, _TOP)


def _marks(marks: Sequence[Mark], x: Scale, height: float) -> str:
    """Vertical lines (a span: a shaded band), at most one per pixel column and kind."""
    drawn: set[tuple[str, int]] = set()
    parts = ['<g class="marks">']
    for mark in marks:
        if not x.low <= mark.x0 <= x.high:
            continue
        left = x(mark.x0)
        key = (mark.kind, int(left))
        if key in drawn:
            continue
        drawn.add(key)
        title = f"<title>{esc(mark.text)}</title>"
        if mark.x1 is not None and mark.x1 > mark.x0:
            right = x(min(mark.x1, x.high))
            parts.append(
                f'<rect class="mark mark-{mark.kind}" x="{_c(left)}" y="{_TOP}" width="{_c(max(right - left, 2))}" '
                f'height="{_c(height - _BOTTOM - _TOP)}">{title}</rect>'
            )
        else:
            parts.append(
                f'<line class="mark mark-{mark.kind}" x1="{_c(left)}" x2="{_c(left)}" y1="{_TOP}" '
                f'y2="{_c(height - _BOTTOM)}">{title}</line>'
            )
    parts.append("</g>")
    return "".join(parts)


def line_chart(
    chart_id: str,
    title: str,
    unit: str,
    x_range: Axis,
    x_label: str,
    lines: Sequence[Line],
    band: Band | None = None,
    marks: Sequence[Mark] = (),
    hover: Hover | None = None,
    log_y: bool = False,
    note: str = "",
    height: int = 230,
) -> str:
    """A chart of lines against x (steps or seconds), with an optional median-and-range band
    and marks across it."""
    values = [py for line in lines for segment in line.segments for _, py in segment]
    if band is not None:
        values += band.lows + band.highs
    x = Scale(x_range.low, x_range.high, _LEFT, WIDTH - _RIGHT)
    y = _y_scale(values, height, log_y)
    body = [_axes(x, y, x_label, unit if not y.log else f"{unit} (log scale)", height), _marks(marks, x, height)]
    if band is not None and band.xs:
        outline = list(zip(band.xs, band.highs)) + list(zip(reversed(band.xs), reversed(band.lows)))
        body.append(f'<path class="band" d="{_path(outline, x, y)}Z"><title>lowest to highest rank</title></path>')
        body.append(
            f'<path class="series median" data-series="median" d="{_path(list(zip(band.xs, band.medians)), x, y)}"/>'
        )
    for line in lines:
        path = "".join(_path(segment, x, y) for segment in line.segments if segment)
        if path:
            css = "series emphasis" if line.emphasis else f"series s{line.colour % PALETTE_SIZE}"
            body.append(f'<path class="{css}" data-series="{esc(line.label)}" d="{path}"/>')
    body.append(f'<line class="guide" x1="0" x2="0" y1="{_TOP}" y2="{height - _BOTTOM}"/>')
    legend = _legend(lines, band)
    return (
        f'<figure class="chart line-chart" id="{esc(chart_id)}"><figcaption>{esc(title)}</figcaption>'
        f'<svg class="plot" viewBox="0 0 {WIDTH} {height}" data-x0="{x.low!r}" data-x1="{x.high!r}" '
        f'data-px0="{_LEFT}" data-px1="{WIDTH - _RIGHT}" role="img" aria-label="{esc(title)}">{"".join(body)}</svg>'
        f'<div class="readout" hidden></div>{legend}'
        + (f'<p class="note">{esc(note)}</p>' if note else "")
        + (json_block("hover-data", hover.data(unit)) if hover is not None else "")
        + "</figure>"
    )


def _legend(lines: Sequence[Line], band: Band | None) -> str:
    items = []
    if band is not None and band.xs:
        items.append('<span><i class="swatch band-swatch"></i>median, lowest to highest rank</span>')
    items += [
        f'<span><i class="swatch {"emphasis" if line.emphasis else f"s{line.colour % PALETTE_SIZE}"}"></i>'
        f"{esc(line.label)}{' (holds the job back)' if line.emphasis else ''}</span>"
        for line in lines
    ]
    return f'<div class="legend">{"".join(items)}</div>' if items else ""


def marks_legend(kinds: Sequence[str]) -> str:
    items = [f'<span><i class="swatch mark-{kind}"></i>{esc(MARK_TITLES[kind])}</span>' for kind in kinds]
    return f'<div class="legend marks-legend">{"".join(items)}</div>' if items else ""


@dataclass
class HeatScale:
    """Values to the HEAT_LEVELS colours: linear, or logarithmic when they span decades."""

    low: float
    high: float
    log: bool

    @classmethod
    def of(cls, values: Sequence[float], fixed: tuple[float, float] | None = None) -> HeatScale:
        if fixed is not None:
            return cls(fixed[0], fixed[1], False)
        finite = sorted(v for v in values if math.isfinite(v))
        # The 1st to 99th percentile: a compilation step or a restart's first step would
        # otherwise wash every other cell out; cells beyond take the end colours.
        low, high = (finite[len(finite) // 100], finite[-1 - len(finite) // 100]) if finite else (0.0, 1.0)
        log = low > 0 and high / low > 20
        return cls(low, high if high > low else low + 1.0, log)

    def level(self, value: float) -> int:
        if self.log:
            where = (math.log10(max(value, self.low)) - math.log10(self.low)) / (
                math.log10(self.high) - math.log10(self.low)
            )
        else:
            where = (value - self.low) / (self.high - self.low)
        return min(HEAT_LEVELS - 1, max(0, int(where * HEAT_LEVELS)))


def heatmap(
    chart_id: str,
    title: str,
    cells: Sequence[Cell],
    rows: RankRows,
    axis: Axis,
    scale: HeatScale,
    x_label: str,
    unit: str,
    note: str = "",
    named_row: int | None = None,
) -> str:
    """Ranks down, steps across; a cell's colour is its value's level. Cells are drawn at
    1x1 in a scaled group, with their size in CSS, so each costs about 30 bytes. The row of
    `named_row` (the rank that holds the job back) is labelled and outlined."""
    plot_width = WIDTH - 96 - _RIGHT
    cell_w = plot_width / axis.bins
    cell_h = max(3.0, min(16.0, 300.0 / rows.count))
    height = _TOP + cell_h * rows.count + _BOTTOM
    x = Scale(axis.low, axis.high, 96, WIDTH - _RIGHT)
    parts = [
        f'<rect class="heat-empty" x="96" y="{_TOP}" width="{_c(plot_width)}" height="{_c(cell_h * rows.count)}"/>',
        f'<g class="cells" transform="translate(96 {_TOP}) scale({cell_w:.4f} {cell_h:.4f})">',
    ]
    parts += [f'<rect class="h{scale.level(c.value)}" x="{c.column}" y="{c.row}"/>' for c in cells]
    parts.append("</g>")
    every = max(1, math.ceil(rows.count / 24))
    labelled = set(range(0, rows.count, every))
    if named_row is not None:
        labelled = {row for row in labelled if abs(row - named_row) >= every} | {named_row}
        parts.append(
            f'<rect class="named-row" x="95" y="{_c(_TOP + named_row * cell_h - 1)}" width="{_c(plot_width + 2)}" '
            f'height="{_c(cell_h + 2)}"/>'
        )
    for row in sorted(labelled):
        css = "tick named" if row == named_row else "tick"
        parts.append(
            f'<text class="{css}" x="90" y="{_c(_TOP + (row + 0.5) * cell_h + 4)}" text-anchor="end">'
            f"{esc(rows.label(row))}</text>"
        )
    bottom = height - _BOTTOM
    for value in x.ticks():
        parts.append(
            f'<text class="tick" x="{_c(x(value))}" y="{_c(bottom + 16)}" text-anchor="middle">{esc(tick(value))}</text>'
        )
    parts.append(
        f'<text class="label" x="{(WIDTH + 96) / 2:.0f}" y="{height - 4:.0f}" text-anchor="middle">{esc(x_label)}</text>'
    )
    values: list[list[float | None]] = [[None] * axis.bins for _ in range(rows.count)]
    ranks: list[list[int | None]] = [[None] * axis.bins for _ in range(rows.count)]
    for cell in cells:
        values[cell.row][cell.column] = _round(cell.value)
        ranks[cell.row][cell.column] = cell.rank
    hover = {
        "rows": [rows.label(row) for row in range(rows.count)],
        "x0": axis.low,
        "x1": axis.high,
        "v": values,
        "u": unit,
    }
    if len(rows.ranks) > rows.count:  # a row holds several ranks: say whose value it is
        hover["r"] = ranks
    key = _heat_key(scale, unit)
    return (
        f'<figure class="chart heatmap" id="{esc(chart_id)}"><figcaption>{esc(title)}</figcaption>'
        f'<svg class="plot" viewBox="0 0 {WIDTH} {_c(height)}" data-px0="96" data-px1="{WIDTH - _RIGHT}" '
        f'data-py0="{_TOP}" data-row-height="{cell_h:.4f}" data-columns="{axis.bins}" role="img" '
        f'aria-label="{esc(title)}">{"".join(parts)}</svg><div class="readout" hidden></div>{key}'
        + (f'<p class="note">{esc(note)}</p>' if note else "")
        + json_block("heat-data", hover)
        + "</figure>"
    )


def _heat_key(scale: HeatScale, unit: str) -> str:
    swatches = "".join(f'<i class="swatch h{level}"></i>' for level in range(HEAT_LEVELS))
    low, high = fmt(scale.low, unit), fmt(scale.high, unit)
    return f'<div class="legend heat-key"><span>{esc(low)}</span>{swatches}<span>{esc(high)}{" (log)" if scale.log else ""}</span></div>'


@dataclass
class Bar:
    """One bar of a stacked bar chart: its label and (category, value) segments."""

    label: str
    segments: list[tuple[str, float]]
    total_text: str = ""


def stacked_bars(
    chart_id: str, title: str, bars: Sequence[Bar], categories: Sequence[str], unit: str, note: str = ""
) -> str:
    """Horizontal bars, one per rank (or group of ranks), split by category."""
    bar_h, gap = 16, 4
    height = _TOP + len(bars) * (bar_h + gap) + 24
    longest = max((sum(v for _, v in bar.segments) for bar in bars), default=0.0) or 1.0
    left, right = 110, WIDTH - 90
    index = {name: i for i, name in enumerate(categories)}
    parts = []
    for row, bar in enumerate(bars):
        y = _TOP + row * (bar_h + gap)
        parts.append(f'<text class="tick" x="{left - 6}" y="{y + bar_h - 4}" text-anchor="end">{esc(bar.label)}</text>')
        x = float(left)
        total = sum(v for _, v in bar.segments)
        for name, value in bar.segments:
            if value <= 0:
                continue
            width = value / longest * (right - left)
            share = value / total if total > 0 else 0.0
            parts.append(
                f'<rect class="segment k{index[name]}" x="{_c(x)}" y="{y}" width="{_c(max(width, 0.5))}" height="{bar_h}">'
                f"<title>{esc(bar.label)}: {esc(name)} {esc(fmt(value, unit))} ({share:.1%})</title></rect>"
            )
            x += width
        parts.append(f'<text class="tick" x="{_c(x + 6)}" y="{y + bar_h - 4}">{esc(bar.total_text)}</text>')
    legend = "".join(f'<span><i class="swatch k{i}"></i>{esc(name)}</span>' for i, name in enumerate(categories))
    return (
        f'<figure class="chart bars" id="{esc(chart_id)}"><figcaption>{esc(title)}</figcaption>'
        f'<svg class="plot" viewBox="0 0 {WIDTH} {height}" role="img" aria-label="{esc(title)}">{"".join(parts)}</svg>'
        f'<div class="legend">{legend}</div>' + (f'<p class="note">{esc(note)}</p>' if note else "") + "</figure>"
    )


@dataclass
class Span:
    """A stretch of a timeline lane: [start, end) seconds, a CSS class and its text."""

    lane: int
    start: float
    end: float
    css: str
    text: str
    label: str = ""


def timeline(
    chart_id: str, title: str, lanes: Sequence[str], spans: Sequence[Span], x_label: str, legend: str = ""
) -> str:
    """Lanes of spans against a time axis (the attempts and the downtime between them; a
    capture's operators)."""
    lane_h, gap = 22, 6
    height = _TOP + len(lanes) * (lane_h + gap) + _BOTTOM
    low = min((s.start for s in spans), default=0.0)
    high = max((s.end for s in spans), default=1.0)
    x = Scale(low, high if high > low else low + 1.0, 150, WIDTH - _RIGHT)
    parts = []
    for lane, name in enumerate(lanes):
        y = _TOP + lane * (lane_h + gap)
        parts.append(f'<text class="tick" x="144" y="{y + lane_h - 6}" text-anchor="end">{esc(name)}</text>')
    for span in spans:
        y = _TOP + span.lane * (lane_h + gap)
        left, right = x(span.start), x(span.end)
        parts.append(
            f'<rect class="span {esc(span.css)}" x="{_c(left)}" y="{y}" width="{_c(max(right - left, 1.0))}" '
            f'height="{lane_h}"><title>{esc(span.text)}</title></rect>'
        )
        if span.label and right - left > 7 * len(span.label):
            parts.append(
                f'<text class="span-label" x="{_c((left + right) / 2)}" y="{y + lane_h - 7}" text-anchor="middle">'
                f"{esc(span.label)}</text>"
            )
    bottom = height - _BOTTOM
    parts.append(f'<line class="axis" x1="150" x2="{WIDTH - _RIGHT}" y1="{bottom}" y2="{bottom}"/>')
    for value in x.ticks():
        parts.append(
            f'<text class="tick" x="{_c(x(value))}" y="{bottom + 16}" text-anchor="middle">{esc(tick(value))}</text>'
        )
    parts.append(
        f'<text class="label" x="{(WIDTH + 150) / 2:.0f}" y="{height - 4}" text-anchor="middle">{esc(x_label)}</text>'
    )
    return (
        f'<figure class="chart timeline" id="{esc(chart_id)}"><figcaption>{esc(title)}</figcaption>'
        f'<svg class="plot" viewBox="0 0 {WIDTH} {height}" role="img" aria-label="{esc(title)}">{"".join(parts)}</svg>'
        f"{legend}</figure>"
    )


__all__ = [
    "HEAT_LEVELS",
    "MARK_KINDS",
    "PALETTE_SIZE",
    "Bar",
    "HeatScale",
    "Hover",
    "Line",
    "Mark",
    "Span",
    "esc",
    "fmt",
    "heatmap",
    "json_block",
    "line_chart",
    "marks_legend",
    "stacked_bars",
    "timeline",
]
