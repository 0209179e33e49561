"""The run's page: one HTML document with its styles, scripts and charts inline.

Sections, in order: the run at a glance (every figure from the JSON report, its exact value
in a `data-value` attribute), the curves against the step, the job across ranks (the
verdict, heatmaps of step time and of each section, where each rank's time went), the
job across attempts, device readings, captures, and the logs read. Every element is built
with markup.py, which escapes every string on its way in. A Content-Security-Policy forbids
every fetch and lets only the page's own scripts and stylesheet run, by their SHA-256: the
page cannot load anything, nor run a script a string of its data smuggled in, and
page_errors.js writes any error or blocked request into the page itself, where a test (or a
reader) sees it.
"""

from __future__ import annotations

import functools
import json
import math
import re
import time
from collections.abc import Callable
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
from otel_mindformers.analysis.html_report.charts import Bar, HeatScale, Hover, Line, Mark, Span, fmt
from otel_mindformers.analysis.html_report.markup import Child, Html, csp_source, el, inline, join
from otel_mindformers.analysis.html_report.run_data import CURVES, DEVICE_READINGS, Column, RunData
from otel_mindformers.analysis.report import (
    BUILT_IN_PHASES,
    OTHER_PHASES,
    STARTUP_FROM,
    TOPIC_ATTEMPTS,
    TOPIC_CURVES,
    TOPIC_LOGS,
    TOPIC_RANKS,
    Report,
    findings,
)
from otel_mindformers.captures.offline.profile_trace import TraceError, short_name, trace_operators
from otel_mindformers.cluster.offline.attempt_fault import what_ended
from otel_mindformers.names import straggler_names as sections
from otel_mindformers.names import training as tm
from otel_mindformers.names.phase_names import PHASE_CHECKPOINT_LOAD, PHASE_CHECKPOINT_SAVE
from otel_mindformers.outputs.jsonl_reader import local_time
from otel_mindformers.restarts.offline.attempts_report import left_out_lines
from otel_mindformers.stragglers.offline import verdict as stragglers
from otel_mindformers.stragglers.offline.verdict import COLUMNS, SectionHistory
from otel_mindformers.stragglers.sections import STEPS_KEY, WINDOW_KEY
from otel_mindformers.version import __version__

_SCRIPTS = ("page_errors.js", "page_hover.js")  # inline, in this order: the error box first
_STYLE = "page.css"
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
# The job's categories named otherwise than their counterparts in the ranks' bar: the two
# bars colour the same time alike; the job's own (lost_progress, no_process) come after.
JOB_COUNTERPARTS = {
    "checkpoint_load": PHASE_CHECKPOINT_LOAD,
    "checkpoint_save": PHASE_CHECKPOINT_SAVE,
    "user_phases": OTHER_PHASES,
    "other": UNACCOUNTED,
}


def _job_colours(categories: list[str]) -> dict[str, int]:
    colours, spare = {}, len(TIME_CATEGORIES)
    for name in categories:
        counterpart = JOB_COUNTERPARTS.get(name, name)
        if counterpart in TIME_CATEGORIES:
            colours[name] = TIME_CATEGORIES.index(counterpart)
        else:
            colours[name], spare = spare, spare + 1
    return colours


# What a curve the page leaves out needs, in the run's monitor_config or its loop.
_NEEDS = {
    tm.MFU: "MFU needs FLOPs per token, from the model's config or `flops_per_token`, and the device's peak, "
    "known or `peak_tflops`: docs/time.md",
    tm.GRAD_NORM: "the gradient norm needs `grad_monitor: True` or a train cell that returns it, or in a custom "
    "loop `run.log(grads=...)`: docs/custom_loops.md",
}


def _asset(name: str) -> str:
    return resources.files(__package__).joinpath(name).read_text(encoding="utf-8")


