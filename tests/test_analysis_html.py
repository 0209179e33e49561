"""`report --html`: the run as one self-contained page (docs/analysis.md#report---html).

Fast: pages of the recorded logs under tests/fixtures/logs read back with the standard
library's HTML parser: nothing is fetched, the curves and their marks are drawn, bad input
fails as `report` fails; the binning that keeps the page bounded for thousands of ranks.
Slow: a real two-rank msrun job in which rank 1's data is slow, crashed and resumed, with
captures, opened in a real headless Chromium watched through the DevTools protocol: no
console message, no request, every chart drawn, rank 1 named, a screenshot; the page's
numbers are `report --json`'s. The size and speed budgets (64 ranks x 10,000 steps) are
measured by benchmarks/bench_html_report.py.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

from otel_mindformers.analysis.html_report import markup
from otel_mindformers.analysis.html_report.binning import Axis, RankRows, covering, heat_cells, runs, thinned
from otel_mindformers.analysis.html_report.page import content_security_policy
from otel_mindformers.captures.offline.profile_trace import short_name
from otel_mindformers.cli import main as cli_main
from otel_mindformers.core.step_record import StepRecord
from otel_mindformers.names import straggler_names as sections
from otel_mindformers.restarts.ledger_file import ledger_path, new_ledger
from otel_mindformers.stragglers.sections import STEPS_KEY, WINDOW_KEY
from tests.support import chromium, plot_pixels
from tests.support.capture_trace import wait_for_trace
from tests.support.html_dom import Element, parse
from tests.support.instrumented import REPO, child_env, free_port
from tests.support.paths import LOG_FIXTURES
from tests.support.restart_worker import private_dir

pytestmark = pytest.mark.analysis  # the offline commands: numpy 2's row runs them too


def _page(capsys, *arguments: str) -> Element:
    output = Path(arguments[arguments.index("--html") + 1])
    assert cli_main(["report", *arguments]) == 0
    assert f"wrote {output}" in capsys.readouterr().out
    return parse(output.read_text(encoding="utf-8"))


def _value(page: Element, fact: str):
    return json.loads(page.by_id(f"fact-{fact}").all("td")[0].attrs["data-value"])


def _series_paths(page: Element, chart: str) -> list[Element]:
    return page.by_id(chart).all("path", "series")


# --- fast: the page read back --------------------------------------------------------------


def test_the_page_is_self_contained_and_fetches_nothing(tmp_path, capsys):
    page = _page(capsys, str(LOG_FIXTURES / "multirank"), "--html", str(tmp_path / "run.html"))
    (policy,) = [m for m in page.all("meta") if m.attrs.get("http-equiv") == "Content-Security-Policy"]
    csp = content_security_policy()
    assert policy.attrs["content"] == csp and "default-src 'none'" in csp and "unsafe-inline" not in csp
    assert "base-uri 'none'" in csp and "form-action 'none'" in csp  # default-src covers neither
    assert not page.all("link") and not page.all("img") and not page.all("iframe")
    assert all("src" not in e.attrs for e in page.walk()), "an element loads something"
    anchors = [e.attrs["href"] for e in page.walk() if "href" in e.attrs]
    assert anchors and all(href.startswith("#") for href in anchors), anchors
    ids = {e.attrs["id"] for e in page.walk() if "id" in e.attrs}
    assert {href[1:] for href in anchors} <= ids, "a link goes nowhere"
    # The page's scripts and styles are inline; no URL is written anywhere a browser would follow.
    text = (tmp_path / "run.html").read_text(encoding="utf-8")
    assert "http://" not in text and "https://" not in text and "url(" not in text


def test_curves_draw_every_rank_with_its_marks(tmp_path, capsys):
    page = _page(capsys, str(LOG_FIXTURES / "multirank"), "--html", str(tmp_path / "run.html"))
    # Rank 0 logs training values; every rank logs its step time (the article's report_ranks).
    assert [p.attrs["data-series"] for p in _series_paths(page, "chart-loss")] == ["rank 0"]
    assert sorted(p.attrs["data-series"] for p in _series_paths(page, "chart-step-time")) == [
        f"rank {r}" for r in range(4)
    ]
    assert all(p.attrs["d"].startswith("M") and "L" in p.attrs["d"] for p in _series_paths(page, "chart-step-time"))
    overflow = page.by_id("chart-loss").all("line", "mark-overflow")
    assert overflow and "overflow at step 50" in overflow[0].text()
    assert page.by_id("fact-bottleneck") and page.by_id("attempts").all("p", "note")  # no ledger: said so


def test_a_curve_left_out_names_the_keys_that_would_draw_it(tmp_path, capsys):
    """The logs of a custom loop that logged no gradients: the page says what MFU and the
    gradient norm need, naming `monitor_config` keys that exist."""
    from otel_mindformers.config.schema import MonitorConfig

    lines = [json.loads(line) for line in (LOG_FIXTURES / "multirank" / "train_metric_rank_0.json").open()]
    log = tmp_path / "logs" / "train_metric.json"
    log.parent.mkdir()
    log.write_text("".join(json.dumps({k: v for k, v in line.items() if k != "grad_norm"}) + "\n" for line in lines))
    page = _page(capsys, str(log.parent), "--html", str(tmp_path / "run.html"))
    (note,) = [p.text() for p in page.all("p", "note") if p.text().startswith("Not in these logs")]
    assert "mfu (MFU needs FLOPs per token" in note and "grad_norm (the gradient norm needs" in note
    assert "run.log(grads=...)" in note
    named = set(re.findall(r"`([a-z_]+)(?::[^`]*)?`", note))
    assert named and named <= {field.name for field in dataclasses.fields(MonitorConfig)}, named


def test_bad_input_fails_as_report_does_and_writes_nothing(tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    bad = {
        LOG_FIXTURES / "malformed_mid.json": "malformed_mid.json:",  # a broken line in the middle
        tmp_path / "missing": "no such file or directory",
        empty: "no step logs in this directory",
    }
    for given, why in bad.items():
        assert cli_main(["report", str(given)]) == 1
        said = capsys.readouterr().err
        assert cli_main(["report", str(given), "--html", str(tmp_path / "run.html")]) == 1
        assert capsys.readouterr().err == said, given
        assert said.startswith(f"error: {given}") and why in said and said.count("\n") == 1, said
        assert not (tmp_path / "run.html").exists()
    unwritable = tmp_path / "no" / "such" / "run.html"
    assert cli_main(["report", str(LOG_FIXTURES / "multirank"), "--html", str(unwritable)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: {unwritable}: cannot write the page") and err.count("\n") == 1


def test_binning_keeps_spikes_and_splits_restarts():
    xs = [float(s) for s in range(1, 1001)] + [501.0, 502.0]
    ys = [1.0] * 1000 + [2.0, 2.0]
    ys[700] = 50.0  # one spike among a thousand points in 10 columns
    axis = Axis.over(xs, 10)
    assert [axis.bin(x) for x in (1.0, 1000.0, -5.0, 5000.0)] == [0, 9, 0, 9]  # the ends in its columns
    assert runs(xs) == [(0, 1000), (1000, 1002)]
    segments = thinned(xs, ys, axis)
    assert len(segments) == 2 and max(y for _, y in segments[0]) == 50.0 and len(segments[0]) <= 20
    assert segments[1] == [(501.0, 2.0), (502.0, 2.0)]
    nan_gap = thinned([1.0, 2.0, 3.0], [1.0, math.nan, 3.0], Axis.over([1.0, 3.0], 10))
    assert nan_gap == [[(1.0, 1.0)], [(3.0, 3.0)]]
    # A record covers the steps since the previous one; a row of many ranks shows the highest.
    rows = RankRows.of(range(128), 64)
    assert rows.count == 64 and rows.label(0) == "ranks 0–1"
    thousands = RankRows.of(range(4096), 64)  # the page's rows for 4,096 ranks: 64 of 64 ranks
    assert thousands.count == 64 and thousands.label(19) == "ranks 1216–1279"
    assert thousands.row(thousands.ranks.index(1234)) == 19
    # Logged at steps 1 (a run's first record covers its own step), 5 and 10.
    assert covering([1.0, 5.0, 10.0], [1.0, 1.0, 2.0]) == [(1.0, 1.0, 1.0), (2.0, 5.0, 1.0), (6.0, 10.0, 2.0)]
    logged = {0: covering([1.0, 5.0, 10.0], [1.0, 1.0, 2.0]), 1: covering([1.0, 5.0, 10.0], [3.0, 3.0, 1.0])}
    cells = heat_cells(logged, rows, Axis(1, 10, 10))
    assert [(c.column, c.value, c.rank) for c in cells] == [(i, 3.0, 1) for i in range(5)] + [
        (i, 2.0, 0) for i in range(5, 10)
    ]


# --- strings from the data: escaped by construction ---------------------------------------

# What a job id, a reason, an alert, an operator name may hold: the end of the page's script
# element, a script, a comment opener that makes Chromium swallow the rest of the page
# (`<!--<script>` in a script element), both quotes and ampersands, an entity and a tag.
EVIL = "</script><script>document.documentElement.dataset.pwned='1'</script><!--<script>'\"&amp;&<b>x"
EVIL_NAME = "<!--<script>'\"&amp;&<b>x"  # what a file or folder name can hold (no slash)


def _line(step: int, stamp: float, rank: int = 0, **fields) -> str:
    return json.dumps(StepRecord(step=step, epoch=1, rank=rank, time_stamp=stamp, **fields).to_json_dict())


def _window(data_wait: float) -> dict[str, float]:
    return {
        sections.SECTION_DATA_WAIT: data_wait,
        sections.SECTION_IN_STEP: 1.0 - data_wait,
        WINDOW_KEY: 1.0,
        STEPS_KEY: 1.0,
    }


def hostile_job(root: Path) -> tuple[Path, Path]:
    """A job whose every string the page shows is EVIL (or EVIL_NAME where a file name holds
    it): two logs compared side by side, so their labels are their file names, one of them
    waiting for its data (the verdict names it); alerts; another monitor's line; a ledger of
    two attempts with that job id and a crash reason; a capture with its trigger, kinds,
    status, folder and an operator. Returns (the logs' folder, the captures' folder)."""
    folder = root / EVIL_NAME
    folder.mkdir(parents=True)
    for name, data_wait in ((f"a{EVIL_NAME}_rank_0", 0.01), (f"b{EVIL_NAME}_rank_0", 0.6)):
        lines = []
        for step in range(1, 31):
            lines.append(
                _line(
                    step, 1000.0 + step, values={"loss": 2.0 / step, "train_per_step_time": 1000.0},
                    sections=_window(data_wait) if step > 1 else {}, alerts=[EVIL] if step == 10 else [],
                    time_breakdown={"wall": step, "productive": step / 2, "startup": 1.0, EVIL: step / 10},
                    job={"id": EVIL, "attempt": 1 if step <= 15 else 2},
                )
            )  # fmt: skip
        lines.append(json.dumps({"alert": EVIL, "rule": EVIL, "step": 20}))
        lines.append(json.dumps({"time_stamp": 1030.0, "step": 30, "loss": 1.0, "lr": 0.1}))  # a custom monitor's
        (folder / f"{name}.json").write_text("\n".join(lines) + "\n", encoding="utf-8")
    entry = {
        "attempt_id": "x", "process_start": 1000.0, "first_step_begin": 1001.0, "first_step_end": 1002.0,
        "checkpoint_save_seconds": 0.0, "checkpoint_load_seconds": 0.0, "data_wait_seconds": 0.0,
    }  # fmt: skip
    attempts = [
        {**entry, "attempt": 1, "last_step_time": 1015.0, "last_heartbeat": 1015.0, "resume_step": 0,
         "last_step": 15, "end": 1015.0, "outcome": "crashed", "reason": EVIL, "durable_step": 10},
        {**entry, "attempt": 2, "process_start": 1016.0, "first_step_begin": 1017.0, "first_step_end": 1018.0,
         "last_step_time": 1030.0, "last_heartbeat": 1030.0, "resume_step": 10, "last_step": 30, "end": 1030.0,
         "outcome": "completed", "durable_step": 30},
    ]  # fmt: skip
    ledger = ledger_path(str(folder / "train_metric.json"), 0)
    ledger.write_text(json.dumps({**new_ledger(EVIL), "attempts": attempts}), encoding="utf-8")
    captures = root / "captures"
    capture = captures / "rank_0" / EVIL_NAME
    trace = capture / "profile" / "r0_ascend_ms" / "ASCEND_PROFILER_OUTPUT" / "trace_view.json"
    trace.parent.mkdir(parents=True)
    events = [
        {"ph": "M", "pid": 7, "name": "process_name", "args": {"name": "CPU OP"}},
        {"ph": "X", "pid": 7, "ts": 1020.5e6, "dur": 300.0, "name": f"Default/{EVIL}"},
    ]
    trace.write_text(json.dumps(events), encoding="utf-8")
    manifest = {
        "rank": 0, "step": 20, "trigger": EVIL, "status": EVIL, "kinds": [EVIL], "time_stamp": 1020.0,
        "first_step": 20, "last_step": 21, "step_windows_ns": [[20, 1020_000_000_000, 1021_000_000_000]],
    }  # fmt: skip
    (capture / "capture.json").write_text(json.dumps(manifest), encoding="utf-8")
    return folder, captures


@pytest.fixture
def hostile_page(tmp_path, capsys) -> tuple[Path, Element]:
    folder, captures = hostile_job(tmp_path / "job")
    output = tmp_path / "run.html"
    page = _page(capsys, str(folder), "--captures", str(captures), "--html", str(output))
    return output, page


def _texts(page: Element) -> str:
    return "\n".join(e.text() for e in page.walk() if e.tag not in ("script", "style"))


def test_every_string_the_page_shows_reads_as_written_and_none_is_markup(hostile_page):
    output, page = hostile_page
    # The text shows as written wherever the page shows it.
    assert page.all("h1")[0].text() == f"Training run {EVIL}"
    assert page.all("title")[0].text() == f"Training run {EVIL}"
    assert _value(page, "job-id") == EVIL and page.by_id("fact-job-id").all("a")[0].text() == EVIL
    bottleneck = page.by_id("fact-bottleneck")
    assert bottleneck.text().startswith(f"holds the job backb{EVIL_NAME}_rank_0, data_wait")
    assert "named" in bottleneck.classes
    found = [li.text() for li in page.by_id("glance").all("li", "finding")]
    assert f"b{EVIL_NAME}_rank_0: holds the job back in data_wait" in found[0]
    assert f"a{EVIL_NAME}_rank_0: alert, step 20: {EVIL}" in found
    assert [td.text() for td in page.all("td", "col-ended")] == [f"crashed — {EVIL}", "completed"]
    assert EVIL in page.by_id("timeline-attempts").all("figcaption")[0].text()
    (capture,) = page.all("tr", "capture")
    cells = [td.text() for td in capture.all("td")]
    assert cells[3] == EVIL and cells[4] == EVIL and cells[6] == EVIL and cells[7].endswith(EVIL_NAME)
    lane = short_name(f"Default/{EVIL}")  # `script><!--<script>'"&amp;&<…`
    assert "<!--<script>" in lane and lane in {t.text() for t in page.by_id("ops-0").all("text", "tick")}
    assert f"a{EVIL_NAME}_rank_0" in [p.attrs["data-series"] for p in page.by_id("chart-loss").all("path", "series")]
    logs = page.by_id("logs")
    assert any(td.text().endswith(f"{EVIL_NAME}/a{EVIL_NAME}_rank_0.json") for td in logs.all("td"))
    assert any("another monitor wrote to the same file" in li.text() for li in logs.all("li"))
    # None of it became markup: the page's own scripts and JSON blocks only, and every one of
    # the 7 parts and the figures the data makes.
    scripts = page.all("script")
    assert [s.attrs.get("type") for s in scripts if "type" in s.attrs] == ["application/json"] * (len(scripts) - 2)
    assert all(not re.search(r"[<>&]", s.text()) for s in scripts if s.attrs.get("type"))
    assert [s.attrs["id"] for s in page.all("section")] == [
        "glance", "curves", "ranks", "attempts", "devices", "captures", "logs",
    ]  # fmt: skip
    assert {f.attrs["id"] for f in page.all("figure")} >= {
        "chart-loss", "chart-step-time", "heat-step-time", "heat-data-wait", "heat-in-step", "bars-time",
        "timeline-attempts", "bars-job", "ops-0",
    }  # fmt: skip
    assert not any("data-pwned" in e.attrs or e.tag == "b" for e in page.walk())
    # Each hover block is JSON that holds the labels as written.
    hover = json.loads(page.by_id("chart-loss").all("script")[0].text())
    assert f"a{EVIL_NAME}_rank_0" in [label for label, _ in hover["s"]]
    # Every data-value attribute is the JSON report's value, read back whole.
    values = [e.attrs["data-value"] for e in page.walk() if "data-value" in e.attrs]
    assert len(values) >= 8 and all(json.loads(v) is not None for v in values)
    text = output.read_text(encoding="utf-8")
    assert "pwned='1'</script>" not in text and "<!--<script>" not in text


def test_each_bar_chart_keeps_its_caption_and_every_category_has_a_colour(hostile_page):
    _, page = hostile_page
    assert page.by_id("bars-time").all("figcaption")[0].text().startswith("Where each rank's time went")
    assert page.by_id("bars-job").all("figcaption")[0].text().startswith("The job's ")
    coloured = set(re.findall(r"\.(k\d+)\{fill:", content_of_css()))
    for chart in ("bars-time", "bars-job"):
        swatches = [
            next(c for c in i.classes if re.fullmatch(r"k\d+", c)) for i in page.by_id(chart).all("i", "swatch")
        ]
        assert swatches and set(swatches) <= coloured, (chart, sorted(set(swatches) - coloured))


def test_the_ranks_bar_and_the_jobs_bar_colour_the_same_time_alike(hostile_page):
    _, page = hostile_page

    def colours(chart: str) -> dict[str, str]:
        legend = page.by_id(chart).all("span")
        return {s.text(): next(c for c in s.all("i")[0].classes if re.fullmatch(r"k\d+", c)) for s in legend}

    ranks, job = colours("bars-time"), colours("bars-job")
    same = {"productive": "productive", "startup": "startup", "compile": "compile", "data_wait": "data_wait"}
    same |= {"evaluation": "evaluation", "checkpoint.load": "checkpoint_load", "checkpoint.save": "checkpoint_save"}
    same |= {"other": "user_phases", "unaccounted": "other"}
    assert {r: ranks[r] for r in same} == {r: job[j] for r, j in same.items()}
    assert len(set(job.values())) == len(job), job  # and no two of the job's categories alike


def test_the_page_modules_write_no_markup_but_through_the_builder():
    """Escape by construction: outside markup.py no string literal of the page's modules
    opens or closes a tag, and no module but markup.py makes `Html` by hand."""
    folder = Path(markup.__file__).parent
    found = []
    for module in sorted(folder.glob("*.py")):
        if module.name == "markup.py":
            continue
        tree = ast.parse(module.read_text(encoding="utf-8"))
        docstrings = {
            id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)
        }
        for node in ast.walk(tree):
            if id(node) in docstrings:
                continue
            tag = (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and re.search(r"</?[a-zA-Z!]", node.value)
            )
            if tag and node.value != "<!DOCTYPE html>\n":
                found.append(f"{module.name}:{node.lineno}: {node.value[:60]!r}")
            if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == "Html":
                found.append(f"{module.name}:{node.lineno}: Html(...) made by hand")
    assert not found, "\n".join(found)


def test_the_builder_escapes_what_it_is_given_and_refuses_what_would_end_an_inline_script():
    built = markup.el("td", EVIL, markup.el("b", "&"), data_value=EVIL, hidden=True, title=None)
    parsed = parse(built).all("td")[0]
    assert parsed.attrs == {"data-value": EVIL, "hidden": ""} and parsed.texts == [EVIL]
    assert [b.text() for b in parsed.all("b")] == ["&"]  # markup the builder made goes in as markup
    block = markup.data_block("hover-data", {"label": EVIL})
    assert json.loads(parse(block).all("script")[0].text()) == {"label": EVIL} and EVIL not in block
    for source in ("a</script>b", "a</SCRIPT >b", "x<!--y"):
        with pytest.raises(ValueError, match="inline script"):
            markup.inline("script", source)
    with pytest.raises(ValueError, match="attribute name"):
        markup.el("td", **{"on click": "x"})


def _timed_log(path: Path, seconds: float) -> None:
    path.write_text(
        "\n".join(_line(step, 1000.0 + seconds * (step - 1) / 9, values={"loss": 1.0}) for step in range(1, 11)) + "\n",
        encoding="utf-8",
    )


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [(90.0, "90.0 s"), (150.0, "2.5 min"), (7199.0, "120.0 min"), (7200.0, "2.00 h"), (3 * 86400 + 1800, "72.50 h")],
)
def test_durations_read_in_seconds_minutes_or_hours(tmp_path, capsys, seconds, shown):
    _timed_log(tmp_path / "train_metric.json", seconds)
    page = _page(capsys, str(tmp_path / "train_metric.json"), "--html", str(tmp_path / "run.html"))
    assert _value(page, "wall-time") == pytest.approx(seconds)
    assert page.by_id("fact-wall-time").all("td")[0].text() == shown


def test_the_attempts_tables_steps_are_report_jsons(hostile_page, tmp_path, capsys):
    _, page = hostile_page
    folder = tmp_path / "job" / EVIL_NAME
    assert cli_main(["report", str(folder), "--format", "json"]) == 0
    attempts = json.loads(capsys.readouterr().out)["job"]["attempts"]
    shown = [td.text() for td in page.all("td", "col-steps")]
    assert len(shown) == len(attempts) == 2
    for cell, attempt in zip(shown, attempts):
        first, last = map(int, cell.split(".."))
        assert (first - 1, last) == (attempt["resume_step"], attempt["last_step"])
    assert shown == ["1..15", "11..30"]


def test_one_rank_has_nobody_to_hold_back_and_says_so_plainly(tmp_path, capsys):
    _timed_log(tmp_path / "train_metric.json", 60.0)
    page = _page(capsys, str(tmp_path / "train_metric.json"), "--html", str(tmp_path / "run.html"))
    fact = page.by_id("fact-bottleneck")
    assert "named" not in fact.classes  # red only when a rank is named (page.css)
    assert fact.all("td")[0].text() == "one rank: no other rank to hold back"
    assert "#fact-bottleneck.named td{color:" in content_of_css()


@pytest.mark.parametrize(("waits", "named"), [((0.5, 0.6), None), ((0.3, 0.95), 1)])
def test_the_page_says_every_rank_is_input_bound_and_names_a_rank_only_beyond_that(tmp_path, capsys, waits, named):
    """Both ranks wait for their data (30-60 % of each window): rank 1's extra 0.1 s is no
    rank's fault. Where rank 1 waits far more than both do, it is still named."""
    for rank, wait in enumerate(waits):
        lines = [
            _line(step, 1000.0 + step, rank, values={"train_per_step_time": 1000.0}, world_size=2,
                  sections=_window(wait) if step > 1 else {})
            for step in range(1, 21)
        ]  # fmt: skip
        (tmp_path / f"train_metric_rank_{rank}.json").write_text("\n".join(lines) + "\n", encoding="utf-8")
    page = _page(capsys, str(tmp_path), "--html", str(tmp_path / "run.html"))
    fact = page.by_id("fact-bottleneck")
    bound = f"every rank is input-bound: each waited for its data at least {19 * waits[0]:.3f} s"
    verdict = page.by_id("ranks").all("li")
    assert verdict[1].text().startswith(bound)
    if named is None:
        assert json.loads(fact.attrs["data-input-bound"]) == pytest.approx(waits[0])
        assert "named" not in fact.classes and fact.text().endswith(
            f"no rank: every rank is input-bound (each waited for its data at least {19 * waits[0]:.1f} s, "
            f"{waits[0]:.1%} of the job's wall time)"
        )
        assert not page.by_id("ranks").all("li", "verdict-top")
        assert page.by_id("glance").all("li", "finding")[0].text().startswith(bound)
    else:
        assert "named" in fact.classes and fact.attrs["data-rank"] == str(named)
        (top,) = page.by_id("ranks").all("li", "verdict-top")
        assert top is verdict[2] and top.text().startswith(f"bottleneck: rank {named}, data_wait")
        heatmap = page.by_id("heat-data-wait")  # its row outlined and labelled
        assert len(heatmap.all("rect", "named-row")) == 1
        assert [t.text() for t in heatmap.all("text", "named")] == [f"rank {named}"]


