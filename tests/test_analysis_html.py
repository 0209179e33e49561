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

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

from otel_mindformers.analysis.html_report.binning import Axis, RankRows, covering, heat_cells, runs, thinned
from otel_mindformers.analysis.html_report.page import CSP
from otel_mindformers.cli import main as cli_main
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
    assert policy.attrs["content"] == CSP and "default-src 'none'" in CSP
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
    own error box (the Content-Security-Policy blocks the image, but the request is seen)."""
    tampered = tmp_path / "tampered.html"
    text = real_page.read_text(encoding="utf-8")
    broken = '<img src="https://example.invalid/pixel.png"><script>console.log("hello");notDefined()</script>'
    tampered.write_text(text.replace("</main>", broken + "</main>"), encoding="utf-8")
    loaded = chromium.load(tampered, tmp_path / "profile")
    assert loaded.requests == [tampered.as_uri(), "https://example.invalid/pixel.png"], loaded.requests
    said = "\n".join(loaded.console)
    assert "console.log: hello" in said and "notDefined is not defined" in said and "img-src" in said, said
    errors = parse(loaded.dom).by_id("page-errors").text()
    assert "blocked: img-src https://example.invalid/pixel.png" in errors, errors
    assert "notDefined is not defined" in errors, errors