@functools.cache
def content_security_policy() -> str:
    """Nothing fetched, and only the page's own inline scripts and stylesheet run, named by
    their SHA-256: a script that data smuggled into the page would not run. `base-uri` and
    `form-action` are not covered by `default-src`: a smuggled `<base>` or form could still
    point the page's links or a submission elsewhere."""
    scripts = " ".join(csp_source(_asset(name)) for name in _SCRIPTS)
    return (
        f"default-src 'none'; style-src {csp_source(_asset(_STYLE))}; script-src {scripts}; "
        "base-uri 'none'; form-action 'none'"
    )


def build_page(run: RunData) -> str:
    """The whole document."""
    job = run.job
    title = f"Training run {job['job_id']}" if job else "Training run"
    head = el(
        "head",
        el("meta", charset="utf-8"),
        el("meta", http_equiv="Content-Security-Policy", content=content_security_policy()),
        el("meta", name="viewport", content="width=device-width, initial-scale=1"),
        el("meta", name="generator", content=f"otel-mindformers {__version__}"),
        el("title", title),
        inline("script", _asset(_SCRIPTS[0])),
        inline("style", _asset(_STYLE)),
    )
    body = el(
        "body",
        el(
            "header",
            el("h1", title),
            el("p", _subtitle(run), class_="sub"),
            el("pre", id="page-errors", hidden=True),
            _nav(),
        ),
        el(
            "main",
            _glance(run),
            _curves(run),
            _ranks(run),
            _attempts(job),
            _devices(run),
            _captures(run.captures),
            _logs(run),
        ),
        inline("script", _asset(_SCRIPTS[1])),
    )
    return "<!DOCTYPE html>\n" + el("html", head, body, lang="en")


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


def _nav() -> Html:
    return el("nav", [el("a", text, href=f"#{key}") for key, text in _NAV])


def _section(key: str, *inner: Child) -> Html:
    return el("section", el("h2", dict(_NAV)[key]), *inner, id=key)


def _note(text: str, **attributes: str) -> Html:
    return el("p", text, class_="note", **attributes)


# --- at a glance ---------------------------------------------------------------------------


def _fact(
    key: str, label: str, shown: str, value: Any = None, link: str | None = None, **row: str | int | None
) -> Html:
    """One figure of the glance table; `value` (the JSON report's, exactly) in data-value."""
    data = json.dumps(value) if value is not None else None
    text = el("a", shown, href=f"#{link}") if link else shown
    return el("tr", el("th", label), el("td", text, data_value=data), id=f"fact-{key}", **row)


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


def _glance(run: RunData) -> Html:
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
    rows.append(_bottleneck_fact(body, max(world, len(ranks))))
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
        el("li", el("a", text, href=f"#{SECTION_OF_TOPIC[topic]}"), class_=f"finding topic-{topic}")
        for topic, text in _grouped_findings(report)
    ]
    more = (
        el(
            "details",
            el("summary", f"{len(items) - MAX_FINDINGS} more findings"),
            el("ul", items[MAX_FINDINGS:], class_="findings"),
        )
        if len(items) > MAX_FINDINGS
        else None
    )
    found = join(el("ul", items[:MAX_FINDINGS], class_="findings"), more) if items else _note("No findings.")
    return _section("glance", el("table", rows, class_="facts"), el("h3", "Findings"), found)


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


def _bottleneck_fact(body: dict[str, Any], ranks: int) -> Html:
    """Who holds the job back: named (class `named`, in red) only when a rank is."""
    verdict = body.get("bottleneck")
    top = verdict.get("bottleneck") if verdict else None
    label = "holds the job back"
    if top is not None:
        shown = (
            f"{top['label']}, {top['section']}: the job lost {_seconds(top['lost_s'])} "
            f"({top['share_of_job']:.1%} of its wall time) waiting for it"
        )
        return _fact(
            "bottleneck", label, shown, top["lost_s"], "ranks", class_="named", data_rank=top["rank"],
            data_section=top["section"],
        )  # fmt: skip
    if body.get("holds_back"):
        return _fact("bottleneck", label, f"{body['holds_back']} (step time)", None, "ranks", class_="named")
    bound = verdict.get("input_bound") if verdict else None
    if bound is not None:
        shown = (
            f"no rank: every rank is input-bound (each waited for its data at least {_seconds(bound['waited_s'])}, "
            f"{bound['share_of_job']:.1%} of the job's wall time)"
        )
        return _fact("bottleneck", label, shown, None, "ranks", data_input_bound=json.dumps(bound["share_of_job"]))
    if verdict is not None and verdict.get("rises"):
        named = ", ".join(rise["label"] for rise in verdict["rises"])
        return _fact("bottleneck", label, f"none named; in-step time rose on {named}", None, "ranks")
    if ranks <= 1:
        return _fact("bottleneck", label, "one rank: no other rank to hold back", None, "ranks")
    return _fact("bottleneck", label, "no rank", None, "ranks")


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
        for index, step in _steps_alone(columns, axis).items():
            hover.xs[index] = step
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