def _ranks_logs(folder: Path, ranks: int, steps: int = 40, **at_step) -> None:
    """`ranks` ranks, steps 1..`steps`, rank r's step time 100 + r ms; `at_step[name]`:
    steps whose line holds that value too (overflow=[10, 90])."""
    for rank in range(ranks):
        lines = []
        for step in range(1, steps + 1):
            values = {"loss": 1.0, "train_per_step_time": 100.0 + rank}
            values.update({name: True for name, steps in at_step.items() if step in steps})
            lines.append(_line(step, 1000.0 + step, rank, values=values, world_size=ranks))
        (folder / f"train_metric_rank_{rank}.json").write_text("\n".join(lines) + "\n", encoding="utf-8")


def test_a_short_runs_read_out_names_the_logged_steps(tmp_path, capsys):
    """A 2-rank job sampled at steps 1, 2, 4, 6, 8 read out "at 5.999" (the column's centre)."""
    for rank in range(2):
        lines = [_line(step, 1000.0 + step, rank, values={"loss": 1.0}, world_size=2) for step in (1, 2, 4, 6, 8)]
        (tmp_path / f"train_metric_rank_{rank}.json").write_text("\n".join(lines) + "\n", encoding="utf-8")
    chart = _page(capsys, str(tmp_path), "--html", str(tmp_path / "run.html")).by_id("chart-loss")
    assert json.loads(chart.all("script")[0].text())["x"] == [1, 2, 4, 6, 8]


