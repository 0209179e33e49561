"""The real MindFormers tiny LLaMA resumed through its own path
(`Trainer.train(resume_training=True)`, meta.json naming the CheckpointMonitor's checkpoint):
the job's step, the attempt chain and the lost steps are recognised there too."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
import yaml

from tests.support import restart_worker as worker
from tests.support.instrumented import REPO, child_env

pytestmark = [pytest.mark.slow, pytest.mark.mindspore_api, pytest.mark.mindformers]

SCRIPT = REPO / "tests" / "support" / "mindformers_attempt.py"
STEPS, SAVE, PAUSE = 8, 4, 6


def _yaml(workdir) -> str:
    document = yaml.safe_load((REPO / "examples" / "mindformers_tiny_llama.yaml").read_text())
    document["callbacks"] = [
        {"type": "MFLossMonitor", "per_print_times": 1},
        {"type": "CheckpointMonitor", "prefix": "llama", "directory": "./ckpt", "save_checkpoint_steps": SAVE},
    ]
    document["monitor_config"] = {
        "enable": True,
        "interval": 1,
        "output_type": ["json_file"],
        "json_log_path": "./output/train_metric.json",
        "restarts": {"heartbeat_interval": 0.1},
    }
    (workdir / "llama.yaml").write_text(yaml.safe_dump(document))
    return "llama.yaml"


def _spawn(workdir, **spec) -> subprocess.Popen:
    command = [sys.executable, "-m", "tests.support.mindformers_cpu", str(SCRIPT), json.dumps(spec)]
    return subprocess.Popen(
        command, cwd=workdir, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def _wait_paused_and_heard(workdir, process, timeout: float = 400) -> None:
    """Until the attempt paused and the ledger has a heartbeat from after the pause."""
    clock, ledger = workdir / "clock.jsonl", workdir / "output" / "train_metric.job.rank_0.ledger"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert process.poll() is None, process.communicate()[1][-4000:]
        paused = [e for e in worker.read_clock(clock) if e.get("event") == "paused"]
        if paused and ledger.exists():
            try:
                if json.loads(ledger.read_text())["attempts"][-1]["last_heartbeat"] > paused[0]["t"] + 0.2:
                    return
            except (ValueError, KeyError, IndexError):
                pass
        time.sleep(0.1)
    raise AssertionError("the attempt never paused")


@pytest.fixture
def workdir():
    with worker.private_dir() as path:
        yield path


def test_a_mindformers_resume_is_the_next_attempt_of_the_job(workdir):
    spec = {
        "yaml": _yaml(workdir),
        "steps": STEPS,
        "clock": str(workdir / "clock.jsonl"),
        "checkpoints": "./ckpt/checkpoint",
    }
    with worker.reaped(_spawn(workdir, **spec, pause_at=PAUSE)) as first:
        _wait_paused_and_heard(workdir, first)
        # Killed once its lines are out, up to the last step our hook saw (the ledger's; the
        # pause may come before our hook at step 6): a SIGKILL loses what is still queued.
        heard = json.loads((workdir / "output" / "train_metric.job.rank_0.ledger").read_text())
        worker.wait_for_line(workdir / "output" / "train_metric.json", heard["attempts"][-1]["last_step"])
        worker.kill(first)
    meta = json.loads((workdir / "ckpt" / "checkpoint" / "rank_0" / "meta.json").read_text())
    assert meta["last_step"] == SAVE  # MindFormers resumes from step 4
    with worker.reaped(_spawn(workdir, **spec, resume=True)) as second:
        out, err = second.communicate(timeout=600)
    assert second.returncode == 0, err[-4000:]

    entries = json.loads((workdir / "output" / "train_metric.job.rank_0.ledger").read_text())["attempts"]
    assert [(a["attempt"], a["outcome"]) for a in entries] == [(1, "killed"), (2, "completed")]
    assert entries[0]["durable_step"] == SAVE  # CheckpointMonitor's save, recognised
    assert entries[1]["resume_step"] == SAVE and entries[1]["last_step"] == STEPS
    assert entries[1]["checkpoint_load_seconds"] > 0
    # The job's step: the second attempt's lines go on from MindFormers' initial step.
    lines = [json.loads(line) for line in (workdir / "output" / "train_metric.json").read_text().splitlines()]
    first_steps = [line["step"] for line in lines if line["job"]["attempt"] == 1]
    assert [line["step"] for line in lines if line["job"]["attempt"] == 2] == list(range(SAVE + 1, STEPS + 1))
    report = subprocess.run(
        [sys.executable, "-m", "otel_mindformers.cli", "report", "output", "--format", "json"],
        cwd=workdir, env=child_env(), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    job = json.loads(report.stdout)["job"]
    assert [row["lost_steps"] for row in job["attempts"]] == [first_steps[-1] - SAVE, 0]
    assert first_steps[-1] - SAVE >= 1
