"""`report --html`: the run as one self-contained page (docs/analysis.md#report---html).

Fast: pages of logs written here (the JSON lines and ledgers ranks write) read back with
the standard library's HTML parser: nothing is fetched, every chart is drawn, the figures
are `report --json`'s, 4,096 ranks stay bounded, bad input fails as `report` fails.
Slow: a real two-rank msrun job in which rank 1's data is slow, crashed and resumed, with a
capture, opened in a real headless Chromium: no error, no request, every chart drawn,
rank 1 named, the numbers of `report --json`, a screenshot.
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from otel_mindformers.analysis.html_report.binning import Axis, RankRows, covering, heat_cells, runs, thinned
from otel_mindformers.analysis.html_report.page import CSP
from otel_mindformers.cli import main as cli_main
from otel_mindformers.restarts.ledger_file import ledger_path, new_ledger, write_ledger
from tests.support import chromium
from tests.support.capture_trace import wait_for_trace
from tests.support.html_dom import Element, parse
from tests.support.instrumented import REPO, child_env, free_port
from tests.support.paths import LOG_FIXTURES
from tests.support.restart_worker import private_dir

JOB = "html-test-job"
START = 1_796_000_000.0


# --- logs as ranks write them --------------------------------------------------------------


def _write_job(folder: Path, ranks: int, *, slow_rank: int | None = None, every: int = 5, steps: int = 40) -> Path:
    """A job's logs and ledgers: `ranks` ranks log every `every`-th step with sections,
    time and job objects; attempt 1 crashes at step 25, attempt 2 resumes at 20; the
    slow rank waits for its data."""
    folder.mkdir(parents=True, exist_ok=True)
    attempts = [(1, 1, 25, START), (2, 21, steps, START + 100.0)]
    for rank in range(ranks):
        lines = []
        for attempt, first, last, begin in attempts:
            wall, previous = 10.0, first - 1
            for step in sorted({first, *range(first - first % every + every, last + 1, every), last}):
                window = step - previous
                data_wait = (0.3 if rank == slow_rank else 0.001) * window
                in_step = 0.05 * window
                wall += data_wait + in_step
                line = {
                    "time_stamp": begin + 10.0 + step * 0.1, "step": step, "epoch": 1, "rank": rank,
                    "world_size": ranks, "loss": 3.0 / step, "learning_rate": 1e-3, "grad_norm": 1.0 + rank,
                    "train_per_step_time": (data_wait + in_step) / window * 1000, "overflow": step == 10,
                    "samples_per_second": 80.0, "npu_utilization": 90.0 - rank, "npu_power_w": 300.0,
                    "time": {"wall": wall, "productive": wall - 10.0 - data_wait, "startup": 10.0},
                    "sections": {"data_wait": data_wait, "in_step": in_step, "window": data_wait + in_step,
                                 "steps": float(window)},
                    "job": {"id": JOB, "attempt": attempt},
                }  # fmt: skip
                if step == 15:
                    line["alerts"] = ["loss_spike"]
                lines.append(json.dumps(line))
                previous = step
        (folder / f"train_metric_rank_{rank}.json").write_text("\n".join(lines) + "\n")
        ledger = new_ledger(JOB)
        for attempt, first, last, begin in attempts:
            end = begin + 10.0 + last * 0.1
            ledger["attempts"].append({
                "attempt_id": f"{attempt}-{rank}", "pid": 100 + rank, "host": "h", "rank": rank,
                "process_start": begin, "train_begin": begin + 9.0, "resume_step": first - 1, "last_step": last,
                "last_step_time": end, "last_heartbeat": end, "durable_step": 20 if attempt == 1 else last,
                "durable_time": end, "checkpoint_save_seconds": 0.1, "checkpoint_load_seconds": 0.0,
                "data_wait_seconds": 0.3 * (last - first) if rank == slow_rank else 0.0, "heartbeat_interval": 1.0,
                "outcome": "crashed" if attempt == 1 else "completed", "attempt": attempt,
                "first_step_begin": begin + 10.0, "first_step_end": begin + 10.5, "data_wait_step": last,
                "reason": "RuntimeError: boom" if attempt == 1 else None, "end": end,
            })  # fmt: skip
        write_ledger(ledger_path(str(folder / "train_metric.json"), rank), ledger)
    return folder


def _page(capsys, *arguments: str) -> Element:
    output = Path(arguments[arguments.index("--html") + 1])
    assert cli_main(["report", *arguments]) == 0
    assert f"wrote {output}" in capsys.readouterr().out
    return parse(output.read_text(encoding="utf-8"))


def _report_json(capsys, *arguments: str) -> dict:
    assert cli_main(["report", *arguments, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


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


def test_the_figures_are_report_jsons(tmp_path, capsys):
    folder = _write_job(tmp_path / "output", 3, slow_rank=2)
    page = _page(capsys, str(folder), "--html", str(tmp_path / "run.html"))
    report = _report_json(capsys, str(folder))
    job, verdict = report["job"], report["bottleneck"]
    assert _value(page, "job-goodput") == job["totals"]["goodput"]
    assert _value(page, "lost-steps") == job["totals"]["lost_steps"] == 5
    assert _value(page, "useful-share") == verdict["job_goodput"]
    assert _value(page, "bottleneck") == verdict["bottleneck"]["lost_s"]
    assert page.by_id("fact-bottleneck").attrs["data-rank"] == "2" == str(report["holds_back"].split()[-1])
    assert _value(page, "steps") == report["steps"] and _value(page, "wall-time") == report["wall_time_s"]
    assert [int(row.attrs["data-lost-steps"]) for row in page.all("tr", "attempt")] == [
        a["lost_steps"] for a in job["attempts"]
    ]
    # The verdict's finding comes first, linked to the ranks' section, where rank 2's row is outlined.
    first = page.by_id("glance").all("li", "finding")[0]
    assert first.all("a")[0].attrs["href"] == "#ranks" and first.text().startswith("rank 2: holds the job back")
    heat = page.by_id("heat-data-wait")
    assert [t.text() for t in heat.all("text", "named")] == ["rank 2"]
    cells = heat.all("rect")
    assert len([c for c in cells if c.attrs.get("class", "").startswith("h")]) >= 3 * 8
    # Attempts: both bars, the downtime before the second, its resume marked on every curve.
    spans = page.by_id("timeline-attempts").all("rect", "span")
    assert {"o-crashed", "o-completed"} <= {c for s in spans for c in s.classes}
    assert any(c.startswith("d-") for s in spans for c in s.classes)
    restart = page.by_id("chart-loss").all("line", "mark-restart")
    assert restart and "resumed at step 21" in restart[0].text()
    assert page.by_id("chart-loss").all("line", "mark-alert")
    assert page.by_id("device-npu-utilization").all("path", "series")


def test_four_thousand_ranks_stay_bounded(tmp_path, capsys):
    folder = tmp_path / "output"
    folder.mkdir()
    for rank in range(4096):
        lines = [
            json.dumps({
                "time_stamp": START + step, "step": step, "epoch": 1, "rank": rank, "world_size": 4096,
                "train_per_step_time": 100.0 + (400.0 if rank == 1234 else 0.0), "samples_per_second": 8.0,
                "sections": {"data_wait": 0.5 if rank == 1234 else 0.0, "in_step": 0.5, "window": 1.0, "steps": 1.0},
                "time": {"wall": 5.0 + step, "productive": 0.5 * step, "startup": 5.0},
            })  # fmt: skip
            for step in range(1, 7)
        ]
        (folder / f"train_metric_rank_{rank}.json").write_text("\n".join(lines) + "\n")
    began = time.perf_counter()
    page = _page(capsys, str(folder), "--html", str(tmp_path / "run.html"))
    built = time.perf_counter() - began
    size = (tmp_path / "run.html").stat().st_size
    print(f"4096 ranks x 6 records: {size / 1e6:.2f} MB in {built:.1f} s")
    assert size < 2_000_000
    # One median with its band, and the rank that holds the job back, not 4,096 lines.
    step_time = page.by_id("chart-step-time")
    assert [p.attrs["data-series"] for p in step_time.all("path", "series")] == ["median", "rank 1234"]
    assert step_time.all("path", "band")
    heat = page.by_id("heat-step-time")
    labels = [t.text() for t in heat.all("text", "tick") if t.text().startswith("rank")]
    assert labels and all(label.startswith("ranks ") for label in labels) and "ranks 1216–1279" in labels
    assert len(heat.all("rect")) <= 64 * 6 + 2
    bars = page.by_id("bars-time")
    assert len(bars.all("rect", "segment")) <= 64 * 3 and "ranks 0–63 (mean)" in bars.text()


def test_bad_input_fails_as_report_does_and_writes_nothing(tmp_path, capsys):
    malformed = str(LOG_FIXTURES / "malformed_mid.json")
    assert cli_main(["report", malformed]) == 1
    said = capsys.readouterr().err
    assert cli_main(["report", malformed, "--html", str(tmp_path / "run.html")]) == 1
    assert capsys.readouterr().err == said and said.count("\n") == 1 and "malformed_mid.json:" in said
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
    cells = heat_cells({0: covering([5.0, 10.0], [1.0, 2.0]), 1: covering([5.0, 10.0], [3.0, 1.0])}, rows, Axis(1, 10, 10))
    assert [(c.column, c.value, c.rank) for c in cells] == [(i, 3.0, 1) for i in range(5)] + [
        (i, 2.0, 0) for i in range(5, 10)
    ]


# --- slow: a real job in a real browser ----------------------------------------------------

WORKER = REPO / "tests" / "support" / "msrun_restart_worker.py"
SLEEP_PER_SAMPLE = 0.05  # rank 1's source: 0.2 s per batch of 4, several times a step here


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
def test_a_real_jobs_page_opens_in_chromium_without_error_or_request_and_draws_every_chart(real_page, tmp_path):
    loaded = chromium.load(real_page, tmp_path / "profile")
    dom = parse(loaded.dom)
    assert dom.by_id("page-errors").text() == "" and not loaded.console, (dom.by_id("page-errors").text(), loaded.console)
    body = dom.all("body")[0]
    assert body.attrs.get("data-ready") == "1" and float(body.attrs["data-open-ms"]) > 0  # its scripts ran
    # Rank 1's data is slow: the verdict names it, in the glance and across ranks.
    bottleneck = dom.by_id("fact-bottleneck")
    assert bottleneck.attrs["data-rank"] == "1" and "rank 1, data_wait" in bottleneck.text()
    assert dom.by_id("glance").all("li", "finding")[0].text().startswith("rank 1: holds the job back in data_wait")
    assert [t.text() for t in dom.by_id("heat-data-wait").all("text", "named")] == ["rank 1"]
    # Curves: rank 0's training values, both ranks' step times, restart, capture and alert marks.
    assert [p.attrs["data-series"] for p in dom.by_id("chart-loss").all("path", "series")] == ["rank 0"]
    assert len(dom.by_id("chart-step-time").all("path", "series")) == 2
    loss = dom.by_id("chart-loss")
    assert loss.all("line", "mark-restart") and loss.all("rect", "mark-capture") and loss.all("line", "mark-alert")
    # Heatmaps of step time and of each section the job spent time in, every cell drawn.
    for heatmap in ("heat-step-time", "heat-data-wait", "heat-in-step"):
        cells = [r for r in dom.by_id(heatmap).all("rect") if any(c.startswith("h") for c in r.classes)]
        assert len(cells) >= 2 * 4, heatmap
    assert len(dom.by_id("bars-time").all("rect", "segment")) >= 4
    # Attempts: the crashed one, the completed one and the downtime between them.
    spans = dom.by_id("timeline-attempts").all("rect", "span")
    assert {"o-crashed", "o-completed", "d-no_process"} <= {c for s in spans for c in s.classes}
    # Devices (host readings on this CPU machine) and the captures' operators.
    assert dom.by_id("device-host-rss-mb").all("path", "series")
    assert len(dom.all("tr", "capture")) == 2
    operators = dom.by_id("ops-0").all("rect", "op")
    assert operators and any("MatMul" in op.text() for op in operators)
    # A screenshot, as a reader sees the top of the page.
    image = chromium.screenshot(real_page, tmp_path / "run.png", tmp_path / "profile")
    assert image.stat().st_size > 50_000
    print(f"screenshot: {image}")


@pytest.mark.slow
@pytest.mark.integration
def test_a_real_jobs_page_numbers_are_report_jsons(real_job, real_page):
    output, captures = real_job
    made = _cli("report", str(output), "--captures", str(captures), "--json")
    assert made.returncode == 0, made.stderr
    report = json.loads(made.stdout)
    page = parse(real_page.read_text(encoding="utf-8"))
    totals, verdict = report["job"]["totals"], report["bottleneck"]
    assert _value(page, "job-goodput") == totals["goodput"]
    assert _value(page, "lost-steps") == totals["lost_steps"] == 5
    assert _value(page, "bottleneck") == verdict["bottleneck"]["lost_s"] and verdict["bottleneck"]["rank"] == 1
    assert _value(page, "useful-share") == verdict["job_goodput"]
    assert _value(page, "captures") == len(report["captures"]) == 2


@pytest.mark.slow
@pytest.mark.integration
def test_the_browser_check_sees_a_request_and_a_script_error(real_page, tmp_path):
    """The page's own recorder works: a copy with an image from the network and a failing
    script reports both, so a clean page is clean for a reason."""
    tampered = tmp_path / "tampered.html"
    text = real_page.read_text(encoding="utf-8")
    broken = '<img src="https://example.invalid/pixel.png"><script>notDefined()</script>'
    tampered.write_text(text.replace("</main>", broken + "</main>"), encoding="utf-8")
    shutil.copy(real_page, tmp_path / "clean.html")
    errors = parse(chromium.load(tampered, tmp_path / "profile").dom).by_id("page-errors").text()
    assert "blocked: img-src https://example.invalid/pixel.png" in errors, errors
    assert "notDefined is not defined" in errors, errors
