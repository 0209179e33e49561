"""`otel-mindformers report` on fixture logs: numbers, stragglers, gaps, formats, errors."""

from __future__ import annotations

import json
import statistics

import pytest

from otel_mindformers.analysis.report import build_report, render
from otel_mindformers.outputs.jsonl_reader import read_logs
from tests.support.cli import cli
from tests.support.jsonl import json_lines as _lines
from tests.support.paths import LOG_FIXTURES as FIXTURES

pytestmark = pytest.mark.analysis


def test_multirank_numbers_come_from_the_logs():
    report = build_report(read_logs([FIXTURES / "multirank"]))
    rank0 = _lines(FIXTURES / "multirank" / "train_metric_rank_0.json")
    losses = [line["loss"] for line in rank0 if line["loss"] is not None]
    stamps = [
        line["time_stamp"] for r in range(4) for line in _lines(FIXTURES / "multirank" / f"train_metric_rank_{r}.json")
    ]
    assert report.steps == 100
    assert report.wall_time_s == pytest.approx(max(stamps) - min(stamps))
    assert (report.first_loss, report.last_loss, report.min_loss) == (losses[0], losses[-1], min(losses))
    assert report.mean_samples_per_second == pytest.approx(
        statistics.fmean(line["samples_per_second"] for line in rank0[1:])
    )
    assert report.nonfinite_records == sum(1 for line in rank0 if "nonfinite" in line)
    assert report.overflow_records == sum(1 for line in rank0 if line["overflow"])
    assert [s.nonfinite_steps for s in report.series][0] == [70]
    rates = []
    for rank in range(4):
        lines = _lines(FIXTURES / "multirank" / f"train_metric_rank_{rank}.json")
        rates.append((lines[-1]["step"] - lines[0]["step"]) / (lines[-1]["time_stamp"] - lines[0]["time_stamp"]))
    assert report.steps_per_second == pytest.approx(statistics.fmean(rates))
    # The overview's wall time spans the records, not the process: says so beside the time
    # table's per-series wall, which counts from the process's start.
    assert f"  wall time   {report.wall_time_s:.1f} s (first to last record)\n" in render(report, "text")


def test_mean_throughput_leaves_out_the_compiling_first_record_as_step_time_does(tmp_path):
    """A short job's first record (compilation) dragged the mean samples/s far below what the
    step times and steps/s said: left out, as from the step-time table, unless alone."""
    rates = [(1, 2.5, 1600.0), (2, 80.0, 50.0), (4, 80.0, 50.0), (6, 80.0, 50.0)]
    log = tmp_path / "train_metric_rank_0.json"
    log.write_text(
        "".join(
            json.dumps({"time_stamp": 100.0 + step, "step": step, "rank": 0, "samples_per_second": rate,
                        "tokens_per_second": rate * 16, "train_per_step_time": ms}) + "\n"
            for step, rate, ms in rates
        )
    )  # fmt: skip
    report = build_report(read_logs([log]))
    assert (report.mean_samples_per_second, report.mean_tokens_per_second) == (80.0, 1280.0)
    log.write_text(log.read_text().splitlines(keepends=True)[0])  # a record alone is kept
    assert build_report(read_logs([log])).mean_samples_per_second == 2.5


def test_straggler_is_named_with_its_skew():
    report = build_report(read_logs([FIXTURES / "multirank"]))
    medians = {}
    for rank in range(4):
        times = [
            line["train_per_step_time"] for line in _lines(FIXTURES / "multirank" / f"train_metric_rank_{rank}.json")
        ]
        medians[f"rank {rank}"] = statistics.median(times[1:])  # the compile step is left out
    overall = statistics.median(medians.values())
    assert report.median_step_time_ms == pytest.approx(overall)
    for summary in report.series:
        assert summary.skew_vs_median == pytest.approx(medians[summary.label] / overall - 1)
    assert report.stragglers == ["rank 3"]
    assert report.slowest == "rank 3"
    text = render(report, "text")
    assert "stragglers (> 10% over the median" in text and "rank 3 (+" in text


def test_no_straggler_below_threshold_but_slowest_still_named():
    report = build_report(read_logs([FIXTURES / "multirank"]), straggler_threshold=0.6)
    assert report.stragglers == []
    assert report.slowest == "rank 3"
    assert "no stragglers" in render(report, "text")


