"""The page's charts as inline SVG, drawn here in Python: no chart library, nothing to fetch,
every series, mark and cell an element of the page (a test counts them in the DOM).

Each function returns one `<figure>`, built with markup.py (every string escaped); colours
come from CSS classes (page.css), so a cell or a segment costs a few bytes. Hover read-outs
are a small JSON block beside the SVG that page_hover.js reads; the page works without them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from otel_mindformers.analysis.html_report.binning import Axis, Band, Cell, RankRows
from otel_mindformers.analysis.html_report.markup import Html, data_block, el

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


def _axes(x: Scale, y: Scale, x_label: str, unit: str, height: float) -> Html:
    parts = []
    for value in y.ticks():
        py = _c(y(value))
        parts.append(el("line", class_="grid", x1=_LEFT, x2=WIDTH - _RIGHT, y1=py, y2=py))
        parts.append(el("text", tick(value), class_="tick", x=_LEFT - 6, y=_c(y(value) + 4), text_anchor="end"))
    bottom = height - _BOTTOM
    for value in x.ticks():
        px = _c(x(value))
        parts.append(el("line", class_="tickmark", x1=px, x2=px, y1=_c(bottom), y2=_c(bottom + 4)))
        parts.append(el("text", tick(value), class_="tick", x=px, y=_c(bottom + 16), text_anchor="middle"))
    parts.append(el("line", class_="axis", x1=_LEFT, x2=WIDTH - _RIGHT, y1=_c(bottom), y2=_c(bottom)))
    parts.append(
        el("text", x_label, class_="label", x=f"{(WIDTH + _LEFT) / 2:.0f}", y=f"{height - 4:.0f}", text_anchor="middle")
    )
    if unit:  # along the left edge, where the tick labels do not reach
        middle = f"{(_TOP + height - _BOTTOM) / 2:.0f}"
        parts.append(
            el("text", unit, class_="label", x=12, y=middle, transform=f"rotate(-90 12 {middle})", text_anchor="middle")
        )
    return el("g", parts, class_="axes")


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


def _marks(marks: Sequence[Mark], x: Scale, height: float) -> Html:
    """Vertical lines (a span: a shaded band), at most one per pixel column and kind."""
    drawn: set[tuple[str, int]] = set()
    parts = []
    for mark in marks:
        if not x.low <= mark.x0 <= x.high:
            continue
        left = x(mark.x0)
        key = (mark.kind, int(left))
        if key in drawn:
            continue
        drawn.add(key)
        title = el("title", mark.text)
        css = f"mark mark-{mark.kind}"
        if mark.x1 is not None and mark.x1 > mark.x0:
            right = x(min(mark.x1, x.high))
            parts.append(
                el("rect", title, class_=css, x=_c(left), y=_TOP, width=_c(max(right - left, 2)),
                   height=_c(height - _BOTTOM - _TOP))
            )  # fmt: skip
        else:
            parts.append(el("line", title, class_=css, x1=_c(left), x2=_c(left), y1=_TOP, y2=_c(height - _BOTTOM)))
    return el("g", parts, class_="marks")


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
) -> Html:
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
        body.append(el("path", el("title", "lowest to highest rank"), class_="band", d=_path(outline, x, y) + "Z"))
        body.append(
            el("path", class_="series median", data_series="median", d=_path(list(zip(band.xs, band.medians)), x, y))
        )
    for line in lines:
        path = "".join(_path(segment, x, y) for segment in line.segments if segment)
        if path:
            css = "series emphasis" if line.emphasis else f"series s{line.colour % PALETTE_SIZE}"
            body.append(el("path", class_=css, data_series=line.label, d=path))
    body.append(el("line", class_="guide", x1=0, x2=0, y1=_TOP, y2=height - _BOTTOM))
    svg = el(
        "svg", body, class_="plot", viewBox=f"0 0 {WIDTH} {height}", data_x0=repr(x.low), data_x1=repr(x.high),
        data_px0=_LEFT, data_px1=WIDTH - _RIGHT, role="img", aria_label=title,
    )  # fmt: skip
    return el(
        "figure",
        el("figcaption", title),
        svg,
        el("div", class_="readout", hidden=True),
        _legend(lines, band),
        el("p", note, class_="note") if note else None,
        data_block("hover-data", hover.data(unit)) if hover is not None else None,
        class_="chart line-chart",
        id=chart_id,
    )


def _legend(lines: Sequence[Line], band: Band | None) -> Html | None:
    items = []
    if band is not None and band.xs:
        items.append(el("span", el("i", class_="swatch band-swatch"), "median, lowest to highest rank"))
    items += [
        el(
            "span",
            el("i", class_=f"swatch {'emphasis' if line.emphasis else f's{line.colour % PALETTE_SIZE}'}"),
            line.label,
            " (holds the job back)" if line.emphasis else None,
        )
        for line in lines
    ]
    return el("div", items, class_="legend") if items else None


def marks_legend(kinds: Sequence[str]) -> Html | None:
    items = [el("span", el("i", class_=f"swatch mark-{kind}"), MARK_TITLES[kind]) for kind in kinds]
    return el("div", items, class_="legend marks-legend") if items else None


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
) -> Html:
    """Ranks down, steps across; a cell's colour is its value's level. Cells are drawn at
    1x1 in a scaled group, with their size in CSS, so each costs about 30 bytes. The row of
    `named_row` (the rank that holds the job back) is labelled and outlined."""
    plot_width = WIDTH - 96 - _RIGHT
    cell_w = plot_width / axis.bins
    cell_h = max(3.0, min(16.0, 300.0 / rows.count))
    height = _TOP + cell_h * rows.count + _BOTTOM
    x = Scale(axis.low, axis.high, 96, WIDTH - _RIGHT)
    parts = [
        el("rect", class_="heat-empty", x=96, y=_TOP, width=_c(plot_width), height=_c(cell_h * rows.count)),
        el(
            "g",
            [el("rect", class_=f"h{scale.level(c.value)}", x=c.column, y=c.row) for c in cells],
            class_="cells",
            transform=f"translate(96 {_TOP}) scale({cell_w:.4f} {cell_h:.4f})",
        ),
    ]
    every = max(1, math.ceil(rows.count / 24))
    labelled = set(range(0, rows.count, every))
    if named_row is not None:
        labelled = {row for row in labelled if abs(row - named_row) >= every} | {named_row}
        parts.append(
            el("rect", class_="named-row", x=95, y=_c(_TOP + named_row * cell_h - 1), width=_c(plot_width + 2),
               height=_c(cell_h + 2))
        )  # fmt: skip
    for row in sorted(labelled):
        parts.append(
            el("text", rows.label(row), class_="tick named" if row == named_row else "tick", x=90,
               y=_c(_TOP + (row + 0.5) * cell_h + 4), text_anchor="end")
        )  # fmt: skip
    bottom = height - _BOTTOM
    for value in x.ticks():
        parts.append(el("text", tick(value), class_="tick", x=_c(x(value)), y=_c(bottom + 16), text_anchor="middle"))
    parts.append(
        el("text", x_label, class_="label", x=f"{(WIDTH + 96) / 2:.0f}", y=f"{height - 4:.0f}", text_anchor="middle")
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
    svg = el(
        "svg", parts, class_="plot", viewBox=f"0 0 {WIDTH} {_c(height)}", data_px0=96, data_px1=WIDTH - _RIGHT,
        data_py0=_TOP, data_row_height=f"{cell_h:.4f}", data_columns=axis.bins, role="img", aria_label=title,
    )  # fmt: skip
    return el(
        "figure",
        el("figcaption", title),
        svg,
        el("div", class_="readout", hidden=True),
        _heat_key(scale, unit),
        el("p", note, class_="note") if note else None,
        data_block("heat-data", hover),
        class_="chart heatmap",
        id=chart_id,
    )


def _heat_key(scale: HeatScale, unit: str) -> Html:
    swatches = [el("i", class_=f"swatch h{level}") for level in range(HEAT_LEVELS)]
    low, high = fmt(scale.low, unit), fmt(scale.high, unit)
    return el(
        "div", el("span", low), swatches, el("span", high + (" (log)" if scale.log else "")), class_="legend heat-key"
    )


@dataclass
class Bar:
    """One bar of a stacked bar chart: its label and (category, value) segments."""

    label: str
    segments: list[tuple[str, float]]
    total_text: str = ""


def stacked_bars(
    chart_id: str,
    title: str,
    bars: Sequence[Bar],
    categories: Sequence[str],
    unit: str,
    note: str = "",
    colours: Mapping[str, int] | None = None,
) -> Html:
    """Horizontal bars, one per rank (or group of ranks), split by category; `colours` gives a
    category's colour class (`k<i>`) where another chart shows the same thing, else its place."""
    bar_h, gap = 16, 4
    height = _TOP + len(bars) * (bar_h + gap) + 24
    longest = max((sum(v for _, v in bar.segments) for bar in bars), default=0.0) or 1.0
    left, right = 110, WIDTH - 90
    index = {name: i for i, name in enumerate(categories)} | dict(colours or {})
    parts = []
    for row, bar in enumerate(bars):
        y = _TOP + row * (bar_h + gap)
        parts.append(el("text", bar.label, class_="tick", x=left - 6, y=y + bar_h - 4, text_anchor="end"))
        x = float(left)
        total = sum(v for _, v in bar.segments)
        for name, value in bar.segments:
            if value <= 0:
                continue
            width = value / longest * (right - left)
            share = value / total if total > 0 else 0.0
            tooltip = el("title", f"{bar.label}: {name} {fmt(value, unit)} ({share:.1%})")
            parts.append(
                el("rect", tooltip, class_=f"segment k{index[name]}", x=_c(x), y=y, width=_c(max(width, 0.5)),
                   height=bar_h)
            )  # fmt: skip
            x += width
        parts.append(el("text", bar.total_text, class_="tick", x=_c(x + 6), y=y + bar_h - 4))
    legend = [el("span", el("i", class_=f"swatch k{index[name]}"), name) for name in categories]
    return el(
        "figure",
        el("figcaption", title),
        el("svg", parts, class_="plot", viewBox=f"0 0 {WIDTH} {height}", role="img", aria_label=title),
        el("div", legend, class_="legend"),
        el("p", note, class_="note") if note else None,
        class_="chart bars",
        id=chart_id,
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
    chart_id: str, title: str, lanes: Sequence[str], spans: Sequence[Span], x_label: str, legend: Html | None = None
) -> Html:
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
        parts.append(el("text", name, class_="tick", x=144, y=y + lane_h - 6, text_anchor="end"))
    for span in spans:
        y = _TOP + span.lane * (lane_h + gap)
        left, right = x(span.start), x(span.end)
        parts.append(
            el("rect", el("title", span.text), class_=f"span {span.css}", x=_c(left), y=y,
               width=_c(max(right - left, 1.0)), height=lane_h)
        )  # fmt: skip
        if span.label and right - left > 7 * len(span.label):
            parts.append(
                el("text", span.label, class_="span-label", x=_c((left + right) / 2), y=y + lane_h - 7,
                   text_anchor="middle")
            )  # fmt: skip
    bottom = height - _BOTTOM
    parts.append(el("line", class_="axis", x1=150, x2=WIDTH - _RIGHT, y1=bottom, y2=bottom))
    for value in x.ticks():
        parts.append(el("text", tick(value), class_="tick", x=_c(x(value)), y=bottom + 16, text_anchor="middle"))
    parts.append(el("text", x_label, class_="label", x=f"{(WIDTH + 150) / 2:.0f}", y=height - 4, text_anchor="middle"))
    return el(
        "figure",
        el("figcaption", title),
        el("svg", parts, class_="plot", viewBox=f"0 0 {WIDTH} {height}", role="img", aria_label=title),
        legend,
        class_="chart timeline",
        id=chart_id,
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
    "fmt",
    "heatmap",
    "line_chart",
    "marks_legend",
    "stacked_bars",
    "timeline",
]