def _steps_alone(columns: list[tuple[str, int, Column]], axis: Axis) -> dict[int, float]:
    """Fewer steps than columns (a short run): each column holding one step reads out that
    step, not the column's centre ("at 5.999" for step 6). Longer runs skip the pass."""
    if axis.high - axis.low >= axis.bins:
        return {}
    seen: dict[int, set[float]] = {}
    for _, _, column in columns:
        for index, x in zip(axis.bins_of(column.xs), column.xs):
            seen.setdefault(index, set()).add(x)
    return {index: xs.pop() for index, xs in seen.items() if len(xs) == 1}


def _compact(hover: Hover) -> Hover:
    """Only the columns where some series has a value."""
    keep = [i for i in range(len(hover.xs)) if any(values[i] is not None for _, values in hover.series)]
    return Hover([hover.xs[i] for i in keep], [(label, [values[i] for i in keep]) for label, values in hover.series])


def _named_rank(run: RunData) -> str | None:
    holds = run.body.get("holds_back")
    return holds if isinstance(holds, str) else None


def _curves(run: RunData) -> Html:
    present = [name for name in CURVES if any(name in one.sink.curves for one in run.series)]
    if not present:
        return _section("curves", _note("These logs hold no training values."))
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
    missing = [f"{name} ({_NEEDS[name]})" for name in (tm.MFU, tm.GRAD_NORM) if name not in present]
    note = _note(f"Not in these logs: {'; '.join(missing)}.") if missing else None
    return _section("curves", charts.marks_legend(kinds), figures, note)


# --- across ranks --------------------------------------------------------------------------


def _ranks(run: RunData) -> Html:
    parts: list[Child] = []
    verdict_lines = stragglers.lines(run.report.bottleneck)
    if verdict_lines:
        verdict = run.report.bottleneck
        top = verdict.bottleneck if verdict is not None else None
        headline = 1 + (verdict is not None and verdict.input_bound is not None)  # the line naming a rank
        items = [
            el("li", line.strip(), class_="verdict-top" if i == headline and top is not None else None)
            for i, line in enumerate(verdict_lines)
        ]
        parts.append(el("div", el("p", stragglers.TITLE), el("ul", items), class_="verdict"))
    else:
        parts.append(
            _note(
                "No verdict: it needs two or more ranks whose logs carry `sections` over the same sampled windows "
                "(docs/stragglers.md)."
            )
        )
    parts.append(_heatmaps(run))
    parts.append(_time_bars(run))
    return _section("ranks", parts)


def _heatmaps(run: RunData) -> Html | None:
    ranked = [(_rank_of(i, one.rank), one) for i, one in enumerate(run.series)]
    rows = RankRows.of([rank for rank, _ in ranked], HEAT_ROWS)
    if not rows.ranks:
        return None
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
    figures: list[Html] = []
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
            figures.append(_note(f"No {section} time in the sampled windows.", id=f"heat-{section}-none"))
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
        figures.append(_note("No `sections` in these logs (written by every rank since sections were added)."))
    return join(figures)


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


def _time_bars(run: RunData) -> Html:
    timed = sorted(
        ((s, s["time"]) for s in run.body["series"] if s.get("time")),
        key=lambda pair: (pair[0]["rank"] is None, pair[0]["rank"] or 0),
    )
    if not timed:
        return _note("No `time` objects in these logs: where each rank's time went is not known.")
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
        f"step counts that wait as productive: the verdict above compares the ranks; {STARTUP_FROM}.",
    )