def test_gaps_and_restarts_point_at_their_lines():
    (summary,) = build_report(read_logs([FIXTURES / "gap_and_restart.json"])).series
    where = FIXTURES / "gap_and_restart.json"
    assert summary.stride == 10
    assert [(g.after, g.before, g.location) for g in summary.gaps] == [(30, 70, f"{where}:5")]
    assert [(r.from_step, r.to_step, r.location) for r in summary.restarts] == [(80, 1, f"{where}:7")]


def test_sink_mode_sampling_off_the_interval_grid_is_no_gap_but_a_lost_record_is(tmp_path):
    """Device sink mode (sink 4, interval 6) samples the first sink end past each multiple of
    6: 4, 8, 12, 20, 24, 32, each record's window (`sections.steps`) spanning its jump. A
    record lost before step 44 leaves step 44's window shorter than the jump: that is a gap."""
    steps = [4, 8, 12, 20, 24, 32, 36, 44]
    windows = [None, 4, 4, 8, 4, 8, 4, 4]  # 40 was sampled and lost: 44's window is 41..44
    log = tmp_path / "train_metric.json"
    log.write_text(
        "".join(
            json.dumps({"time_stamp": 100.0 + step, "step": step, "rank": 0, "loss": 1.0,
                        **({"sections": {"in_step": 0.04, "window": 0.04, "steps": w}} if w else {})}) + "\n"
            for step, w in zip(steps, windows)
        )
    )  # fmt: skip
    (summary,) = build_report(read_logs([log])).series
    assert [(g.after, g.before) for g in summary.gaps] == [(36, 44)]


def test_rotated_set_has_no_gap_at_the_file_boundaries():
    (summary,) = build_report(read_logs([FIXTURES / "rotated"])).series
    assert (summary.records, summary.first_step, summary.last_step) == (60, 1, 60)
    assert summary.gaps == [] and summary.restarts == []


def test_json_and_markdown_formats_carry_the_same_findings():
    report = build_report(read_logs([FIXTURES / "multirank", FIXTURES / "mixed_writers.json"]))
    data = json.loads(render(report, "json"))
    assert [s["label"] for s in data["series"]] == [s.label for s in report.series]
    assert data["step_time_view"]["stragglers"] == report.stragglers == ["train_metric_rank_3"]
    assert data["holds_back"] == "train_metric_rank_3"  # no sections in these logs: the step-time view is the verdict
    markdown = render(report, "markdown")
    rows = [line for line in markdown.splitlines() if line.startswith("| ") and "records" not in line]
    for summary in report.series:
        assert any(row.startswith(f"| {summary.label} | {summary.records} |") for row in rows)
    assert "alert, step 20: loss 9.3 above loss_threshold 8.0" in markdown


@pytest.mark.slow
def test_cli_report_formats_and_notes(tmp_path):
    done = cli("report", str(FIXTURES / "multirank"), str(FIXTURES / "truncated.json"), "--format", "json")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["series"][-1]["damaged_tails"] == [f"{FIXTURES / 'truncated.json'}:4"]
    assert "skipped a truncated last line" in done.stderr
    assert cli("report", str(FIXTURES / "multirank"), "--format", "markdown").stdout.startswith("## Run")


@pytest.mark.slow
def test_cli_malformed_line_is_one_error_line_not_a_traceback():
    done = cli("report", str(FIXTURES / "malformed_mid.json"))
    assert done.returncode == 1
    assert done.stderr.startswith(f"error: {FIXTURES / 'malformed_mid.json'}:3: not a JSON line")
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("fmt", ["text", "markdown", "json"])
def test_a_run_that_lost_no_time_to_any_phase_renders_without_a_largest_loss(tmp_path, fmt):
    """Every line's `time` holds only `wall` and `productive`: no phase lost anything, so the
    report has no "largest loss" to name (it once raised a TypeError there)."""
    log = tmp_path / "train_metric.json"
    log.write_text(
        "\n".join(
            json.dumps(
                {
                    "time_stamp": 1000.0 + step,
                    "step": step,
                    "epoch": 1,
                    "rank": 0,
                    "loss": 1.0 / step,
                    "train_per_step_time": 1000.0,
                    "time": {"wall": float(step), "productive": float(step)},
                }
            )  # fmt: skip
            for step in (1, 2, 3, 4)
        )
        + "\n"
    )
    text = render(build_report(read_logs([log])), fmt)
    assert "largest loss" not in text.lower()
    assert text.strip()


