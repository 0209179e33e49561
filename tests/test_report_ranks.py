"""`report_ranks` as an explicit list, in a real 2-rank job: two training processes with
RANK_ID / RANK_SIZE set as msrun sets them. The ranks listed write training values (and
stdout lines); the others only keep their own per-rank file of steps and timings."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from otel_mindformers.names import training as tm
from tests.support.cli import cli
from tests.support.reliability_worker import finish, spawn

pytestmark = pytest.mark.slow

RANKS = 2
STEPS = 6
TRAINING_VALUES = {tm.LOSS, tm.GRAD_NORM, tm.LEARNING_RATE}


def _run_job(tmp_path: Path, report_ranks) -> dict[int, tuple[list[dict], str]]:
    """Each rank's JSON lines and stdout."""
    logs = tmp_path / "logs"
    config = {
        "interval": 1,
        "output_type": ["stdout", "json_file"],
        "json_log_path": str(logs / "train_metric.json"),
        "report_ranks": report_ranks,
    }
    processes = [
        spawn(
            {"config": config, "steps": STEPS, "shape": "tuple5", "report": str(tmp_path / f"report_{rank}.json")},
            tmp_path,
            {"RANK_ID": str(rank), "RANK_SIZE": str(RANKS), "DEVICE_ID": str(rank)},
        )
        for rank in range(RANKS)
    ]
    results = {}
    for rank, process in enumerate(processes):
        stdout, stderr = finish(process, timeout=300)
        assert process.returncode == 0, stderr[-3000:]
        path = logs / f"train_metric_rank_{rank}.json"
        results[rank] = ([json.loads(line) for line in path.read_text().splitlines()], stdout)
    return results


def test_only_the_listed_rank_writes_training_values(tmp_path):
    results = _run_job(tmp_path, [1])
    reported, reported_stdout = results[1]
    silent, silent_stdout = results[0]
    assert [line["step"] for line in reported] == list(range(1, STEPS + 1))
    assert all(line["rank"] == 1 and line.keys() >= TRAINING_VALUES for line in reported)
    assert [line["step"] for line in silent] == list(range(1, STEPS + 1)), "every rank keeps its own file"
    assert all(line["rank"] == 0 and not TRAINING_VALUES & line.keys() for line in silent)
    assert "[otel_mindformers] rank 1" in reported_stdout
    assert "[otel_mindformers]" not in silent_stdout


def test_every_listed_rank_reports(tmp_path):
    results = _run_job(tmp_path, [0, 1])
    for rank, (lines, stdout) in results.items():
        assert all(line.keys() >= TRAINING_VALUES for line in lines), rank
        assert f"[otel_mindformers] rank {rank}" in stdout


def test_report_says_when_a_ranks_log_is_missing(tmp_path):
    """Every line of a multi-rank job says how many ranks it has: a copy of the folder
    without rank 1's log is reported as 1 of 2 ranks, not as a 1-rank job."""
    results = _run_job(tmp_path, [0])
    assert all(line["world_size"] == RANKS for lines, _ in results.values() for line in lines)
    (tmp_path / "logs" / "train_metric_rank_1.json").unlink()
    done = cli("report", str(tmp_path / "logs"))
    assert done.returncode == 0, done.stderr
    assert "logs of 1 of 2 ranks (none for rank 1); cannot compare ranks" in done.stdout
    whole = tmp_path / "whole"
    (whole).mkdir()
    for rank, (lines, _) in results.items():
        (whole / f"train_metric_rank_{rank}.json").write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert "cannot compare ranks" not in cli("report", str(whole)).stdout
