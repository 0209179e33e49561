"""Two ranks under msrun, restarted together: one job, two ranks per attempt, one ledger per
rank (no collision), and `report` over the output folder sees both."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from tests.support import restart_worker as worker
from tests.support.instrumented import BIN, REPO, child_env, free_port

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.mindspore_api, pytest.mark.msrun_job]

WORKER = REPO / "tests" / "support" / "msrun_restart_worker.py"
STEPS = 10


def _msrun(workdir, spec: dict, workers: int = 2) -> subprocess.CompletedProcess:
    command = [
        str(BIN / "msrun"), f"--worker_num={workers}", f"--local_worker_num={workers}", f"--master_port={free_port()}",
        "--join=True",
        f"--log_dir={workdir / 'msrun_log'}", str(WORKER), json.dumps(spec),
    ]  # fmt: skip
    return subprocess.run(command, cwd=workdir, env=child_env(), capture_output=True, text=True, timeout=600)


def _worker_logs(workdir) -> str:
    return "\n".join(p.read_text()[-3000:] for p in sorted((workdir / "msrun_log").glob("*.log")))


@pytest.mark.msrun_api  # how the launcher ends a job whose worker died, and restarts it
def test_two_ranks_restarted_together_are_one_job_with_two_ranks_per_attempt():
    with worker.private_dir() as workdir:
        config = {
            "interval": 5,
            "output_type": ["json_file"],
            "json_log_path": "./output/train_metric.json",
            "report_ranks": "all",
            "restarts": {"heartbeat_interval": 0.1},
        }
        crashed = _msrun(workdir, {"config": config, "epochs": 3, "steps": STEPS, "crash_at": 15})
        assert crashed.returncode != 0 and "injected crash at step 15" in _worker_logs(workdir)
        resumed = _msrun(workdir, {"config": config, "epochs": 3, "steps": STEPS, "initial_epoch": 1})
        assert resumed.returncode == 0, _worker_logs(workdir)

        output = workdir / "output"
        assert sorted(p.name for p in output.glob("*.ledger")) == [
            "train_metric.job.rank_0.ledger",
            "train_metric.job.rank_1.ledger",
        ]
        ledgers = [json.loads((output / f"train_metric.job.rank_{r}.ledger").read_text()) for r in (0, 1)]
        # One job: both ranks found the same id; each ledger holds its own rank's attempts only.
        assert ledgers[0]["job_id"] == ledgers[1]["job_id"]
        for rank, ledger in enumerate(ledgers):
            entries = ledger["attempts"]
            assert [(a["attempt"], a["rank"], a["outcome"]) for a in entries] == [
                (1, rank, "crashed"),
                (2, rank, "completed"),
            ]
            assert [(a["resume_step"], a["last_step"]) for a in entries] == [(0, 15), (10, 30)]
            assert entries[0]["reason"] == "RuntimeError: injected crash at step 15"
        for rank in (0, 1):
            steps = [
                json.loads(line)["step"]
                for line in (output / f"train_metric_rank_{rank}.json").read_text().splitlines()
            ]
            assert steps == [1, 5, 10, 15, 11, 15, 20, 25, 30]
        report = subprocess.run(
            [sys.executable, "-m", "otel_mindformers.cli", "report", "output", "--format", "json"],
            cwd=workdir, env=child_env(), capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        job = json.loads(report.stdout)["job"]
        assert job["ranks"] == [0, 1] and job["job_id"] == ledgers[0]["job_id"]
        assert [(row["attempt"], row["ranks"], row["lost_steps"]) for row in job["attempts"]] == [
            (1, [0, 1], 5),
            (2, [0, 1], 0),
        ]


def test_a_job_resumed_on_more_ranks_numbers_the_new_ranks_attempt_after_the_jobs():
    """Not msrun_api: the attempts' numbering across ranks is this package's, the same on every
    release; the test above runs the launcher's end and restart of a job on each row.

    Attempt 1 on one rank, killed at step 25; attempt 2 on two ranks from the step-20
    checkpoint. Rank 1's ledger is new, yet its entry is attempt 2, so the report's attempt 2
    ran on ranks 0 and 1 (it was numbered 1 and merged into the killed attempt before)."""
    with worker.private_dir() as workdir:
        config = {
            "interval": 5, "output_type": ["json_file"], "json_log_path": "./output/train_metric.json",
            "report_ranks": "all", "restarts": {"heartbeat_interval": 0.1},
        }  # fmt: skip
        killed = _msrun(workdir, {"config": config, "epochs": 6, "steps": STEPS, "kill_rank": 0, "kill_at": 25}, 1)
        assert killed.returncode != 0
        (workdir / "ckpt" / "rank_1").mkdir()
        newest = max((workdir / "ckpt" / "rank_0").glob("*.ckpt"), key=lambda p: p.stat().st_mtime_ns)
        assert newest.name.endswith("-2_10.ckpt")
        shutil.copy2(newest, workdir / "ckpt" / "rank_1" / newest.name)
        resumed = _msrun(workdir, {"config": config, "epochs": 6, "steps": STEPS, "initial_epoch": 2})
        assert resumed.returncode == 0, _worker_logs(workdir)

        rank1 = json.loads((workdir / "output" / "train_metric.job.rank_1.ledger").read_text())["attempts"]
        assert [(a["attempt"], a["resume_step"], a["outcome"]) for a in rank1] == [(2, 20, "completed")]
        report = subprocess.run(
            [sys.executable, "-m", "otel_mindformers.cli", "report", "output", "--format", "json"],
            cwd=workdir, env=child_env(), capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        job = json.loads(report.stdout)["job"]
        assert [(row["attempt"], row["ranks"], row["outcome"], row["lost_steps"]) for row in job["attempts"]] == [
            (1, [0], "killed", 5),
            (2, [0, 1], "completed", 0),
        ]
        # The totals are the clocks of a rank that saw both attempts.
        assert job["totals"]["rank"] == 0 and job["totals"]["lost_steps"] == 5
