"""Many writers, one folder: eight ranks and the article's custom monitor never break a line.

The ranks are real training processes with RANK_ID / RANK_SIZE set as msrun sets them; each
also runs the article's custom monitor (examples/custom_monitor.py), which appends to
`json_log_path` itself, so all eight append to one shared file while our writer keeps
its per-rank file.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.paths import EXAMPLES, REPO
from tests.support.reliability_worker import run, spawn

RANKS = 8
STEPS = 60


def _config(logs: Path) -> dict:
    return {
        "interval": 1,
        "output_type": ["json_file", "tensorboard"],
        "json_log_path": str(logs / "train_metric.json"),
        "tensorboard_path": str(logs / "tensorboard"),
        "custom_monitor_callback": "custom_monitor.CustomMetricMonitor",
        "alert_config": {"loss_threshold": 1e9},
    }


def _parse_all(path: Path) -> list[dict]:
    text = path.read_text()
    assert text.endswith("\n")
    return [json.loads(line) for line in text.splitlines()]


@pytest.mark.slow
def test_eight_ranks_write_one_folder(tmp_path):
    logs = tmp_path / "logs"
    processes = []
    for rank in range(RANKS):
        spec = {"config": _config(logs), "steps": STEPS, "graph": True, "report": str(tmp_path / f"report_{rank}.json")}
        env = {
            "RANK_ID": str(rank),
            "RANK_SIZE": str(RANKS),
            "DEVICE_ID": str(rank),
            "PYTHONPATH": f"{EXAMPLES}:{REPO}",
        }
        processes.append(spawn(spec, tmp_path, env))
    failures = []
    for rank, process in enumerate(processes):
        try:
            _, stderr = process.communicate(timeout=400)
        finally:
            if process.poll() is None:
                process.kill()
                process.communicate()
        if process.returncode != 0:
            failures.append((rank, stderr[-2000:]))
    assert not failures

    for rank in range(RANKS):
        lines = _parse_all(logs / f"train_metric_rank_{rank}.json")
        assert [line["step"] for line in lines] == list(range(1, STEPS + 1))
        assert {line["rank"] for line in lines} == {rank}
        assert (logs / "tensorboard" / f"rank_{rank}").is_dir()
    shared = _parse_all(logs / "train_metric.json")
    assert len(shared) == RANKS * STEPS, "every custom-monitor line of every rank is whole"
    assert all(set(line) == {"time_stamp", "step", "loss", "lr"} for line in shared)


@pytest.mark.slow
def test_custom_monitor_and_builtin_writer_share_one_file(tmp_path):
    spec = {
        "config": _config(tmp_path / "logs"),
        "steps": STEPS,
        "graph": True,
        "report": str(tmp_path / "report.json"),
    }
    process, _ = run(spec, tmp_path, env={"PYTHONPATH": f"{EXAMPLES}:{REPO}"})
    assert process.returncode == 0, process.stderr[-3000:]
    lines = _parse_all(tmp_path / "logs" / "train_metric.json")
    ours = [line["step"] for line in lines if "epoch" in line]
    theirs = [line["step"] for line in lines if "lr" in line and "epoch" not in line]
    assert ours == list(range(1, STEPS + 1))
    assert theirs == list(range(1, STEPS + 1))
    assert len(lines) == 2 * STEPS