def test_a_rule_a_step_line_names_is_said_once(tmp_path):
    log = tmp_path / "train_metric.json"
    log.write_text(
        '{"time_stamp": 1.0, "step": 1, "epoch": 1, "rank": 0, "loss": 4.0}\n'
        '{"time_stamp": 2.0, "step": 2, "epoch": 1, "rank": 0, "loss": 4.1, "alerts": ["overflow_streak"]}\n'
    )
    text = render(build_report(read_logs([log])), "text")
    assert "alert, step 2: overflow_streak\n" in text, text


def test_resumes_and_a_killed_attempts_unrecorded_steps_are_explained_by_the_jobs_attempts(tmp_path):
    """Attempt 1 ran 1..25 (killed at 25, resumed from 20); attempt 2 logged up to 29 and was
    killed at 35 before steps 30..35 reached the log (resumed from 30); attempt 3 ran 31..40."""
    steps = [*range(1, 26), *range(21, 30), *range(31, 41)]
    log = tmp_path / "train_metric.json"
    log.write_text(
        "".join(json.dumps({"step": s, "time_stamp": 1.0e9 + i, "loss": 1.0}) + "\n" for i, s in enumerate(steps))
    )
    attempts = [
        {"attempt": 1, "resume_step": 0, "last_step": 25, "outcome": "killed"},
        {"attempt": 2, "resume_step": 20, "last_step": 35, "outcome": "killed"},
        {"attempt": 3, "resume_step": 30, "last_step": 40, "outcome": "completed"},
    ]
    report = build_report(read_logs([log]))
    without = render(report, "text").split("Findings")[1]
    assert (
        "restart, step went from 25 back to 21" in without and "gap, no record between step 29 and step 31" in without
    )
    report.attempts = attempts
    findings = render(report, "text").split("Findings")[1]
    assert "restart, step went from" not in findings and "gap, no record" not in findings
    assert "train_metric: steps 30–35 of attempt 2 were not recorded; the process was killed" in findings
    assert "attempts" not in json.loads(render(report, "json"))


def test_a_job_id_with_a_line_break_cannot_forge_report_lines(tmp_path):
    """A ledger written by another tool (the config and the launcher variables refuse such
    an id) with a line break in its job id: the report shows it escaped, on one line."""
    from otel_mindformers.restarts.ledger_file import ledger_path, new_ledger, write_ledger
    from otel_mindformers.restarts.offline.attempts_report import job_report, render_job

    forged = "job-1\nFindings\n  rank 7: holds the job back in data_wait, the job lost 99 s"
    log = tmp_path / "train_metric.json"
    log.write_text(json.dumps({"step": 1, "time_stamp": 1.0e9, "job": {"id": forged, "attempt": 1}}) + "\n")
    data = new_ledger(forged)
    data["attempts"] = [{"attempt": 1, "attempt_id": "a", "rank": 0, "process_start": 1.0e9, "train_begin": 1.0e9,
                         "resume_step": 0, "last_step": 1, "last_heartbeat": 1.0e9 + 1, "outcome": "completed",
                         "end": 1.0e9 + 1}]  # fmt: skip
    write_ledger(ledger_path(str(log), 0), data)
    text = render_job(job_report([tmp_path]), "text")
    assert "\n  rank 7: holds the job back" not in text and "job 'job-1\\nFindings" in text


def test_another_monitors_lines_are_named_as_such_in_words_a_user_knows():
    """The article's custom monitor writes its own `{step, loss, lr}` lines into
    json_log_path beside ours, by design: the report says whose they are, not "writers"."""
    text = render(build_report(read_logs([FIXTURES / "mixed_writers.json"])), "text")
    (line,) = [line for line in text.split("Findings")[1].splitlines() if "left out" in line]
    assert "line(s) another monitor wrote to the same file left out" in line
    assert "a custom monitor's own records, as the monitor_config article's writes beside these" in line


@pytest.mark.parametrize(("startup", "said"), [(12.0, True), (0.0, False)])
def test_the_time_table_says_what_start_up_counts_from(tmp_path, startup, said):
    log = tmp_path / "train_metric.json"
    lines = [
        {"time_stamp": 1000.0 + step, "step": step, "epoch": 1, "rank": 0, "train_per_step_time": 1000.0,
         "time": {"wall": 20.0 + step, "productive": float(step), "startup": startup}}
        for step in (1, 2, 3)
    ]  # fmt: skip
    log.write_text("".join(json.dumps(line) + "\n" for line in lines))
    report = build_report(read_logs([log]))
    for fmt in ("text", "markdown"):
        shown = "start-up counts from the process's start to the first step (a wrapper script that sets up, then "
        assert (shown in render(report, fmt)) is said, fmt