# --- attempts ------------------------------------------------------------------------------

_DOWNTIME_ORDER = ("no_process", "startup", "checkpoint_load", "compile")
_OUTCOMES = ("completed", "running", "stopped", "killed", "crashed")


def attempt_steps(attempt: dict[str, Any]) -> str:
    """The steps an attempt ran, `first..last`, from its `report --json` entry ("-": none)."""
    return f"{attempt['resume_step'] + 1}..{attempt['last_step']}" if attempt["steps"] else "-"


def _ended(attempt: dict[str, Any]) -> str:
    # A dash, not parentheses: a reason often holds its own (an exception's message, older
    # ledgers' "no end record (inferred …)"), and nested ones read badly.
    ended = attempt["outcome"] + (f" — {attempt['reason']}" if attempt.get("reason") else "")
    cluster_fault = what_ended(attempt)  # cluster/: the ClusterD fault that ended it
    return ended if cluster_fault is None else f"{ended}; ClusterD: {cluster_fault}"


# The attempts table: a header and how each attempt's cell reads, in order. A column is one
# entry here (its cell a class `col-<key>` for tests and styles).
ATTEMPT_COLUMNS: tuple[tuple[str, str, Callable[[dict[str, Any]], Child]], ...] = (
    ("attempt", "attempt", lambda a: a["attempt"]),
    ("ranks", "ranks", lambda a: len(a["ranks"])),
    ("start", "start", lambda a: local_time(a["start"], "%H:%M:%S")),
    ("end", "end", lambda a: local_time(a["end"], "%H:%M:%S")),
    ("ended", "ended", _ended),
    ("steps", "steps", attempt_steps),
    ("lost-steps", "lost steps", lambda a: a["lost_steps"]),
    ("downtime", "downtime before", lambda a: _seconds((a.get("downtime") or {}).get("total"))),
)