@pytest.mark.parametrize("ranks", [8, 9])
def test_up_to_eight_ranks_are_lines_and_more_a_median_with_its_band(tmp_path, capsys, ranks):
    _ranks_logs(tmp_path, ranks)
    chart = _page(capsys, str(tmp_path), "--html", str(tmp_path / "run.html")).by_id("chart-step-time")
    lines = [p.attrs["data-series"] for p in chart.all("path", "series")]
    hover = json.loads(chart.all("script")[0].text())
    if ranks == 8:
        assert sorted(lines) == [f"rank {r}" for r in range(8)] and not chart.all("path", "band")
    else:
        assert lines == ["median"] and len(chart.all("path", "band")) == 1
        median = dict(hover["s"])["median"]
        # Every logged step's column has its median, the last step's too (at the axis's high end).
        assert len(median) == len(hover["x"]) == 40 and None not in median and set(median) == {104.0}
        assert hover["x"][-1] == pytest.approx(40.0, abs=0.1)


def test_marks_are_drawn_once_per_pixel_column_and_kind(tmp_path, capsys):
    # 2,000 steps across 836 pixels: steps 1001 and 1002 fall in one pixel column (488).
    _ranks_logs(tmp_path, 1, steps=2000, overflow=[1001, 1002, 1500])
    loss = _page(capsys, str(tmp_path), "--html", str(tmp_path / "run.html")).by_id("chart-loss")
    marks = [m.text() for m in loss.all("line", "mark-overflow")]
    assert marks == ["rank 0: overflow at step 1001", "rank 0: overflow at step 1500"]


