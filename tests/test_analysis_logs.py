"""The tolerant JSON-lines reader: discovery, rotated sets, damaged and foreign lines."""

from __future__ import annotations

import json
import math
import shutil

import pytest

from otel_mindformers.outputs.jsonl_reader import LogReadError, as_records, discover, read_logs
from tests.support.jsonl import json_lines as _lines
from tests.support.paths import LOG_FIXTURES as FIXTURES

pytestmark = pytest.mark.analysis


def test_directory_finds_every_rank_file_and_labels_by_rank():
    series = read_logs([FIXTURES / "multirank"])
    assert [s.label for s in series] == ["rank 0", "rank 1", "rank 2", "rank 3"]
    for one in series:
        expected = _lines(FIXTURES / "multirank" / f"train_metric_rank_{one.rank}.json")
        assert [p.step for p in one.points] == [line["step"] for line in expected]
        assert [p.time_stamp for p in one.points] == [line["time_stamp"] for line in expected]


def test_glob_and_explicit_files_are_read_once_each():
    by_glob = read_logs([str(FIXTURES / "multirank" / "*_rank_[01].json")])
    assert [s.rank for s in by_glob] == [0, 1]
    twice = read_logs([FIXTURES / "multirank" / "train_metric_rank_0.json", str(FIXTURES / "multirank" / "*rank_0*")])
    assert len(twice) == 1


def test_rotated_set_is_read_oldest_first_whichever_member_is_named():
    folder = FIXTURES / "rotated"
    expected = [
        line["step"]
        for name in ("train_metric.json.2", "train_metric.json.1", "train_metric.json")
        for line in _lines(folder / name)
    ]
    assert expected == sorted(expected)  # the fixture itself is one run in order
    for named in ("train_metric.json", "train_metric.json.1", "train_metric.json.2"):
        (series,) = read_logs([folder / named])
        assert [p.step for p in series.points] == expected
    (log_set,) = discover([folder])
    assert [p.name for p in log_set.files] == ["train_metric.json.2", "train_metric.json.1", "train_metric.json"]


def test_backups_sort_numerically_past_nine(tmp_path):
    for index in range(1, 12):
        (tmp_path / f"m.json.{index}").write_text(
            json.dumps({"time_stamp": 1.0, "step": 100 - index, "epoch": 1, "rank": 0}) + "\n"
        )
    (tmp_path / "m.json").write_text(json.dumps({"time_stamp": 1.0, "step": 100, "epoch": 1, "rank": 0}) + "\n")
    (series,) = read_logs([tmp_path / "m.json"])
    assert [p.step for p in series.points] == list(range(89, 101))


def test_truncated_last_line_is_skipped_and_noted():
    (series,) = read_logs([FIXTURES / "truncated.json"])
    assert [p.step for p in series.points] == [1, 10, 20]
    assert [str(loc) for loc in series.damaged_tails] == [f"{FIXTURES / 'truncated.json'}:4"]


def test_malformed_line_mid_file_names_file_and_line():
    with pytest.raises(LogReadError) as caught:
        read_logs([FIXTURES / "malformed_mid.json"])
    assert str(caught.value).startswith(f"{FIXTURES / 'malformed_mid.json'}:3: not a JSON line")


def test_custom_monitor_lines_and_alerts_beside_ours():
    (series,) = read_logs([FIXTURES / "mixed_writers.json"])
    # Our lines carry the series; the article's custom-monitor lines and the event line are
    # counted, the alert line becomes a mark.
    assert [p.step for p in series.points] == [1, 10, 20, 30, 40]
    assert series.foreign_lines == 3
    (alert,) = series.alerts
    assert (alert.step, alert.message) == (20, "loss 9.3 above loss_threshold 8.0")
    nonfinite = [p for p in series.points if p.nonfinite]
    assert [(p.step, sorted(p.nonfinite)) for p in nonfinite] == [(30, ["loss"])]
    assert math.isnan(nonfinite[0].value("loss"))


def test_article_custom_monitor_file_alone_is_a_series():
    (series,) = read_logs([FIXTURES / "article_custom_monitor.json"])
    assert [p.step for p in series.points] == [1, 2, 3, 4]
    assert [p.value("learning_rate") for p in series.points] == [0.0001] * 4  # "lr" understood
    assert [p.step for p in series.points if p.nonfinite] == [3]  # a NaN literal


def test_notifier_shaped_alert_lines_are_marks_and_resolved_ones_are_not(tmp_path):
    log = tmp_path / "train_metric.json"
    alert = {
        "source": "otel_mindformers",
        "status": "firing",
        "rule": "loss_threshold",
        "severity": "critical",
        "rank": 0,
        "step": 2,
        "message": "loss 9 > 8",
        "time_stamp": 2.5,
    }
    log.write_text(
        "\n".join(
            json.dumps(line)
            for line in (
                {"time_stamp": 1.0, "step": 1, "epoch": 1, "rank": 0, "loss": 1.0},
                {"time_stamp": 2.0, "step": 2, "epoch": 1, "rank": 0, "loss": 9.0},
                alert,
                {**alert, "status": "resolved", "step": 3},
            )
        )
        + "\n"
    )
    (series,) = read_logs([log])
    assert [(a.step, a.rule, a.message) for a in series.alerts] == [(2, "loss_threshold", "loss 9 > 8")]
    assert series.foreign_lines == 0


def test_one_file_with_several_ranks_splits_into_series(tmp_path):
    log = tmp_path / "all.json"
    log.write_text(
        "".join(
            json.dumps({"time_stamp": float(step), "step": step, "epoch": 1, "rank": rank, "loss": 1.0}) + "\n"
            for step in (1, 2)
            for rank in (0, 1)
        )
    )
    series = read_logs([log])
    assert [(s.rank, [p.step for p in s.points]) for s in series] == [(0, [1, 2]), (1, [1, 2])]


def test_same_rank_in_two_runs_gets_path_labels(tmp_path):
    for run in ("run_a", "run_b"):
        (tmp_path / run).mkdir()
        shutil.copy(FIXTURES / "multirank" / "train_metric_rank_0.json", tmp_path / run)
    series = read_logs([tmp_path / "run_a", tmp_path / "run_b"])
    assert [s.label for s in series] == ["run_a/train_metric_rank_0", "run_b/train_metric_rank_0"]


def test_missing_inputs_are_clear_errors(tmp_path):
    with pytest.raises(LogReadError, match="no such file"):
        read_logs([tmp_path / "absent.json"])
    with pytest.raises(LogReadError, match="no files match"):
        read_logs([str(tmp_path / "*.json")])
    (tmp_path / "config.json").write_text('{\n  "not": "a log"\n}\n')
    with pytest.raises(LogReadError, match="no step logs"):
        read_logs([tmp_path])


def test_as_records_rebuilds_what_the_sink_wrote():
    (series,) = [s for s in read_logs([FIXTURES / "multirank"]) if s.rank == 0]
    records = as_records(series)
    lines = _lines(FIXTURES / "multirank" / "train_metric_rank_0.json")
    # The JSON line a StepRecord renders is the line that was read.
    assert [r.to_json_dict() for r in records] == lines
    assert [r.steps_in_window for r in records] == [1] + [b["step"] - a["step"] for a, b in zip(lines, lines[1:])]