def _attempts(job: dict[str, Any] | None) -> Html:
    if job is None:
        return _section(
            "attempts",
            _note(
                "No job ledger (*.job.rank_N.ledger) beside these logs: one attempt as far as they tell "
                "(docs/restarts.md)."
            ),
        )
    attempts = job["attempts"]
    origin = min(a["start"] for a in attempts)
    spans = []
    previous_end: float | None = None
    for attempt in attempts:
        label = f"attempt {attempt['attempt']}"
        steps = f"steps {attempt_steps(attempt)}" if attempt["steps"] else "no step"
        spans.append(
            Span(
                0,
                attempt["start"] - origin,
                attempt["end"] - origin,
                f"o-{attempt['outcome']}",
                f"{label}: {_ended(attempt)}, {steps}, {attempt['lost_steps']} lost, "
                f"ranks {','.join(map(str, attempt['ranks']))}",
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
    legend = el(
        "div",
        [el("span", el("i", class_=f"swatch o-{outcome}"), outcome) for outcome in _OUTCOMES],
        [el("span", el("i", class_=f"swatch d-{category}"), f"downtime: {category}") for category in _DOWNTIME_ORDER],
        class_="legend",
    )
    figure = charts.timeline(
        "timeline-attempts",
        f"Attempts of job {job['job_id']} and the downtime between them",
        ["attempts", "downtime"],
        spans,
        "seconds since the first attempt began",
        legend,
    )
    header = el("tr", [el("th", title) for _, title, _ in ATTEMPT_COLUMNS])
    rows = [
        el(
            "tr",
            [el("td", cell(attempt), class_=f"col-{key}") for key, _, cell in ATTEMPT_COLUMNS],
            class_="attempt",
            data_attempt=attempt["attempt"],
            data_lost_steps=attempt["lost_steps"],
        )
        for attempt in attempts
    ]
    totals = job["totals"]
    wall = totals["wall_seconds"]
    category_bar = charts.stacked_bars(
        "bars-job",
        f"The job's {_seconds(wall)}: goodput {_share(totals['goodput'])}, badput by category (rank {totals['rank']}'s clocks)",
        [Bar("job", list(totals["seconds"].items()), _seconds(wall))],
        list(totals["seconds"]),
        "s",
        colours=_job_colours(list(totals["seconds"])),
        note="Categories map to ml-goodput-measurement's BadputType: "
        + ", ".join(f"{k} = {v}" for k, v in totals["badput_types"].items() if v)
        + f"; in each attempt, {STARTUP_FROM}.",
    )
    summary = el(
        "p",
        f"{len(attempts)} attempt(s), {totals['lost_steps']} steps lost, "
        f"{_seconds(totals['downtime_seconds'])} of downtime.",
        class_="attempts-summary",
        data_lost_steps=totals["lost_steps"],
    )
    left_out = [_note(line.strip()) for line in left_out_lines(job)]
    return _section(
        "attempts", summary, *left_out, figure, el("table", header, rows, class_="grid-table"), category_bar
    )


# --- devices -------------------------------------------------------------------------------


def _devices(run: RunData) -> Html:
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
            "devices", _note("No device readings in these logs (`device_monitor: true` writes them: docs/devices.md).")
        )
    return _section("devices", figures)


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


_CAPTURE_COLUMNS: tuple[tuple[str, Callable[[dict[str, Any]], Child]], ...] = (
    ("time", lambda c: local_time(c.get("time_stamp") or 0)),
    ("rank", lambda c: str(c.get("rank"))),
    ("step", lambda c: str(c.get("step"))),
    ("trigger", lambda c: str(c.get("trigger"))),
    ("kinds", lambda c: ",".join(map(str, c.get("kinds") or [])) or "-"),
    ("profiled steps", lambda c: _profiled(c)),
    ("status", lambda c: str(c.get("status"))),
    ("folder", lambda c: el("code", str(c["folder"]))),
)


def _captures(captures: list[dict[str, Any]] | None) -> Html:
    if captures is None:
        return _section(
            "captures", _note("Not looked for: give `--captures DIR` (the job's alert_config.capture.path).")
        )
    if not captures:
        return _section("captures", _note("No captures under the folder given."))
    header = el("tr", [el("th", title) for title, _ in _CAPTURE_COLUMNS])
    rows = [el("tr", [el("td", cell(c)) for _, cell in _CAPTURE_COLUMNS], class_="capture") for c in captures]
    analysed = [c for c in captures if c.get("traces")][-MAX_TIMELINES:]
    figures = [_operator_timeline(c, index) for index, c in enumerate(analysed)]
    return _section("captures", el("table", header, rows, class_="grid-table"), figures)


def _profiled(capture: dict[str, Any]) -> str:
    first, last = capture.get("first_step"), capture.get("last_step")
    return f"{first}-{last}" if first is not None else "-"


def _operator_timeline(capture: dict[str, Any], index: int) -> Html:
    trace = Path(capture["traces"][0])
    try:
        size = trace.stat().st_size
        if size > MAX_TRACE_BYTES:
            return _note(f"{trace}: {size / 1e6:.0f} MB, too large to draw here; open it in Perfetto.")
        ops = trace_operators(trace)
    except OSError as exc:
        return _note(f"{trace}: cannot read ({exc.strerror or exc})")
    except TraceError as exc:
        return _note(str(exc))
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


def _logs(run: RunData) -> Html:
    rows = [
        el("tr", el("td", s.label), el("td", s.records), el("td", ", ".join(s.files)))
        for s in run.report.series[:MAX_BARS]
    ]
    more = (
        _note(f"… and {len(run.report.series) - MAX_BARS} more series.") if len(run.report.series) > MAX_BARS else None
    )
    notes = [f for f in findings(run.report) if f.topic == TOPIC_LOGS]
    listed = [el("li", f.text) for f in notes[:MAX_FINDINGS]]
    header = el("tr", el("th", "series"), el("th", "records"), el("th", "files"))
    return _section("logs", el("table", header, rows, class_="grid-table"), more, el("ul", listed) if listed else None)


__all__ = ["ATTEMPT_COLUMNS", "attempt_steps", "build_page", "content_security_policy"]