def content_of_css() -> str:
    return (Path(markup.__file__).parent / "page.css").read_text(encoding="utf-8")


_IN_BROWSER = (
    "document.querySelectorAll('main > section').length",
    "document.querySelectorAll('figure').length",
    "document.documentElement.dataset.pwned || null",
    "document.body.dataset.ready || null",
    "document.querySelector('h1').textContent",
    "Array.from(document.querySelectorAll('td.col-ended'), td => td.textContent)",
    "document.getElementById('page-errors').textContent",
    # The pointer over the middle of the loss chart: the read-out names every series there.
    """(() => {
        const svg = document.querySelector('#chart-loss svg'), box = svg.getBoundingClientRect();
        svg.dispatchEvent(new MouseEvent('mousemove', {clientX: box.left + box.width / 2, clientY: box.top + 40}));
        return document.querySelector('#chart-loss .readout').textContent;
    })()""",
)


@pytest.mark.slow
@pytest.mark.integration  # a real browser
def test_a_page_of_hostile_strings_builds_whole_in_chromium_and_runs_none_of_them(hostile_page, tmp_path):
    output, page = hostile_page
    loaded = chromium.load(output, tmp_path / "profile", evaluate=_IN_BROWSER)
    sections_built, figures_built, pwned, ready, title, ended, errors, readout = loaded.values
    assert (sections_built, figures_built) == (7, len(page.all("figure"))), loaded.dom[-3000:]
    assert pwned is None and ready == "1" and errors == "" and loaded.console == [], (loaded.console, errors)
    assert title == f"Training run {EVIL}" and ended == [f"crashed — {EVIL}", "completed"]
    assert f"a{EVIL_NAME}_rank_0: " in readout and f"b{EVIL_NAME}_rank_0: " in readout, readout
    assert loaded.requests == [output.as_uri()]
    # Had one string gone in unescaped, its script would still not run: the policy lets only
    # the page's own scripts run, by their hashes, and the page says what it blocked.
    missed = tmp_path / "missed.html"
    missed.write_text(output.read_text(encoding="utf-8").replace("</main>", EVIL + "</main>"), encoding="utf-8")
    loaded = chromium.load(missed, tmp_path / "profile-missed", evaluate=_IN_BROWSER)
    errors = loaded.values[6]
    assert loaded.values[2] is None and "blocked: script-src-elem inline" in errors, loaded.values


