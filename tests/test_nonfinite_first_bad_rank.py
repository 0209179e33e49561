"""`nonfinite_check: all_ranks` on a real 2-rank job where only rank 1 goes NaN.

With `report_ranks: [0]`, rank 1 writes no training values, so without the check its NaN is
invisible until it reaches rank 0 through the gradients. Each rank is a real training
process with RANK_ID / RANK_SIZE set as msrun sets them; `report` and `hang-report`, run
on their output folder as a user would, name rank 1 and the step.
"""

from __future__ import annotations

import json

import pytest
import yaml

from tests.support.cli import cli_output as _cli
from tests.support.trainer_process import log_tail, spawn

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.analysis]

NAN_STEP = 6


def _train_two_ranks(tmp_path, nonfinite_check: str):
    logs = tmp_path / "logs"
    config = tmp_path / "monitor.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "monitor_config": {
                    "interval": 2,
                    "output_type": ["json_file"],
                    "json_log_path": str(logs / "train_metric.json"),
                    "report_ranks": [0],
                    "nonfinite_check": nonfinite_check,
                }
            }
        )
    )
    ranks = []
    for rank in (0, 1):
        workdir = tmp_path / f"rank{rank}"
        workdir.mkdir()
        env = {"RANK_ID": str(rank), "RANK_SIZE": "2", "DEVICE_ID": str(rank)}
        ranks.append((workdir, spawn(config, workdir, steps=12, nan_at=NAN_STEP if rank == 1 else None, env=env)))
    for workdir, process in ranks:
        assert process.wait(timeout=300) == 0, log_tail(workdir)
    return logs


def test_the_rank_that_goes_nan_first_is_named_with_its_step(tmp_path):
    logs = _train_two_ranks(tmp_path, "all_ranks")
    rank1 = [json.loads(line) for line in (logs / "train_metric_rank_1.json").read_text().splitlines()]
    assert rank1 and all("loss" not in line for line in rank1)  # rank 1 still reports no training values
    # The first sampled step at or after the NaN: the check runs where the loss is read.
    first_seen = next(step for step in range(NAN_STEP, 13) if step % 2 == 0)
    (finding,) = [line.strip() for line in _cli("report", str(logs)).splitlines() if "first non-finite" in line]
    assert finding.startswith(f"first non-finite value at step {first_seen}: rank 1 (") and "loss" in finding
    hang = json.loads(_cli("hang-report", str(logs), "--format", "json"))
    assert hang["first_nonfinite"]["step"] == first_seen
    assert [r["rank"] for r in hang["first_nonfinite"]["ranks"]] == [1]


def test_without_the_check_the_nan_on_a_silent_rank_goes_unnamed(tmp_path):
    logs = _train_two_ranks(tmp_path, "reporting_ranks")
    assert "first non-finite" not in _cli("report", str(logs))


def test_from_json_logs_alone_the_first_bad_rank_is_at_the_first_nonfinite_step(tmp_path, capsys):
    """No diagnosis files: each rank's log says which steps were non-finite; the report names
    the earliest step of all, and only the ranks bad at that step."""
    from otel_mindformers.cli import main

    for rank, steps in ((0, (13, 14, 15)), (1, (12, 16)), (2, ())):
        lines = []
        for step in range(10, 17):
            bad = step in steps
            line = {"time_stamp": float(step), "step": step, "epoch": 1, "rank": rank, "loss": None if bad else 1.0}
            if bad:
                line["nonfinite"] = ["loss"]
            lines.append(json.dumps(line))
        (tmp_path / f"train_metric_rank_{rank}.json").write_text("\n".join(lines) + "\n")
    assert main(["report", str(tmp_path)]) == 0
    (finding,) = [line for line in capsys.readouterr().out.splitlines() if "first non-finite" in line]
    assert finding.strip().endswith("first non-finite value at step 12: rank 1 (a logged value)")
