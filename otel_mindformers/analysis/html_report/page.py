"""The run's page: one HTML document with its styles, scripts and charts inline.

Sections, in order: the run at a glance (every figure from the JSON report, its exact value
in a `data-value` attribute), the curves against the step, the job across ranks (the
verdict, heatmaps of step time and of each section, where each rank's time went), the
job across attempts, device readings, captures, and the logs read. A Content-Security-Policy
forbids every fetch: the page cannot load anything, and page_errors.js writes any error or
blocked request into the page itself, where a test (or a reader) sees it.
"""

from __future__ import annotations

import json
import math
import re
import time
from importlib import resources
from pathlib import Path
from typing import Any

from otel_mindformers.analysis.html_report import charts
from otel_mindformers.analysis.html_report.binning import (
    Axis,
    Band,
    Covered,
    RankRows,
    band,
    column_means,
    covering,
    heat_cells,
    thinned,
)
from otel_mindformers.analysis.html_report.charts import Bar, HeatScale, Hover, Line, Mark, Span, esc, fmt
from otel_mindformers.analysis.html_report.run_data import CURVES, DEVICE_READINGS, Column, RunData
from otel_mindformers.analysis.logs import local_time
from otel_mindformers.analysis.report import (
    BUILT_IN_PHASES,
    OTHER_PHASES,
    TOPIC_ATTEMPTS,
    TOPIC_CURVES,
    TOPIC_LOGS,
    TOPIC_RANKS,
    Report,
    findings,
)
from otel_mindformers.captures.offline.profile_trace import short_name, trace_operators
from otel_mindformers.cluster.offline.attempt_fault import what_ended
from otel_mindformers.names import straggler_names as sections
from otel_mindformers.names import training as tm
from otel_mindformers.stragglers.offline import verdict as stragglers
from otel_mindformers.stragglers.offline.verdict import COLUMNS, SectionHistory
from otel_mindformers.stragglers.sections import STEPS_KEY, WINDOW_KEY
from otel_mindformers.version import __version__

# A Content-Security-Policy that allows the page's own inline styles and scripts and data:
# images, and nothing else: no fetch of any kind can leave the page.
CSP = "default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:"
CURVE_COLUMNS = 600  # a curve's points: at most two per column
HEAT_COLUMNS = 150  # steps across a heatmap
HEAT_ROWS = 64  # ranks down a heatmap (more ranks share a row)
MAX_LINES = 8  # ranks drawn one line each; more: median and range
MAX_BARS = 64  # bars of where each rank's time went; more ranks share a bar
MAX_FINDINGS = 40  # listed at once; the rest behind "more"
MAX_TIMELINES = 3  # captures whose operators are drawn (the newest analysed)
MAX_TRACE_BYTES = 64 * 1024 * 1024  # a larger trace is named, not read
MAX_OPERATOR_LANES = 20
SECTION_OF_TOPIC = {TOPIC_LOGS: "logs", TOPIC_CURVES: "curves", TOPIC_RANKS: "ranks", TOPIC_ATTEMPTS: "attempts"}
_TITLES = {
    tm.LOSS: ("Loss", ""),
    tm.LEARNING_RATE: ("Learning rate", ""),
    tm.GRAD_NORM: ("Gradient norm", ""),
    tm.STEP_TIME: ("Step time", "ms"),
    tm.SAMPLES_PER_SECOND: ("Throughput", "samples/s"),
    tm.TOKENS_PER_SECOND: ("Throughput", "tokens/s"),
    tm.MFU: ("MFU", ""),
}
HEAT_SECTIONS = (
    sections.SECTION_DATA_WAIT,
    sections.SECTION_IN_STEP,
    sections.SECTION_CHECKPOINT,
    sections.SECTION_EVALUATION,
)
# Categories of where a series' time went (its `time` object): productive, the phases, and
# what no phase accounts for.
UNACCOUNTED = "unaccounted"
TIME_CATEGORIES = ("productive", *BUILT_IN_PHASES, OTHER_PHASES, UNACCOUNTED)


def _asset(name: str) -> str:
    return resources.files(__package__).joinpath(name).read_text(encoding="utf-8")