# --- slow: a real job in a real browser ----------------------------------------------------

WORKER = REPO / "tests" / "support" / "msrun_restart_worker.py"
SLEEP_PER_SAMPLE = 0.15  # rank 1's source: 0.6 s per batch of 4, several times a step even on a loaded machine


def _msrun(workdir: Path, spec: dict) -> subprocess.CompletedProcess:
    command = [
        str(Path(sys.executable).parent / "msrun"), "--worker_num=2", "--local_worker_num=2",
        f"--master_port={free_port()}", "--join=True", f"--log_dir={workdir / 'msrun_log'}", str(WORKER),
        json.dumps(spec),
    ]  # fmt: skip
    return subprocess.run(command, cwd=workdir, env=child_env(), capture_output=True, text=True, timeout=900)


@pytest.fixture(scope="module")
def real_job():
    """Two ranks under msrun, rank 1's data slow, with device readings and a capture that a
    loss threshold of 0 takes at once: attempt 1 crashes at step 15, attempt 2 resumes from
    the checkpoint at step 10 and completes at 30. Yields (output folder, captures folder)."""
    with private_dir() as workdir:
        config = {
            "interval": 5,
            "output_type": ["json_file"],
            "json_log_path": "./output/train_metric.json",
            "device_monitor": True,
            "restarts": {"heartbeat_interval": 0.1},
            "alert_config": {
                "enable_alert": True,
                "loss_threshold": 0.0,
                "alert_interval": 1000,
                "stall_timeout": None,
                "capture": {"rules": ["loss_threshold"], "profile_steps": 2, "path": "./output/captures"},
            },
        }
        job = {"config": config, "epochs": 3, "steps": 10, "slow_rank": 1, "sleep": SLEEP_PER_SAMPLE}
        crashed = _msrun(workdir, {**job, "crash_at": 15})
        assert crashed.returncode != 0, crashed.stdout[-3000:]
        resumed = _msrun(workdir, {**job, "initial_epoch": 1})
        assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
        captures = workdir / "output" / "captures"
        for folder in sorted(captures.glob("rank_*/*")):
            wait_for_trace(folder)
        yield workdir / "output", captures


