"""A job's life across restarts (docs/restarts.md), as a user lives it: a real MindSpore
training with ModelCheckpoint every 10 steps, SIGKILLed at step 25, resumed from the step-20
checkpoint (load_checkpoint + initial_epoch), SIGKILLed at step 35, resumed from step 30 and
run to the end; every number checked against the test's own clocks."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from otel_mindformers.names import job as job_names
from otel_mindformers.names import semconv
from otel_mindformers.names.diagnosis import PROGRESS_STEP
from tests.support import restart_worker as worker
from tests.support.html_dom import parse
from tests.support.instrumented import LAUNCHER_SPAN_ID, TRACE_ID, TRACEPARENT
from tests.support.otlp_receiver import OtlpReceiver

pytestmark = pytest.mark.mindspore_api

STEPS, EPOCHS, SAVE = 10, 5, 10
STEP_SLEEP = 0.05


def _cli(*argv: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "otel_mindformers.cli", *argv], cwd=cwd, capture_output=True, text=True, timeout=120
    )


@pytest.fixture(scope="module")
def job():
    """Three attempts of one job; what the test saw of them."""
    with worker.private_dir() as workdir:
        yield from _three_attempts(workdir)


def _three_attempts(workdir: Path):
    checkpoints = workdir / "ckpt"
    checkpoints.mkdir()
    output = workdir / "output"
    ledger = output / "train_metric.job.rank_0.ledger"
    clock = workdir / "clock.jsonl"
    with OtlpReceiver() as receiver:
        config = {
            "interval": 1,
            "output_type": ["json_file", "otlp"],
            "json_log_path": str(output / "train_metric.json"),
            "otlp": {"endpoint": receiver.grpc_endpoint, "protocol": "grpc", "export_interval": 0.2},
            "restarts": {"heartbeat_interval": 0.1},
        }
        base = {
            "config": config, "epochs": EPOCHS, "steps": STEPS, "checkpoint_dir": str(checkpoints),
            "save_steps": SAVE, "clock": str(clock), "step_sleep": STEP_SLEEP,
        }  # fmt: skip
        spawned, killed, pids = [], [], []
        plan = [({"pause_at": 25}, None), ({"pause_at": 35, "initial_epoch": 2}, 20), ({"initial_epoch": 3}, 30)]
        for extra, resume_step in plan:
            spec = {**base, **extra}
            if resume_step is not None:
                spec["resume"] = str(worker.latest_checkpoint(checkpoints))
                assert spec["resume"].endswith(f"-{resume_step // STEPS}_{STEPS}.ckpt")
            spawned.append(time.time())
            # Each attempt started by the same scheduler span (W3C trace context).
            with worker.reaped(worker.spawn(spec, workdir, {"TRACEPARENT": TRACEPARENT})) as process:
                pids.append(process.pid)
                if "pause_at" in extra:
                    worker.wait_for_ledger_step(ledger, extra["pause_at"], process)
                    # Killed once its lines are out: a record still queued when a process is
                    # SIGKILLed is lost (at most 0.5 s of them, docs/restarts.md).
                    worker.wait_for_line(output / "train_metric.json", extra["pause_at"])
                    killed.append(worker.kill(process))
                else:
                    out, err = process.communicate(timeout=300)
                    assert process.returncode == 0, err[-4000:]
        # The last attempt's spans and points are flushed at its end; the killed ones' run
        # spans are recorded by their successors.
        receiver.wait_for(lambda rx: len(rx.spans(semconv.SPAN_RUN)) >= 3, timeout=30)
        yield {
            "workdir": workdir, "output": output, "ledger": json.loads(ledger.read_text()),
            "clock": worker.read_clock(clock), "spawned": spawned, "killed": killed, "pids": pids,
            "receiver": receiver,
        }  # fmt: skip


def _steps_of(job, attempt: int) -> list[dict]:
    pid = job["pids"][attempt - 1]
    return [e for e in job["clock"] if e.get("pid") == pid and "step" in e and "event" not in e]


@pytest.mark.slow
def test_every_output_carries_the_jobs_step_and_a_resume_appends(job):
    lines = [json.loads(line) for line in (job["output"] / "train_metric.json").read_text().splitlines()]
    steps = [line["step"] for line in lines]
    # One file: attempt 2 wrote on after attempt 1 from step 21, attempt 3 from step 31.
    assert steps == list(range(1, 26)) + list(range(21, 36)) + list(range(31, 51))
    assert sorted(p.name for p in job["output"].glob("train_metric*.json")) == ["train_metric.json"]
    assert [line["epoch"] for line in lines if line["step"] in (21, 31, 50)] == [3, 3, 4, 4, 5]
    assert {line["job"]["attempt"] for line in lines[25:40]} == {2}
    assert lines[-1]["job"]["id"] == job["ledger"]["job_id"] and "goodput" in lines[-1]["job"]
    # OTLP: the step spans of the last attempt are 31..50.
    last_attempt = [s for s in job["receiver"].spans(semconv.SPAN_STEP) if s.resource.get(job_names.ATTR_ATTEMPT) == 3]
    assert sorted(s.attributes[semconv.ATTR_STEP] for s in last_attempt) == list(range(31, 51))
    # The heartbeat gauge too: the last attempt's steps are the job's.
    heartbeat = [
        p.value
        for p in job["receiver"].points(PROGRESS_STEP.name)
        if p.resource.get(job_names.ATTR_ATTEMPT) == 3 and p.value
    ]
    assert heartbeat and min(heartbeat) >= 30 and max(heartbeat) == 50


@pytest.mark.slow
def test_three_attempts_with_their_lost_steps_and_how_they_ended(job):
    attempts = job["ledger"]["attempts"]
    assert [a["attempt"] for a in attempts] == [1, 2, 3]
    assert [a["outcome"] for a in attempts] == ["killed", "killed", "completed"]
    assert [(a["resume_step"], a["last_step"], a["durable_step"]) for a in attempts] == [
        (0, 25, 20),
        (20, 35, 30),
        (30, 50, 50),
    ]
    report = json.loads(_cli("report", str(job["output"]), "--format", "json", cwd=job["workdir"]).stdout)["job"]
    assert [row["lost_steps"] for row in report["attempts"]] == [5, 5, 0]
    assert [row["outcome"] for row in report["attempts"]] == ["killed", "killed", "completed"]
    assert report["totals"]["lost_steps"] == 10 and report["totals"]["attempts"] == 3
    assert report["job_id"] == job["ledger"]["job_id"]


@pytest.mark.slow
def test_the_attempts_are_linked_in_the_trace(job):
    # A killed attempt's run span is recorded by the next attempt (its resource's).
    runs = {s.attributes[job_names.ATTR_ATTEMPT]: s for s in job["receiver"].spans(semconv.SPAN_RUN)}
    assert sorted(runs) == [1, 2, 3]
    for number, entry in enumerate(job["ledger"]["attempts"], start=1):
        assert (runs[number].trace_id, runs[number].span_id) == (entry["trace_id"], entry["span_id"])
        assert runs[number].attributes[semconv.ATTR_JOB_ID] == job["ledger"]["job_id"]
        assert runs[number].attributes[job_names.ATTR_ATTEMPT_ID] == entry["attempt_id"]
    assert runs[3].resource[semconv.ATTR_JOB_ID] == job["ledger"]["job_id"]
    assert runs[3].resource[job_names.ATTR_ATTEMPT] == 3
    assert runs[1].links == []
    assert runs[2].links == [(runs[1].trace_id, runs[1].span_id)]
    assert runs[3].links == [(runs[2].trace_id, runs[2].span_id)]
    assert runs[3].attributes[job_names.ATTR_LOST_STEPS] == 5
    assert runs[3].attributes[job_names.ATTR_PREVIOUS_OUTCOME] == "killed"
    # Every attempt's run span is a child of the scheduler's, the killed ones' recorded too.
    assert {(s.trace_id, s.parent_span_id) for s in runs.values()} == {(TRACE_ID, LAUNCHER_SPAN_ID)}
    # The killed attempts' spans end at their last heartbeat, with an error status: before
    # the test's kill, and within the heartbeat's reach of it (a loaded host may starve it).
    for number, entry in enumerate(job["ledger"]["attempts"][:2], start=1):
        assert runs[number].status_code == 2
        ended = runs[number].end_time_unix_nano / 1e9
        assert ended == pytest.approx(entry["last_heartbeat"], abs=1e-3), (ended, entry)
        assert job["spawned"][number - 1] < ended <= job["killed"][number - 1]


@pytest.mark.slow
def test_downtime_matches_the_gap_the_test_measured(job):
    report = json.loads(_cli("report", str(job["output"]), "--format", "json", cwd=job["workdir"]).stdout)["job"]
    for number in (2, 3):
        first_step_seen = _steps_of(job, number)[0]["t"]
        downtime = report["attempts"][number - 1]["downtime"]
        previous, this = job["ledger"]["attempts"][number - 2], job["ledger"]["attempts"][number - 1]
        # From the killed attempt's last heartbeat to this one's first step: inside the test's
        # own readings (its kill, the step its worker saw), however late a loaded host ran them.
        assert downtime["total"] == pytest.approx(this["first_step_end"] - previous["last_heartbeat"], abs=1e-3)
        assert previous["last_heartbeat"] <= job["killed"][number - 2] and this["first_step_end"] <= first_step_seen
        # Split: no process, then start-up, checkpoint load and compile of the next attempt.
        assert downtime["no_process"] + downtime["startup"] + downtime["checkpoint_load"] + downtime["compile"] == (
            pytest.approx(downtime["total"], abs=0.3)
        )
        assert downtime["no_process"] == pytest.approx(this["process_start"] - previous["last_heartbeat"], abs=1e-3)
        # The process start from /proc, in clock ticks: at most one after the test spawned it.
        assert job["killed"][number - 2] <= job["spawned"][number - 1] <= this["process_start"] + 0.02
        assert downtime["checkpoint_load"] > 0


@pytest.mark.slow
def test_job_goodput_matches_a_hand_calculation_from_the_tests_clocks(job):
    resumes = [0, 20, 30]
    productive = 0.0
    for number in (1, 2, 3):
        steps = _steps_of(job, number)
        last = steps[-1]["step"]
        # The attempt's steps after its first, each from its begin to its end as
        # MonitorCallback's neighbours saw them: the time between steps (the worker's
        # sleep, checkpoint saves, the next batch) is badput, as in the run's own breakdown.
        mine = [e for e in job["clock"] if e.get("pid") == steps[0]["pid"]]
        begins = {e["step_begin"]: e["t"] for e in mine if "step_begin" in e}
        ends = {e["step_end"]: e["t"] for e in mine if "step_end" in e}
        computing = sum(ends[e["step"]] - begins[e["step"]] for e in steps[1:])
        lost = last - resumes[number] if number < 3 else 0
        productive += computing - lost * computing / (len(steps) - 1)
    returned = next(e["t"] for e in job["clock"] if e.get("event") == "returned")
    hand = productive / (returned - job["spawned"][0])
    report = json.loads(_cli("report", str(job["output"]), "--format", "json", cwd=job["workdir"]).stdout)["job"]
    assert report["totals"]["goodput"] == pytest.approx(hand, rel=0.05)
    # The categories and the productive time make up the job's wall time.
    totals = report["totals"]
    assert sum(totals["seconds"].values()) == pytest.approx(totals["wall_seconds"], rel=0.01)
    assert totals["badput_types"]["lost_progress"] == "WASTED_PROGRESS_FROM_DISRUPTION"
    # The last attempt exported the job goodput; its last value is the ledger's.
    points = [
        p for p in job["receiver"].points(job_names.JOB_GOODPUT.name) if p.resource.get(job_names.ATTR_ATTEMPT) == 3
    ]
    assert points and points[-1].value == pytest.approx(hand, rel=0.05)


@pytest.mark.slow
def test_report_and_plot_show_the_attempts(job, tmp_path):
    text = _cli("report", str(job["output"]), cwd=job["workdir"]).stdout
    assert f"job {job['ledger']['job_id']}: 3 attempts, 1 rank(s)" in text
    assert "killed     1..25   5" in text and "completed  31..50  0" in text
    findings = text.split("Findings")[1].split("job ")[0]
    assert "restart, step went from" not in findings, "the ledger explains both resumes"
    image = tmp_path / "attempts.png"
    result = _cli("plot", "--attempts", str(job["output"]), "-o", str(image), cwd=job["workdir"])
    assert result.returncode == 0, result.stderr
    assert image.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    html = tmp_path / "job.html"
    assert _cli("report", str(job["output"]), "--html", str(html), cwd=job["workdir"]).returncode == 0
    ended = [td.text() for td in parse(html.read_text(encoding="utf-8")).all("td", "col-ended")]
    # It read "killed (no end record (inferred from its last heartbeat))".
    assert ended == ["killed — no end record, inferred from its last heartbeat"] * 2 + ["completed"]


@pytest.mark.slow
def test_a_killed_attempts_last_step_comes_from_its_log_when_the_heartbeat_lags():
    """A heartbeat every 10 minutes: the ledger last heard of attempt 1 at its step-20
    checkpoint, its log at step 25. The report counts the five steps attempt 2 computes again,
    and the wait for data attempt 1's last line carries (the ledger's is of an earlier step:
    without a heartbeat since its first step, it would be none)."""
    with worker.private_dir() as workdir:
        checkpoints, output, clock = workdir / "ckpt", workdir / "output", workdir / "clock.jsonl"
        checkpoints.mkdir()
        config = {
            "interval": 1,
            "output_type": ["json_file"],
            "json_log_path": str(output / "train_metric.json"),
            "restarts": {"heartbeat_interval": 600},
        }
        base = {
            "config": config, "epochs": EPOCHS, "steps": STEPS, "checkpoint_dir": str(checkpoints),
            "save_steps": SAVE, "clock": str(clock), "step_sleep": STEP_SLEEP,
        }  # fmt: skip
        with worker.reaped(worker.spawn({**base, "pause_at": 25}, workdir)) as process:
            worker.wait_for_line(output / "train_metric.json", 25)
            worker.kill(process)
        ledger = json.loads((output / "train_metric.job.rank_0.ledger").read_text())
        assert ledger["attempts"][0]["last_step"] < 25, "the test needs a heartbeat behind the log"
        resumed = {**base, "initial_epoch": 2, "resume": str(worker.latest_checkpoint(checkpoints))}
        with worker.reaped(worker.spawn(resumed, workdir)) as process:
            _, err = process.communicate(timeout=300)
            assert process.returncode == 0, err[-4000:]
        text = _cli("report", str(output), cwd=workdir).stdout
        assert "killed     1..25   5" in text and "completed  21..50  0" in text, text
        job = json.loads(_cli("report", str(output), "--format", "json", cwd=workdir).stdout)["job"]
        assert job["totals"]["lost_steps"] == 5
        # Alive at its last line: the attempt ends no earlier (the line's time is written to the
        # microsecond, the flight ring's unrounded), and the time still adds up.
        killed = job["attempts"][0]
        last_line = [json.loads(line) for line in (output / "train_metric.json").read_text().splitlines()][24]
        assert last_line["step"] == 25 and killed["end"] >= last_line["time_stamp"] - 1e-6
        assert sum(job["totals"]["seconds"].values()) == pytest.approx(job["totals"]["wall_seconds"], rel=1e-6)
        assert ledger["attempts"][0]["data_wait_step"] < 25, "the test needs a ledger behind the log's wait"
        assert killed["seconds"]["data_wait"] == pytest.approx(last_line["time"]["data_wait"], rel=1e-6)
        assert killed["seconds"]["data_wait"] >= 20 * STEP_SLEEP