def build_page(run: RunData) -> str:
    """The whole document."""
    job = run.job
    title = f"Training run {job['job_id']}" if job else "Training run"
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f'<meta name="generator" content="otel-mindformers {esc(__version__)}">',
        f"<title>{esc(title)}</title>",
        f"<script>{_asset('page_errors.js')}</script>",
        f"<style>{_asset('page.css')}</style>",
        "</head><body>",
        f'<header><h1>{esc(title)}</h1><p class="sub">{esc(_subtitle(run))}</p>',
        '<pre id="page-errors" hidden></pre>',
        _nav(),
        "</header><main>",
        _glance(run),
        _curves(run),
        _ranks(run),
        _attempts(job),
        _devices(run),
        _captures(run.captures),
        _logs(run),
        "</main>",
        f"<script>{_asset('page_hover.js')}</script>",
        "</body></html>",
    ]
    return "\n".join(parts)


def _subtitle(run: RunData) -> str:
    files = sorted({f for one in run.series for f in one.files})
    folders = sorted({str(Path(f).parent) for f in files})
    where = folders[0] if len(folders) == 1 else f"{len(folders)} folders"
    return (
        f"{len(files)} log file(s) in {where}; page made by otel-mindformers {__version__} "
        f"at {local_time(time.time())} from the same analysis as `report --json`"
    )


_NAV = (
    ("glance", "At a glance"),
    ("curves", "Curves"),
    ("ranks", "Across ranks"),
    ("attempts", "Attempts"),
    ("devices", "Devices"),
    ("captures", "Captures"),
    ("logs", "Logs"),
)


def _nav() -> str:
    return "<nav>" + "".join(f'<a href="#{key}">{esc(text)}</a>' for key, text in _NAV) + "</nav>"


def _section(key: str, inner: str) -> str:
    heading = dict(_NAV)[key]
    return f'<section id="{key}"><h2>{esc(heading)}</h2>{inner}</section>'


# --- at a glance ---------------------------------------------------------------------------


def _fact(key: str, label: str, shown: str, value: Any = None, link: str | None = None) -> str:
    """One figure of the glance table; `value` (the JSON report's, exactly) in data-value."""
    data = f' data-value="{esc(json.dumps(value))}"' if value is not None else ""
    text = f'<a href="#{link}">{esc(shown)}</a>' if link else esc(shown)
    return f'<tr id="fact-{key}"><th>{esc(label)}</th><td{data}>{text}</td></tr>'


def _seconds(value: float | None) -> str:
    if value is None:
        return "-"
    if value < 120:
        return f"{value:.1f} s"
    if value < 7200:
        return f"{value / 60:.1f} min"
    return f"{value / 3600:.2f} h"