def _cli(*arguments: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "otel_mindformers.cli", *arguments]
    return subprocess.run(command, capture_output=True, text=True, timeout=300, env=child_env())


@pytest.fixture(scope="module")
def real_page(real_job, tmp_path_factory):
    output, captures = real_job
    folder = tmp_path_factory.mktemp("page")
    page = folder / "run.html"
    made = _cli("report", str(output), "--captures", str(captures), "--html", str(page))
    assert made.returncode == 0, made.stderr
    return page


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.msrun_job  # the real job's page
def test_a_real_jobs_page_opens_in_chromium_without_error_or_request_and_draws_every_chart(real_page, tmp_path):
    image = tmp_path / "run.png"
    loaded = chromium.load(real_page, tmp_path / "profile", screenshot=image)
    assert loaded.requests == [real_page.as_uri()], loaded.requests  # the file itself, nothing else
    assert loaded.console == [], loaded.console
    dom = parse(loaded.dom)
    assert dom.by_id("page-errors").text() == ""
    body = dom.all("body")[0]
    assert body.attrs.get("data-ready") == "1" and float(body.attrs["data-open-ms"]) > 0  # its scripts ran
    # Rank 1's data is slow: the verdict names it, in the glance and across ranks.
    bottleneck = dom.by_id("fact-bottleneck")
    assert bottleneck.attrs["data-rank"] == "1" and "rank 1, data_wait" in bottleneck.text()
    first = dom.by_id("glance").all("li", "finding")[0]
    assert first.text().startswith("rank 1: holds the job back in data_wait")
    assert first.all("a")[0].attrs["href"] == "#ranks"
    assert [t.text() for t in dom.by_id("heat-data-wait").all("text", "named")] == ["rank 1"]
    # Curves: rank 0's training values, both ranks' step times, restart, capture and alert marks.
    assert [p.attrs["data-series"] for p in dom.by_id("chart-loss").all("path", "series")] == ["rank 0"]
    step_time = dom.by_id("chart-step-time").all("path", "series")
    assert sorted(p.attrs["data-series"] for p in step_time) == ["rank 0", "rank 1"]
    assert all(p.attrs["d"].startswith("M") and "L" in p.attrs["d"] for p in step_time)
    loss = dom.by_id("chart-loss")
    restarts = loss.all("line", "mark-restart")
    assert [r.text() for r in restarts] == ["attempt 2 resumed at step 11"]
    assert loss.all("rect", "mark-capture") and loss.all("line", "mark-alert")
    # Heatmaps of step time and of each section the job spent time in, every cell drawn.
    for heatmap in ("heat-step-time", "heat-data-wait", "heat-in-step"):
        cells = [r for r in dom.by_id(heatmap).all("rect") if any(re.fullmatch(r"h\d+", c) for c in r.classes)]
        assert len(cells) >= 2 * 4, heatmap
    assert len(dom.by_id("bars-time").all("rect", "segment")) >= 4
    # Attempts: the crashed one, the completed one and the downtime between them.
    spans = dom.by_id("timeline-attempts").all("rect", "span")
    assert {"o-crashed", "o-completed", "d-no_process"} <= {c for s in spans for c in s.classes}
    # Devices (host readings on this CPU machine) and the captures' operators.
    # Each rank's readings break where attempt 2 began: no line across the downtime.
    memory = dom.by_id("device-host-rss-mb")
    assert [p.attrs["d"].count("M") for p in memory.all("path", "series")] == [2, 2]
    assert [m.text() for m in memory.all("line", "mark-restart")] == ["attempt 2 began"]
    assert len(dom.all("tr", "capture")) == 2
    operators = dom.by_id("ops-0").all("rect", "op")
    assert operators and any("MatMul" in op.text() for op in operators)
    # The screenshot shows the top of the page as a reader sees it: both ranks' step-time lines.
    pixels = plot_pixels.load(image)
    assert pixels.shape == (2400, 1100, 3)
    assert plot_pixels.count(pixels, "#1f5fa6") > 500 and plot_pixels.count(pixels, "#d9501e") > 200
    print(f"screenshot: {image}")


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.msrun_job  # the real job's page
def test_a_real_jobs_page_numbers_are_report_jsons(real_job, real_page):
    output, captures = real_job
    made = _cli("report", str(output), "--captures", str(captures), "--json")
    assert made.returncode == 0, made.stderr
    report = json.loads(made.stdout)
    page = parse(real_page.read_text(encoding="utf-8"))
    totals, verdict = report["job"]["totals"], report["bottleneck"]
    assert _value(page, "job-goodput") == totals["goodput"]
    assert _value(page, "lost-steps") == totals["lost_steps"] == 5
    assert [int(row.attrs["data-lost-steps"]) for row in page.all("tr", "attempt")] == [
        a["lost_steps"] for a in report["job"]["attempts"]
    ]
    assert _value(page, "bottleneck") == verdict["bottleneck"]["lost_s"] and verdict["bottleneck"]["rank"] == 1
    assert _value(page, "useful-share") == verdict["job_goodput"]
    assert _value(page, "steps") == report["steps"] and _value(page, "wall-time") == report["wall_time_s"]
    assert _value(page, "captures") == len(report["captures"]) == 2


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.msrun_job  # the real job's page
def test_the_browser_check_sees_a_request_a_console_call_and_a_script_error(real_page, tmp_path):
    """The check is not blind: a copy of the page with an image from the network, a console
    call and a failing script shows all three, in the protocol's events and in the page's
    own error box (the Content-Security-Policy blocks the image, but the request is seen;
    the copy's policy names the added script's hash, as it names the page's own)."""
    tampered = tmp_path / "tampered.html"
    text = real_page.read_text(encoding="utf-8")
    script = 'console.log("hello");notDefined()'
    broken = f'<img src="https://example.invalid/pixel.png"><script>{script}</script>'
    policy = content_security_policy()
    assert f'content="{policy}"' in text
    text = text.replace(policy, policy.replace("script-src ", f"script-src {markup.csp_source(script)} "))
    tampered.write_text(text.replace("</main>", broken + "</main>"), encoding="utf-8")
    loaded = chromium.load(tampered, tmp_path / "profile")
    assert loaded.requests == [tampered.as_uri(), "https://example.invalid/pixel.png"], loaded.requests
    said = "\n".join(loaded.console)
    assert "console.log: hello" in said and "notDefined is not defined" in said and "img-src" in said, said
    errors = parse(loaded.dom).by_id("page-errors").text()
    assert "blocked: img-src https://example.invalid/pixel.png" in errors, errors
    assert "notDefined is not defined" in errors, errors
