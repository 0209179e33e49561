"""The analysis CLI at scale and on hostile input: many files, link loops, a large log,
absurd numbers. Speed itself is measured by benchmarks/bench_report.py, not asserted here."""

from __future__ import annotations

import json
import os
import tracemalloc
from pathlib import Path

import pytest

from otel_mindformers.analysis.report import build_report, report_logs
from otel_mindformers.outputs import jsonl_reader as logs
from otel_mindformers.outputs.jsonl_reader import discover, read_logs
from tests.support.cli import cli
from tests.support.paths import LOG_FIXTURES as FIXTURES

pytestmark = pytest.mark.analysis


def _line(step: int, rank: int = 0, **extra) -> str:
    return (
        json.dumps(
            {
                "time_stamp": 1.7e9 + step,
                "step": step,
                "epoch": 1,
                "rank": rank,
                "loss": 2.0 / step,
                "train_per_step_time": 100.0 + step % 7,
                **extra,
            }
        )
        + "\n"
    )


def test_each_folder_is_listed_once(tmp_path, monkeypatch):
    """Discovery is linear: N files in a folder cost one listing, not one per file."""
    for rank in range(300):
        (tmp_path / f"train_metric_rank_{rank}.json").write_text(_line(1, rank))
    (tmp_path / "train_metric_rank_0.json.1").write_text(_line(1, 0))
    listed: list[str] = []
    real_scandir = os.scandir

    def counting_scandir(path="."):
        listed.append(str(path))
        return real_scandir(path)

    real_iterdir = Path.iterdir

    def counting_iterdir(self):
        listed.append(str(self))
        return real_iterdir(self)

    monkeypatch.setattr(logs.os, "scandir", counting_scandir)
    monkeypatch.setattr(Path, "iterdir", counting_iterdir)
    sets = discover([tmp_path])
    assert len(sets) == 300 and sets[0].files[0].name == "train_metric_rank_0.json.1"
    assert len(listed) <= 2, listed  # the walk's listing and the backups' listing


def test_labels_of_many_series_stay_distinct(tmp_path):
    for run in ("a", "b"):
        (tmp_path / run).mkdir()
        for rank in range(3):
            (tmp_path / run / f"m_rank_{rank}.json").write_text(_line(1, rank))
    labels = [s.label for s in read_logs([tmp_path / "a", tmp_path / "b"])]
    assert labels == [f"{run}/m_rank_{rank}" for run in "ab" for rank in range(3)]


@pytest.mark.parametrize("how", ["folder", "glob"])
def test_symlink_loops_end_and_each_file_is_read_once(tmp_path, how):
    logs_dir = tmp_path / "logs"
    (logs_dir / "sub").mkdir(parents=True)
    (logs_dir / "train_metric_rank_0.json").write_text(_line(1, 0))
    (logs_dir / "sub" / "train_metric_rank_1.json").write_text(_line(1, 1))
    (logs_dir / "loop").symlink_to(logs_dir)  # a link to its own folder
    (logs_dir / "sub" / "up").symlink_to(logs_dir)  # and a cycle through a subfolder
    (logs_dir / "sub" / "self").symlink_to("self")  # a link to itself
    target = str(logs_dir) if how == "folder" else f"{logs_dir}/**/*_rank_*.json"
    series = read_logs([target])
    assert sorted(s.rank for s in series) == [0, 1]


def test_glob_semantics_of_double_star(tmp_path):
    (tmp_path / "x" / "y").mkdir(parents=True)
    for path in ("m_rank_0.json", "x/m_rank_1.json", "x/y/m_rank_2.json", "x/y/other.txt"):
        (tmp_path / path).write_text(_line(1, int(path[-6]) if path.endswith(".json") else 0))
    found = [s.files[-1].relative_to(tmp_path).as_posix() for s in read_logs([f"{tmp_path}/**/m_rank_*.json"])]
    assert found == ["m_rank_0.json", "x/m_rank_1.json", "x/y/m_rank_2.json"]
    assert [s.rank for s in read_logs([f"{tmp_path}/x/*/m_rank_?.json"])] == [2]


@pytest.mark.parametrize(
    "fixture",
    [
        "multirank",
        "gap_and_restart.json",
        "rotated",
        "mixed_writers.json",
        "truncated.json",
        "article_custom_monitor.json",
    ],
)
def test_streamed_report_equals_the_report_of_read_series(fixture):
    assert report_logs([FIXTURES / fixture]) == build_report(read_logs([FIXTURES / fixture]))


@pytest.mark.slow
def test_a_large_log_is_summarised_in_bounded_memory(tmp_path):
    log = tmp_path / "large.json"
    with log.open("w") as handle:
        for step in range(1, 60_001):
            handle.write(_line(step if step != 30_000 else 30_050, learning_rate=1e-4, grad_norm=1.5))
    size = log.stat().st_size
    tracemalloc.start()
    try:
        report = report_logs([log])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    (summary,) = report.series
    assert summary.records == 60_000 and summary.stride == 1
    assert [(gap.after, gap.before) for gap in summary.gaps] == [(29_999, 30_050)]
    assert [(r.from_step, r.to_step) for r in summary.restarts] == [(30_050, 30_001)]
    # A read record (its dict, point and location) takes about 1.5 kB; the summary keeps a
    # step time and, for each step jump, where it was: under 100 bytes a record.
    assert peak < 100 * 60_000 < size, f"peak {peak} bytes for a {size}-byte log: the records are kept"


@pytest.mark.slow  # `otel-mindformers replay` in a child process
def test_replay_of_absurd_numbers_names_each_line_and_fails(tmp_path):
    log = tmp_path / "absurd.json"
    log.write_text(
        _line(1)
        + json.dumps({"time_stamp": 1e300, "step": 2, "epoch": 1, "rank": 0, "loss": 1.0})
        + "\n"
        + json.dumps({"time_stamp": 1.7e9, "step": 2**70, "epoch": 1, "rank": 0, "loss": 1.0})
        + "\n"
        + json.dumps({"time_stamp": 1.7e9, "step": 4, "epoch": 1, "rank": 1e20, "loss": 1.0})
        + "\n"
    )
    result = cli("replay", str(log), "--tensorboard", str(tmp_path / "tb"), cwd=tmp_path)
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert result.stderr.splitlines() == [
        f"error: {log}:2: time_stamp 1e+300 is not a time between 1970 and 2262 (seconds since the epoch)",
        f"error: {log}:3: step {2**70} is outside 0..2**63-1",
        f"error: {log}:4: rank {10**20} is outside 0..2**63-1",
        "error: nothing sent: 3 record(s) cannot be replayed",
    ]
    assert not (tmp_path / "tb").exists()