def _share(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def _glance(run: RunData) -> str:
    body, job, report = run.body, run.job, run.report
    series = body["series"]
    ranks = sorted({s["rank"] for s in series if s["rank"] is not None})
    world = max((s.get("world_size") or 1 for s in series), default=1)
    first_step = min((s["first_step"] for s in series if s["first_step"] is not None), default=None)
    rows = []
    if job is not None:
        totals = job["totals"]
        rows += [
            _fact("job-id", "job", job["job_id"], job["job_id"], "attempts"),
            _fact("attempts", "attempts", str(len(job["attempts"])), len(job["attempts"]), "attempts"),
        ]
    rows.append(
        _fact(
            "ranks",
            "ranks",
            f"{len(ranks)}" + (f" logged of {world}" if world > len(ranks) else ""),
            len(ranks),
            "ranks",
        )
    )
    rows.append(
        _fact(
            "steps",
            "steps",
            "-" if body["steps"] is None else f"{first_step}..{body['steps']}",
            body["steps"],
            "curves",
        )
    )
    rows.append(
        _fact("wall-time", "wall time (first to last record)", _seconds(body["wall_time_s"]), body["wall_time_s"])
    )
    if job is not None:
        totals = job["totals"]
        rows += [
            _fact(
                "job-goodput",
                "job goodput",
                f"{_share(totals['goodput'])} of {_seconds(totals['wall_seconds'])} since the first attempt began",
                totals["goodput"],
                "attempts",
            ),
            _fact("lost-steps", "lost steps", str(totals["lost_steps"]), totals["lost_steps"], "attempts"),
            _fact("downtime", "downtime", _seconds(totals["downtime_seconds"]), totals["downtime_seconds"], "attempts"),
        ]
    verdict = body.get("bottleneck")
    if verdict is not None:
        rows.append(
            _fact(
                "useful-share",
                "useful share across ranks",
                f"{_share(verdict['job_goodput'])} of {_seconds(verdict['job_wall_s'])} in {verdict['windows']} sampled windows",
                verdict["job_goodput"],
                "ranks",
            )
        )
    rows.append(_bottleneck_fact(body))
    if body["first_loss"] is not None:
        loss = f"first {fmt(body['first_loss'])}, last {fmt(body['last_loss'])}, min {fmt(body['min_loss'])} (step {body['min_loss_step']})"
        rows.append(_fact("loss", "loss", loss, body["last_loss"], "chart-loss"))
    if body["median_step_time_ms"] is not None:
        rows.append(
            _fact(
                "step-time",
                "median step time",
                fmt(body["median_step_time_ms"], "ms"),
                body["median_step_time_ms"],
                "chart-step-time",
            )
        )
    throughput = [
        fmt(body[key], unit)
        for key, unit in (("mean_samples_per_second", "samples/s"), ("mean_tokens_per_second", "tokens/s"))
        if body[key] is not None
    ]
    if throughput:
        rows.append(_fact("throughput", "mean throughput", ", ".join(throughput), None, "curves"))
    rows.append(
        _fact(
            "anomalies",
            "non-finite / overflow records",
            f"{body['nonfinite_records']} / {body['overflow_records']}",
            [body["nonfinite_records"], body["overflow_records"]],
            "curves",
        )
    )
    if run.captures is not None:
        rows.append(_fact("captures", "captures", str(len(run.captures)), len(run.captures), "captures"))
    items = [
        f'<li class="finding topic-{esc(topic)}"><a href="#{SECTION_OF_TOPIC[topic]}">{esc(text)}</a></li>'
        for topic, text in _grouped_findings(report)
    ]
    shown = "".join(items[:MAX_FINDINGS])
    more = (
        f'<details><summary>{len(items) - MAX_FINDINGS} more findings</summary><ul class="findings">'
        f"{''.join(items[MAX_FINDINGS:])}</ul></details>"
        if len(items) > MAX_FINDINGS
        else ""
    )
    found = f'<ul class="findings">{shown}</ul>{more}' if items else '<p class="note">No findings.</p>'
    return _section("glance", f'<table class="facts">{"".join(rows)}</table><h3>Findings</h3>{found}')


_TOPIC_ORDER = (TOPIC_RANKS, TOPIC_ATTEMPTS, TOPIC_CURVES, TOPIC_LOGS)
_RANK_FINDING = re.compile(r"^rank (\d+): (.*)$", re.S)


def _grouped_findings(report: Report) -> list[tuple[str, str]]:
    """The report's findings, the verdict's first; one line for what several ranks found
    alike ("ranks 0-63: overflow at steps 3000")."""
    grouped: dict[tuple[str, str], list[int]] = {}
    for finding in findings(report):
        match = _RANK_FINDING.match(finding.text)
        rest = match[2] if match else finding.text
        ranks = grouped.setdefault((finding.topic, rest), [])
        if match:
            ranks.append(int(match[1]))
    ordered = sorted(grouped.items(), key=lambda item: _TOPIC_ORDER.index(item[0][0]))
    return [(topic, f"{_ranks_text(ranks)}: {rest}" if ranks else rest) for (topic, rest), ranks in ordered]


def _ranks_text(ranks: list[int]) -> str:
    """`rank 3`, `ranks 0, 2, 5`, or `ranks 0-63 (64)` for a long consecutive run."""
    ranks = sorted(set(ranks))
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    if len(ranks) > 4 and ranks[-1] - ranks[0] + 1 == len(ranks):
        return f"ranks {ranks[0]}–{ranks[-1]} ({len(ranks)})"
    if len(ranks) > 8:
        return f"{len(ranks)} ranks ({', '.join(map(str, ranks[:6]))}, …)"
    return "ranks " + ", ".join(map(str, ranks))


def _bottleneck_fact(body: dict[str, Any]) -> str:
    verdict = body.get("bottleneck")
    top = verdict.get("bottleneck") if verdict else None
    if top is not None:
        shown = (
            f"{top['label']}, {top['section']}: the job lost {_seconds(top['lost_s'])} "
            f"({top['share_of_job']:.1%} of its wall time) waiting for it"
        )
        return _fact("bottleneck", "holds the job back", shown, top["lost_s"], "ranks").replace(
            "<tr ", f'<tr data-rank="{top["rank"]}" data-section="{esc(top["section"])}" ', 1
        )
    if body.get("holds_back"):
        return _fact("bottleneck", "holds the job back", f"{body['holds_back']} (step time)", None, "ranks")
    if verdict is not None and verdict.get("rises"):
        named = ", ".join(rise["label"] for rise in verdict["rises"])
        return _fact("bottleneck", "holds the job back", f"none named; in-step time rose on {named}", None, "ranks")
    return _fact("bottleneck", "holds the job back", "no rank", None, "ranks")


# --- curves --------------------------------------------------------------------------------


def _rank_of(index: int, rank: int | None) -> int:
    return rank if rank is not None else index


def _curve_marks(run: RunData) -> list[Mark]:
    marks: list[Mark] = []
    job = run.job
    if job is not None:
        for attempt in job["attempts"][1:]:
            first = int(attempt.get("resume_step") or 0) + 1
            marks.append(Mark("restart", first, None, f"attempt {attempt['attempt']} resumed at step {first}"))
    else:
        for summary in run.report.series:
            for restart in summary.restarts:
                marks.append(
                    Mark(
                        "restart",
                        restart.to_step,
                        None,
                        f"{summary.label}: restart, step {restart.from_step} back to {restart.to_step}",
                    )
                )
    for capture in run.captures or []:
        if capture.get("first_step") is not None:
            marks.append(
                Mark(
                    "capture",
                    capture["first_step"],
                    capture.get("last_step"),
                    f"capture ({capture.get('trigger')}, rank {capture.get('rank')}): steps "
                    f"{capture['first_step']}-{capture.get('last_step')}",
                )
            )
    for one in run.series:
        for alert in one.alerts:
            if alert.step is not None:
                marks.append(
                    Mark("alert", alert.step, None, f"{one.label}: alert at step {alert.step}: {alert.describe()}")
                )
        for step in one.sink.nonfinite_steps:
            marks.append(Mark("nonfinite", step, None, f"{one.label}: non-finite value at step {step}"))
        for step in one.sink.overflow_steps:
            marks.append(Mark("overflow", step, None, f"{one.label}: overflow at step {step}"))
    return marks


def _many_or_few(
    columns: list[tuple[str, int, Column]], axis: Axis, emphasis: str | None
) -> tuple[list[Line], Band | None, Hover]:
    """Lines per rank (few ranks), or the median with its range and the named rank's line."""
    hover = Hover([axis.centre(i) for i in range(axis.bins)])
    if len(columns) <= MAX_LINES:
        lines = [Line(label, thinned(c.xs, c.ys, axis), index) for label, index, c in columns]
        for label, _, column in columns:
            means = column_means(column.xs, column.ys, axis)
            hover.series.append((label, [means.get(i) for i in range(axis.bins)]))
        return lines, None, _compact(hover)
    pooled = band(((c.xs, c.ys) for _, _, c in columns), axis)
    lines = [
        Line(label, thinned(c.xs, c.ys, axis), index, emphasis=True) for label, index, c in columns if label == emphasis
    ]
    at = {axis.bin(x): i for i, x in enumerate(pooled.xs)}
    for name, values in (("median", pooled.medians), ("lowest", pooled.lows), ("highest", pooled.highs)):
        hover.series.append((name, [values[at[i]] if i in at else None for i in range(axis.bins)]))
    for label, _, column in columns:
        if label == emphasis:
            means = column_means(column.xs, column.ys, axis)
            hover.series.append((label, [means.get(i) for i in range(axis.bins)]))
    return lines, pooled, _compact(hover)


def _compact(hover: Hover) -> Hover:
    """Only the columns where some series has a value."""
    keep = [i for i in range(len(hover.xs)) if any(values[i] is not None for _, values in hover.series)]
    return Hover([hover.xs[i] for i in keep], [(label, [values[i] for i in keep]) for label, values in hover.series])


def _named_rank(run: RunData) -> str | None:
    holds = run.body.get("holds_back")
    return holds if isinstance(holds, str) else None


def _curves(run: RunData) -> str:
    present = [name for name in CURVES if any(name in one.sink.curves for one in run.series)]
    if not present:
        return _section("curves", '<p class="note">These logs hold no training values.</p>')
    steps = [x for one in run.series for name in present if name in one.sink.curves for x in one.sink.curves[name].xs]
    axis = Axis.over(steps, CURVE_COLUMNS)
    marks = _curve_marks(run)
    kinds = [kind for kind in charts.MARK_KINDS if any(mark.kind == kind for mark in marks)]
    named = _named_rank(run)
    figures = []
    for name in present:
        columns = [
            (one.label, index, one.sink.curves[name]) for index, one in enumerate(run.series) if name in one.sink.curves
        ]
        lines, pooled, hover = _many_or_few(columns, axis, named)
        title, unit = _TITLES[name]
        who = f"{len(columns)} rank(s)" if pooled is None else f"median and range of {len(columns)} ranks"
        figures.append(
            charts.line_chart(
                f"chart-{name.replace('_', '-') if name != tm.STEP_TIME else 'step-time'}",
                f"{title} ({who})",
                unit,
                axis,
                "step",
                lines,
                pooled,
                marks,
                hover,
                log_y=name == tm.STEP_TIME,
            )
        )
    missing = [name for name in (tm.MFU, tm.GRAD_NORM) if name not in present]
    note = (
        f'<p class="note">Not in these logs: {esc(", ".join(missing))} (MFU needs `model_flops` or the model '
        "config; grad norm the optimizer's reading, docs/time.md).</p>"
        if missing
        else ""
    )
    return _section("curves", charts.marks_legend(kinds) + "".join(figures) + note)


# --- across ranks --------------------------------------------------------------------------


def _ranks(run: RunData) -> str:
    parts = []
    verdict_lines = stragglers.lines(run.report.bottleneck)
    if verdict_lines:
        top = run.report.bottleneck.bottleneck if run.report.bottleneck is not None else None
        items = "".join(
            f'<li class="{"verdict-top" if i == 1 and top is not None else ""}">{esc(line.strip())}</li>'
            for i, line in enumerate(verdict_lines)
        )
        parts.append(f'<div class="verdict"><p>{esc(stragglers.TITLE)}</p><ul>{items}</ul></div>')
    else:
        parts.append(
            '<p class="note">No verdict: it needs two or more ranks whose logs carry `sections` over the same '
            "sampled windows (docs/stragglers.md).</p>"
        )
    parts.append(_heatmaps(run))
    parts.append(_time_bars(run))
    return _section("ranks", "".join(parts))


def _heatmaps(run: RunData) -> str:
    ranked = [(_rank_of(i, one.rank), one) for i, one in enumerate(run.series)]
    rows = RankRows.of([rank for rank, _ in ranked], HEAT_ROWS)
    if not rows.ranks:
        return ""
    step_times = {
        rank: covering(one.sink.curves[tm.STEP_TIME].xs, one.sink.curves[tm.STEP_TIME].ys)
        for rank, one in ranked
        if tm.STEP_TIME in one.sink.curves
    }
    windows = {rank: _windows(one.sink.sections) for rank, one in ranked if one.sink.sections.steps}
    covered = [*step_times.values(), *(by_section[HEAT_SECTIONS[0]] for by_section in windows.values())]
    span = Axis.over([x for records in covered for first, last, _ in records for x in (first, last)], 1)
    # A column is at least one step wide: a short run is drawn step by step.
    axis = Axis(span.low, span.high, max(1, min(HEAT_COLUMNS, int(span.high - span.low) + 1)))
    named = _named_row(run, rows)
    figures = []
    if step_times:
        figures.append(
            charts.heatmap(
                "heat-step-time",
                "Step time by rank and step (ms; colours leave out each rank's first record, which holds compilation)",
                heat_cells(step_times, rows, axis),
                rows,
                axis,
                HeatScale.of([value for records in step_times.values() for _, _, value in records[1:]]),
                "step",
                "ms",
                named_row=named,
            )
        )
    for section in HEAT_SECTIONS:
        shares = {rank: by_section[section] for rank, by_section in windows.items()}
        if not any(value > 0 for records in shares.values() for _, _, value in records):
            figures.append(
                f'<p class="note" id="heat-{section}-none">No {esc(section)} time in the sampled windows.</p>'
            )
            continue
        cells = [cell for cell in heat_cells(shares, rows, axis) if cell.value > 0]
        figures.append(
            charts.heatmap(
                f"heat-{section.replace('_', '-')}",
                f"{section}: share of each sampled window's wall time, by rank and step",
                cells,
                rows,
                axis,
                HeatScale.of([], fixed=(0.0, 100.0)),
                "step",
                "%",
                named_row=named,
            )
        )
    if not windows:
        figures.append(
            '<p class="note">No `sections` in these logs (written by every rank since sections were added).</p>'
        )
    return "".join(figures)


def _named_row(run: RunData, rows: RankRows) -> int | None:
    """The heatmap row of the rank the verdict names."""
    verdict = run.report.bottleneck
    top = verdict.bottleneck if verdict is not None else None
    if top is None or top.rank not in rows.ranks:
        return None
    return rows.row(rows.ranks.index(top.rank))


def _windows(history: SectionHistory) -> dict[str, list[Covered]]:
    """Each heatmap section's share (%) of every sampled window, over the steps it covers."""
    width = len(COLUMNS)
    window_at, steps_at = COLUMNS.index(WINDOW_KEY), COLUMNS.index(STEPS_KEY)
    found: dict[str, list[Covered]] = {section: [] for section in HEAT_SECTIONS}
    for i, step in enumerate(history.steps):
        row = history.rows[i * width : (i + 1) * width]
        if row[window_at] <= 0 or row[steps_at] <= 0:
            continue
        for section in HEAT_SECTIONS:
            share = 100.0 * row[COLUMNS.index(section)] / row[window_at]
            found[section].append((step - row[steps_at] + 1, float(step), share))
    return found


def _time_bars(run: RunData) -> str:
    timed = sorted(
        ((s, s["time"]) for s in run.body["series"] if s.get("time")),
        key=lambda pair: (pair[0]["rank"] is None, pair[0]["rank"] or 0),
    )
    if not timed:
        return '<p class="note">No `time` objects in these logs: where each rank\'s time went is not known.</p>'
    rows = RankRows.of(range(len(timed)), MAX_BARS)
    bars = []
    for row in range(rows.count):
        members = [timed[position] for position in rows.members(row)]
        totals: dict[str, float] = dict.fromkeys(TIME_CATEGORIES, 0.0)
        for _, time_ in members:
            totals["productive"] += time_["productive_s"]
            for phase, seconds in time_["lost_s"].items():
                totals[phase if phase in totals else OTHER_PHASES] += seconds
            totals[UNACCOUNTED] += max(0.0, time_["wall_s"] - time_["productive_s"] - sum(time_["lost_s"].values()))
        count = len(members)
        first, last = members[0][0], members[-1][0]
        if count == 1:
            label = first["label"]
        elif first["rank"] is not None and last["rank"] is not None:
            label = f"ranks {first['rank']}–{last['rank']} (mean)"
        else:
            label = f"{first['label']}–{last['label']} (mean)"
        wall = sum(t["wall_s"] for _, t in members) / count
        bars.append(Bar(label, [(name, seconds / count) for name, seconds in totals.items()], _seconds(wall)))
    return charts.stacked_bars(
        "bars-time",
        "Where each rank's time went (its `time` object: productive, and the seconds lost by phase)",
        bars,
        TIME_CATEGORIES,
        "s",
        note="These are the report's per-series ledgers (docs/time.md); a rank that waits for another inside its "
        "step counts that wait as productive: the verdict above compares the ranks.",
    )


# --- attempts ------------------------------------------------------------------------------

_DOWNTIME_ORDER = ("no_process", "startup", "checkpoint_load", "compile")


def _attempts(job: dict[str, Any] | None) -> str:
    if job is None:
        return _section(
            "attempts",
            '<p class="note">No job ledger (*.job.rank_N.ledger) beside these logs: one attempt as far as '
            "they tell (docs/restarts.md).</p>",
        )
    attempts = job["attempts"]
    origin = min(a["start"] for a in attempts)
    spans = []
    previous_end: float | None = None
    for attempt in attempts:
        label = f"attempt {attempt['attempt']}"
        steps = f"steps {attempt['resume_step'] + 1}..{attempt['last_step']}" if attempt["steps"] else "no step"
        spans.append(
            Span(
                0,
                attempt["start"] - origin,
                attempt["end"] - origin,
                f"o-{attempt['outcome']}",
                f"{label}: {attempt['outcome']}"
                + (f" ({attempt['reason']})" if attempt.get("reason") else "")
                + f", {steps}, {attempt['lost_steps']} lost, ranks {','.join(map(str, attempt['ranks']))}",
                label,
            )
        )
        downtime = attempt.get("downtime") or {}
        if previous_end is not None and downtime:
            at = previous_end - origin
            for category in _DOWNTIME_ORDER:
                seconds = downtime.get(category) or 0.0
                if seconds > 0:
                    spans.append(
                        Span(1, at, at + seconds, f"d-{category}", f"before {label}: {category} {_seconds(seconds)}")
                    )
                    at += seconds
        previous_end = attempt["end"]
    legend = (
        '<div class="legend">'
        + "".join(
            f'<span><i class="swatch o-{o}"></i>{o}</span>'
            for o in ("completed", "running", "stopped", "killed", "crashed")
        )
        + "".join(f'<span><i class="swatch d-{c}"></i>downtime: {c}</span>' for c in _DOWNTIME_ORDER)
        + "</div>"
    )
    figure = charts.timeline(
        "timeline-attempts",
        f"Attempts of job {job['job_id']} and the downtime between them",
        ["attempts", "downtime"],
        spans,
        "seconds since the first attempt began",
        legend,
    )
    header = "<tr><th>attempt</th><th>ranks</th><th>start</th><th>end</th><th>ended</th><th>steps</th><th>lost steps</th><th>downtime before</th></tr>"
    rows = "".join(_attempt_row(a) for a in attempts)
    totals = job["totals"]
    wall = totals["wall_seconds"]
    category_bar = charts.stacked_bars(
        "bars-job",
        f"The job's {_seconds(wall)}: goodput {_share(totals['goodput'])}, badput by category (rank {totals['rank']}'s clocks)",
        [Bar("job", list(totals["seconds"].items()), _seconds(wall))],
        list(totals["seconds"]),
        "s",
        note="Categories map to ml-goodput-measurement's BadputType: "
        + ", ".join(f"{k} = {v}" for k, v in totals["badput_types"].items() if v),
    )
    summary = (
        f'<p class="attempts-summary" data-lost-steps="{totals["lost_steps"]}">{len(attempts)} attempt(s), '
        f"{totals['lost_steps']} steps lost, {esc(_seconds(totals['downtime_seconds']))} of downtime.</p>"
    )
    return _section("attempts", summary + figure + f'<table class="grid-table">{header}{rows}</table>' + category_bar)


def _attempt_row(attempt: dict[str, Any]) -> str:
    ended = attempt["outcome"] + (f" ({attempt['reason']})" if attempt.get("reason") else "")
    cluster_fault = what_ended(attempt)  # cluster/: the ClusterD fault that ended it
    if cluster_fault is not None:
        ended += f"; ClusterD: {cluster_fault}"
    steps = f"{attempt['resume_step'] + 1}..{attempt['last_step']}" if attempt["steps"] else "-"
    cells = (
        attempt["attempt"],
        len(attempt["ranks"]),
        local_time(attempt["start"], "%H:%M:%S"),
        local_time(attempt["end"], "%H:%M:%S"),
        ended,
        steps,
        attempt["lost_steps"],
        _seconds((attempt.get("downtime") or {}).get("total")),
    )
    return (
        f'<tr class="attempt" data-attempt="{attempt["attempt"]}" data-lost-steps="{attempt["lost_steps"]}">'
        + "".join(f"<td>{esc(cell)}</td>" for cell in cells)
        + "</tr>"
    )


# --- devices -------------------------------------------------------------------------------


def _devices(run: RunData) -> str:
    origin = run.first_time_stamp
    figures = []
    for key, title, unit in DEVICE_READINGS:
        columns = [(one.label, i, one.sink.devices[key]) for i, one in enumerate(run.series) if key in one.sink.devices]
        if not columns or origin is None:
            continue
        restarts = _restarts_in_time(run, origin)
        shifted = [(label, i, _since(column, origin, restarts)) for label, i, column in columns]
        axis = Axis.over([x for _, _, c in shifted for x in c.xs], CURVE_COLUMNS)
        lines, pooled, hover = _many_or_few(shifted, axis, _named_rank(run))
        figures.append(
            charts.line_chart(
                f"device-{key.replace('_', '-')}",
                f"{title} by rank",
                unit,
                axis,
                "seconds since the first record",
                lines,
                pooled,
                [Mark("restart", at, None, text) for at, text in restarts],
                hover,
                height=200,
            )
        )
    if not figures:
        return _section(
            "devices",
            '<p class="note">No device readings in these logs (`device_monitor: true` writes them: docs/devices.md).</p>',
        )
    return _section("devices", "".join(figures))


def _restarts_in_time(run: RunData, origin: float) -> list[tuple[float, str]]:
    """When each attempt after the first began, in seconds since `origin`, from the ledger."""
    attempts = run.job["attempts"][1:] if run.job is not None else []
    return [(a["start"] - origin, f"attempt {a['attempt']} began") for a in attempts]


def _since(column: Column, origin: float, restarts: list[tuple[float, str]]) -> Column:
    """Readings in seconds since `origin`, with a gap (NaN) where an attempt began: the
    line does not pretend there were readings while no process ran."""
    shifted = Column()
    breaks = sorted(at for at, _ in restarts)
    for stamp, value in zip(column.xs, column.ys):
        at = stamp - origin
        while breaks and at >= breaks[0]:
            if shifted.xs:
                shifted.xs.append(breaks[0])
                shifted.ys.append(math.nan)
            breaks.pop(0)
        shifted.xs.append(at)
        shifted.ys.append(value)
    return shifted


# --- captures ------------------------------------------------------------------------------


def _captures(captures: list[dict[str, Any]] | None) -> str:
    if captures is None:
        return _section(
            "captures",
            '<p class="note">Not looked for: give `--captures DIR` (the job\'s alert_config.capture.path).</p>',
        )
    if not captures:
        return _section("captures", '<p class="note">No captures under the folder given.</p>')
    header = "<tr><th>time</th><th>rank</th><th>step</th><th>trigger</th><th>kinds</th><th>profiled steps</th><th>status</th><th>folder</th></tr>"
    rows = "".join(
        f'<tr class="capture"><td>{esc(local_time(c.get("time_stamp") or 0))}</td><td>{esc(c.get("rank"))}</td>'
        f"<td>{esc(c.get('step'))}</td><td>{esc(c.get('trigger'))}</td><td>{esc(','.join(c.get('kinds') or []) or '-')}</td>"
        f"<td>{esc(_profiled(c))}</td><td>{esc(c.get('status'))}</td><td><code>{esc(c['folder'])}</code></td></tr>"
        for c in captures
    )
    analysed = [c for c in captures if c.get("traces")][-MAX_TIMELINES:]
    figures = [_operator_timeline(c, index) for index, c in enumerate(analysed)]
    return _section("captures", f'<table class="grid-table">{header}{rows}</table>' + "".join(figures))


def _profiled(capture: dict[str, Any]) -> str:
    first, last = capture.get("first_step"), capture.get("last_step")
    return f"{first}-{last}" if first is not None else "-"


def _operator_timeline(capture: dict[str, Any], index: int) -> str:
    trace = Path(capture["traces"][0])
    try:
        size = trace.stat().st_size
        if size > MAX_TRACE_BYTES:
            return (
                f'<p class="note">{esc(trace)}: {size / 1e6:.0f} MB, too large to draw here; open it in Perfetto.</p>'
            )
        ops = trace_operators(trace)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return f'<p class="note">{esc(trace)}: cannot read ({esc(exc)})</p>'
    windows = capture.get("step_windows_ns") or []
    origin = windows[0][1] if windows else (ops[0][0] if ops else 0)
    busy: dict[str, int] = {}
    for _, duration, name in ops:
        busy[short_name(name)] = busy.get(short_name(name), 0) + duration
    lanes = sorted(busy, key=lambda name: -busy[name])[:MAX_OPERATOR_LANES]
    lane_of = {name: i + 1 for i, name in enumerate(lanes)}
    spans = [
        Span(0, (start - origin) / 1e6, (end - origin) / 1e6, f"w{i % 2}", f"step {step}", f"step {step}")
        for i, (step, start, end) in enumerate(windows)
    ]
    # Operators closer than a pixel merge into one span per lane: the drawing stays bounded.
    extent = max((s.end for s in spans), default=0.0) or max(((s + d - origin) / 1e6 for s, d, _ in ops), default=1.0)
    pixel = extent / 700
    merged: dict[str, list[list[float]]] = {}
    for start, duration, name in ops:
        lane = short_name(name)
        if lane not in lane_of:
            continue
        left, right = (start - origin) / 1e6, (start + duration - origin) / 1e6
        runs = merged.setdefault(lane, [])
        if runs and left - runs[-1][1] < pixel:
            runs[-1][1] = max(runs[-1][1], right)
            runs[-1][2] += 1
        else:
            runs.append([left, right, 1])
    for lane, runs in merged.items():
        spans += [
            Span(lane_of[lane], left, right, "op", f"{lane}: {count} call(s), {right - left:.3f} ms")
            for left, right, count in runs
        ]
    return charts.timeline(
        f"ops-{index}",
        f"Capture {capture.get('trigger')} at step {capture.get('step')} (rank {capture.get('rank')}): "
        f"{len(ops)} CPU operators in steps {_profiled(capture)}, the {len(lanes)} busiest",
        ["profiled steps", *lanes],
        spans,
        "ms since the first profiled step began",
    )


# --- logs ----------------------------------------------------------------------------------


def _logs(run: RunData) -> str:
    rows = "".join(
        f"<tr><td>{esc(s.label)}</td><td>{s.records}</td><td>{esc(', '.join(s.files))}</td></tr>"
        for s in run.report.series[:MAX_BARS]
    )
    more = (
        f'<p class="note">… and {len(run.report.series) - MAX_BARS} more series.</p>'
        if len(run.report.series) > MAX_BARS
        else ""
    )
    notes = [f for f in findings(run.report) if f.topic == TOPIC_LOGS]
    listed = "".join(f"<li>{esc(f.text)}</li>" for f in notes[:MAX_FINDINGS])
    return _section(
        "logs",
        f'<table class="grid-table"><tr><th>series</th><th>records</th><th>files</th></tr>{rows}</table>{more}'
        + (f"<ul>{listed}</ul>" if listed else ""),
    )


__all__ = ["CSP", "build_page"]
