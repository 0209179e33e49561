"""The flight recorder (docs/flight_recorder.md): when a rank dies (SIGKILL, the OOM killer,
`os._exit`, `abort()`, a segfault), the records its outputs had not written yet and the exact
step it finished survive in the ring beside its JSON log; the next attempt, `report`,
`hang-report` and `replay` recover them, once, and never another rank's or job's.

The fast tests drive the ring's files directly (real files, real locks); the slow ones kill
real MindSpore trainings with real signals.
"""

from __future__ import annotations

import json
import logging
import signal
import struct
import subprocess
import time
from pathlib import Path

import pytest

from otel_mindformers.flight_recorder import ring as ring_format
from otel_mindformers.flight_recorder.offline.recover_logs import recover_rings
from otel_mindformers.flight_recorder.recovery import finished_steps_of, tails_of_run, take_tail
from otel_mindformers.flight_recorder.ring import HEADER_BYTES, SLOT_BYTES, SLOT_COUNT, RingWriter, ring_name
from otel_mindformers.names import job as job_names
from otel_mindformers.names import semconv
from otel_mindformers.names import training as tm
from otel_mindformers.telemetry.step_ids import job_step_ids, job_trace_key
from tests.support import restart_worker
from tests.support.cli import cli_output
from tests.support.instrumented import BIN, REPO, child_env, free_port
from tests.support.jsonl import json_lines
from tests.support.otlp_receiver import OtlpReceiver
from tests.support.permissions import obey_file_permissions
from tests.support.reliability_worker import finish, spawn
from tests.support.tensorboard_events import loss_steps
from tests.support.waiting import wait_until

pytestmark = pytest.mark.mindspore_api  # cb_params, the step hook, restarts, msrun


def _ring(folder: Path, rank: int = 0, job_id: str = "job-a", attempt_id: str = "a1", attempt: int = 1) -> RingWriter:
    return RingWriter(
        ring_name(folder / "train_metric.json", rank, attempt_id),
        rank=rank, job_id=job_id, attempt_id=attempt_id, attempt=attempt, json_name="train_metric.json",
        perf0=100.0, wall0=1_800_000_000.0, created=time.time(), flags=ring_format.FLAG_STEP_TIME,
    )  # fmt: skip


def _sampled(step: int, **values: float | bool) -> tuple:
    """What MonitorRun.sample hands the pipeline: a window of 2 steps ending at perf 100 + step."""
    return (
        step, 1, {tm.LOSS: 1.0 / step, tm.OVERFLOW: False, **values}, None, False,
        2, 0.5, 99.5 + step, 99.9 + step, 100.0 + step, 0.1, 0.0, 0.0,
    )  # fmt: skip


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


# --- the ring's files ------------------------------------------------------------------------


def test_a_dead_rings_tail_is_what_the_outputs_had_not_written_and_is_recovered_once(tmp_path):
    writer = _ring(tmp_path)
    for step in range(1, 31):
        writer.finished[0] = step
        writer.write(_sampled(step))
    writer.written(20)
    writer.finished[0] = 33  # three more steps finished, none sampled
    path = writer.path
    assert take_tail(path) is None, "a ring whose writer lives is not recovered"
    writer.close(remove=False)  # as a death leaves it: the lock goes with the process

    tail = take_tail(path)
    assert tail is not None and [slot.step for slot in tail.slots] == list(range(21, 31))
    lines = [record.to_json_dict() for record in tail.records()]
    assert lines[0] == {
        "time_stamp": 1_800_000_000.0 + 21,  # the run's origin + (the step's end - its perf origin)
        "step": 21, "epoch": 1, "rank": 0, "loss": pytest.approx(1 / 21), "overflow": False,
        "train_per_step_time": pytest.approx(250.0),  # 0.5 s over 2 steps
        "job": {"id": "job-a", "attempt": 1}, "recovered": True,
    }  # fmt: skip
    tail.mark_written()
    tail.release()
    assert finished_steps_of(str(tmp_path / "train_metric.json"), 0)["a1"].step == 33
    again = take_tail(path)
    assert again is not None and again.slots == []
    again.release()


def test_a_ring_that_wrapped_keeps_its_last_slots_in_order(tmp_path):
    writer = _ring(tmp_path)
    for step in range(1, SLOT_COUNT + 101):
        writer.write(_sampled(step))
    writer.close(remove=False)
    tail = take_tail(writer.path)
    assert [slot.step for slot in tail.slots] == list(range(101, SLOT_COUNT + 101))
    tail.release()


def test_a_slot_cut_by_a_death_is_left_out_and_a_damaged_one_gives_one_warning(tmp_path, caplog):
    writer = _ring(tmp_path)
    for step in range(1, 6):
        writer.write(_sampled(step))
    writer.close(remove=False)
    with open(writer.path, "r+b") as stream:
        stream.seek(HEADER_BYTES + 3 * SLOT_BYTES)  # step 3's: a death before its commit marker
        stream.write(bytes(8))
        stream.seek(HEADER_BYTES + 4 * SLOT_BYTES + 8)  # step 4's body: a damaged disk
        stream.write(b"\xff\xff")
    with caplog.at_level(logging.WARNING, logger="otel_mindformers"):
        tail = take_tail(writer.path)
        tail.release()
        take_tail(writer.path).release()
    assert [slot.step for slot in tail.slots] == [1, 2, 5]
    assert [w for w in _warnings(caplog) if "torn" in w or "damaged" in w] == [
        f"otel_mindformers: the flight ring {writer.path} holds 1 damaged slot(s); skipped, the rest recovered"
    ]


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(lambda data: b"not a ring at all" + data[17:], id="garbage"),
        pytest.param(lambda data: data[: HEADER_BYTES + 100], id="truncated"),
        pytest.param(lambda data: data[:8] + struct.pack("<I", 0) + data[12:], id="an-older-format"),
        pytest.param(lambda data: data[:8] + struct.pack("<I", 99) + data[12:], id="a-newer-format"),
    ],
)
def test_a_corrupt_or_foreign_format_ring_gives_one_warning_and_nothing_recovered(tmp_path, caplog, damage):
    writer = _ring(tmp_path)
    writer.write(_sampled(1))
    writer.close(remove=False)
    writer.path.write_bytes(damage(writer.path.read_bytes()))
    with caplog.at_level(logging.WARNING, logger="otel_mindformers"):
        assert tails_of_run(str(tmp_path / "train_metric.json"), 0, "job-a") == []
        assert tails_of_run(str(tmp_path / "train_metric.json"), 0, "job-a") == []
        assert recover_rings([writer.path]) == []
    assert len([w for w in _warnings(caplog) if "cannot be read" in w]) == 1, _warnings(caplog)
    assert not writer.path.exists() and writer.path.with_name(writer.path.name + ".corrupt").exists()
    assert not (tmp_path / "train_metric.json").exists()


def test_another_jobs_or_ranks_ring_is_never_recovered(tmp_path):
    rings = [_ring(tmp_path, job_id="job-a"), _ring(tmp_path, job_id="job-b", attempt_id="b1"), _ring(tmp_path, rank=1)]
    for writer in rings:
        writer.write(_sampled(7))
        writer.close(remove=False)
    before = {writer.path: writer.path.read_bytes() for writer in rings}
    (mine,) = tails_of_run(str(tmp_path / "train_metric.json"), 0, "job-b")
    assert mine.path == rings[1].path
    mine.release()
    # Job a's ring, and rank 1's, as they were: nothing read them under a lock, nothing wrote.
    assert rings[0].path.read_bytes() == before[rings[0].path]
    assert rings[2].path.read_bytes() == before[rings[2].path]


def test_offline_recovery_leaves_a_ring_whose_log_holds_another_jobs_lines(tmp_path, caplog):
    writer = _ring(tmp_path, job_id="job-a")
    writer.write(_sampled(5))
    writer.close(remove=False)
    log = tmp_path / "train_metric.json"
    log.write_text(json.dumps({"step": 1, "time_stamp": 1.0, "job": {"id": "job-b", "attempt": 1}}) + "\n")
    before = log.read_bytes()
    with caplog.at_level(logging.WARNING, logger="otel_mindformers"):
        assert recover_rings([writer.path]) == []
    assert log.read_bytes() == before
    assert [w for w in _warnings(caplog) if "job 'job-a'" in w and "job 'job-b'" in w]
    tail = take_tail(writer.path)
    assert [slot.step for slot in tail.slots] == [5]  # still there for job a
    tail.release()


def test_recovery_skips_the_lines_an_output_wrote_past_the_rings_mark(tmp_path):
    """A JSON output that failed part-way through a batch (a full disk) wrote some of its
    lines without the ring's mark moving: they are not written twice."""
    writer = _ring(tmp_path)
    for step in range(1, 11):
        writer.write(_sampled(step))
    writer.written(4)
    writer.close(remove=False)
    log = tmp_path / "train_metric.json"
    job = {"id": "job-a", "attempt": 1}
    log.write_text("".join(json.dumps({"step": s, "time_stamp": 1.0, "job": job}) + "\n" for s in range(1, 8)))
    assert recover_rings([writer.path]) == [(log, 3)]
    assert [line["step"] for line in json_lines(log)] == list(range(1, 11))


# --- real trainings, real deaths -------------------------------------------------------------


def _cli_report(folder: Path) -> dict:
    return json.loads(cli_output("report", str(folder), "--json", cwd=folder))


def _die_at(tmp_path: Path, step: int, how: str, interval: int, steps: int = 200, **extra) -> subprocess.Popen:
    spec = {
        "config": {
            "interval": interval,
            "output_type": ["json_file"],
            "json_log_path": str(tmp_path / "out" / "train_metric.json"),
            **extra.pop("config", {}),
        },
        "steps": steps,
        "graph": True,
        "report": str(tmp_path / "report.json"),
        "at": {str(step): [["die", how]]},
        **extra,
    }
    return spawn(spec, tmp_path)


def _sampled_steps(interval: int, last: int) -> list[int]:
    """The steps a run samples (the first, then every interval-th), up to `last`."""
    return [1] + [s for s in range(2, last + 1) if s % interval == 0]


def _check_recovered_log(log: Path, interval: int, killed_at: int) -> list[dict]:
    lines = json_lines(log)  # every line whole
    steps = [line["step"] for line in lines]
    assert steps == _sampled_steps(interval, killed_at), steps
    recovered = [line for line in lines if line.get("recovered")]
    # The recovered ones are the last: what the worker had not written when the process died.
    assert lines[len(lines) - len(recovered) :] == recovered
    return lines


@pytest.mark.slow  # real trainings, killed
@pytest.mark.parametrize(
    ("interval", "killed_at"),
    [(1, 23), (1, 133), (10, 11), (10, 57), (10, 60)],  # 11: right after a sampled step; 57: mid-window
)
def test_sigkill_the_log_ends_at_the_last_sampled_step_and_report_gives_the_step(tmp_path, interval, killed_at):
    process = _die_at(tmp_path, killed_at, "SIGKILL", interval)
    finish(process)
    assert process.returncode == -signal.SIGKILL
    log = tmp_path / "out" / "train_metric.json"
    report = _cli_report(tmp_path / "out")
    _check_recovered_log(log, interval, killed_at)
    (attempt,) = report["job"]["attempts"]
    assert (attempt["outcome"], attempt["last_step"]) == ("killed", killed_at)
    # A second reader finds nothing more to recover: each record once.
    before = log.read_bytes()
    assert _cli_report(tmp_path / "out")["job"]["attempts"][0]["last_step"] == killed_at
    assert log.read_bytes() == before


@pytest.mark.slow  # real trainings, dying
@pytest.mark.parametrize("how", ["abort", "segfault", "exit"])
def test_abort_segfault_and_exit_without_handlers_lose_nothing(tmp_path, how):
    process = _die_at(tmp_path, 57, how, 10)
    finish(process)
    assert process.returncode != 0
    report = _cli_report(tmp_path / "out")
    _check_recovered_log(tmp_path / "out" / "train_metric.json", 10, 57)
    assert report["job"]["attempts"][0]["last_step"] == 57


@pytest.mark.slow  # a real training killed, then the job's next attempt
def test_the_next_attempt_recovers_the_tail_into_tensorboard_too(tmp_path):
    """TensorBoard flushes its event file every second: a kill loses the last second of
    scalars. The job's next attempt writes them from the ring before its own outputs set
    the dead run's files aside, so TensorBoard's own reader finds every step."""
    board = tmp_path / "board"
    config = {"job_id": "tb-job", "output_type": ["json_file", "tensorboard"], "tensorboard_path": str(board)}
    killed = _die_at(tmp_path, 150, "SIGKILL", 1, config=config)
    finish(killed)
    assert killed.returncode == -signal.SIGKILL
    next_attempt = spawn(
        {"config": {"interval": 1, "json_log_path": str(tmp_path / "out" / "train_metric.json"), **config},
         "steps": 3, "report": str(tmp_path / "next.json")},
        tmp_path,
    )  # fmt: skip
    _, err = finish(next_attempt)
    assert next_attempt.returncode == 0, err[-3000:]
    assert "recovered" in err
    (dead_run,) = [folder for folder in (board / "rank_0").iterdir() if folder.is_dir()]  # set aside
    assert loss_steps(dead_run) == list(range(1, 151))


@pytest.mark.slow  # a real training, killed from outside
def test_a_sigkill_from_outside_as_the_oom_killer_sends_it(tmp_path):
    """This machine's cgroup v2 has no memory controller (and the v1 memory cgroup is the
    sandbox's): the kernel's OOM killer is played by its signal, SIGKILL from another
    process, while the training thread is inside the step (the step's callbacks)."""
    marker = tmp_path / "at-step-45"
    spec_extra = {"at": {"45": [["touch", str(marker)], ["sleep", 600]]}}
    process = _die_at(tmp_path, 10_000, "SIGKILL", 10, **spec_extra)
    try:
        wait_until(marker.exists, "the worker at step 45", process, timeout=180)
        process.send_signal(signal.SIGKILL)
    finally:
        finish(process)
    report = _cli_report(tmp_path / "out")
    _check_recovered_log(tmp_path / "out" / "train_metric.json", 10, 45)
    assert report["job"]["attempts"][0]["last_step"] == 45


@pytest.mark.slow  # two real trainings as two ranks, one killed
def test_two_ranks_one_killed_the_others_log_and_ring_are_untouched(tmp_path):
    """Two processes with RANK_ID / RANK_SIZE set as msrun sets them, one folder."""
    out = tmp_path / "out"
    marker = tmp_path / "rank0-at-30"
    config = {"interval": 10, "output_type": ["json_file"], "json_log_path": str(out / "train_metric.json")}
    rank0 = spawn(
        {"config": config, "steps": 200, "graph": True, "report": str(tmp_path / "r0.json"),
         "at": {"30": [["touch", str(marker)], ["sleep", 600]]}},
        tmp_path, env={"RANK_ID": "0", "RANK_SIZE": "2", "DEVICE_ID": "0"},
    )  # fmt: skip
    try:
        wait_until(marker.exists, "rank 0 at step 30", rank0, timeout=180)
        rank0_log = out / "train_metric_rank_0.json"
        (rank0_ring,) = out.glob("train_metric.rank_0.*.flight")
        wait_until(
            lambda: ring_format.parse_header(rank0_ring.read_bytes()).written_step == 30, "rank 0's line 30", rank0
        )
        rank0_bytes, rank0_lines = rank0_ring.read_bytes(), rank0_log.read_bytes()
        rank1 = spawn(
            {"config": config, "steps": 200, "graph": True, "report": str(tmp_path / "r1.json"),
             "at": {"57": [["die", "SIGKILL"]]}},
            tmp_path, env={"RANK_ID": "1", "RANK_SIZE": "2", "DEVICE_ID": "1"},
        )  # fmt: skip
        finish(rank1)
        assert rank1.returncode == -signal.SIGKILL
        _cli_report(out)
        _check_recovered_log(out / "train_metric_rank_1.json", 10, 57)
        assert rank0_ring.read_bytes() == rank0_bytes, "rank 0's live ring was written by someone else"
        assert rank0_log.read_bytes() == rank0_lines
        assert not any(line.get("recovered") for line in json_lines(rank0_log))
        assert [far.step for far in finished_steps_of(config["json_log_path"], 1).values()] == [57]
        assert [far.step for far in finished_steps_of(config["json_log_path"], 0).values()] == [30]
    finally:
        rank0.kill()
        finish(rank0)


@pytest.mark.slow  # a real training in a folder it may not write
def test_a_ring_in_a_read_only_folder_is_one_warning_and_training_goes_on(tmp_path):
    folder = tmp_path / "read-only"
    folder.mkdir()
    folder.chmod(0o555)
    try:
        spec = {
            "config": {"interval": 5, "output_type": ["stdout"], "json_log_path": str(folder / "train_metric.json")},
            "steps": 20,
            "report": str(tmp_path / "report.json"),
        }
        process = spawn(spec, tmp_path, preexec_fn=obey_file_permissions)
        _, err = finish(process)
        assert process.returncode == 0, err[-3000:]
        assert err.count("cannot keep a flight ring") == 1, err[-3000:]
        assert list(folder.iterdir()) == []
    finally:
        folder.chmod(0o755)


# --- a job's restarts, as the issue tells them --------------------------------------------------

STEPS, SAVE = 10, 10


@pytest.mark.slow  # three real attempts of a job, two SIGKILLed
def test_restarts_ten_lost_steps_and_the_recovered_records_reach_otlp_once_with_their_times():
    """Checkpoints every 10 steps; attempt 1 killed at 25, resumed from 20; attempt 2 killed
    at 35, resumed from 30; attempt 3 completes at 60. The heartbeat (every 5 s by default)
    lags the steps: the lost steps come from the rings."""
    with restart_worker.private_dir() as workdir, OtlpReceiver() as receiver:
        checkpoints, output = workdir / "ckpt", workdir / "output"
        checkpoints.mkdir()
        config = {
            "interval": 1,
            "output_type": ["json_file", "otlp"],
            "json_log_path": str(output / "train_metric.json"),
            "otlp": {"endpoint": receiver.grpc_endpoint, "protocol": "grpc", "export_interval": 0.2},
        }
        base = {
            "config": config, "epochs": 6, "steps": STEPS, "checkpoint_dir": str(checkpoints), "save_steps": SAVE,
            "clock": str(workdir / "clock.jsonl"),
        }  # fmt: skip
        for extra, resume_step in [({"kill_at": 25}, None), ({"kill_at": 35, "initial_epoch": 2}, 20),
                                   ({"initial_epoch": 3}, 30)]:  # fmt: skip
            spec = {**base, **extra}
            if resume_step is not None:
                spec["resume"] = str(restart_worker.latest_checkpoint(checkpoints))
                assert spec["resume"].endswith(f"-{resume_step // STEPS}_{STEPS}.ckpt")
            with restart_worker.reaped(restart_worker.spawn(spec, workdir)) as process:
                _, err = process.communicate(timeout=300)
                assert process.returncode == (-signal.SIGKILL if "kill_at" in extra else 0), err[-4000:]

        lines = json_lines(output / "train_metric.json")
        assert [line["step"] for line in lines] == list(range(1, 26)) + list(range(21, 36)) + list(range(31, 61))
        assert [line["job"]["attempt"] for line in lines] == [1] * 25 + [2] * 15 + [3] * 30
        report = _cli_report(output)["job"]
        assert [row["last_step"] for row in report["attempts"]] == [25, 35, 60]
        assert [row["lost_steps"] for row in report["attempts"]] == [5, 5, 0]
        assert report["totals"]["lost_steps"] == 10
        ledger = json.loads((output / "train_metric.job.rank_0.ledger").read_text())
        assert [a["last_step"] for a in ledger["attempts"]] == [25, 35, 60]  # the next attempts wrote them down

        recovered = [
            (line["job"]["attempt"], line["step"], line["time_stamp"]) for line in lines if line.get("recovered")
        ]
        assert recovered, "the test needs records the outputs had not written when the attempts died"

        def recovered_spans() -> list:
            return [s for s in receiver.spans(semconv.SPAN_STEP) if s.attributes.get(semconv.ATTR_RECOVERED)]

        receiver.wait_for(lambda rx: len(recovered_spans()) >= len(recovered), timeout=30)
        spans = recovered_spans()
        # Each recovered record once, sent by the next attempt, with the step's own end time.
        sent = sorted(
            (s.attributes[job_names.ATTR_ATTEMPT], s.attributes[semconv.ATTR_STEP], s.resource[job_names.ATTR_ATTEMPT])
            for s in spans
        )
        assert sent == sorted((attempt, step, attempt + 1) for attempt, step, _ in recovered)
        ends = {
            (s.attributes[job_names.ATTR_ATTEMPT], s.attributes[semconv.ATTR_STEP]): s.end_time_unix_nano for s in spans
        }
        for attempt, step, stamp in recovered:
            assert ends[(attempt, step)] / 1e9 == pytest.approx(stamp, abs=2e-6)
        # Each in the trace of its original step: the job step's trace and root, as every rank
        # of that attempt derived them (telemetry/step_ids.py).
        for span in spans:
            key = job_trace_key(ledger["job_id"], span.attributes[job_names.ATTR_ATTEMPT])
            window = span.attributes[semconv.ATTR_STEP] - span.attributes[semconv.ATTR_STEPS_IN_WINDOW]
            assert (int(span.trace_id, 16), int(span.parent_span_id, 16)) == job_step_ids(key, window)
        # No ring is left: each was recovered and removed, the last run's once it wrote all.
        assert list(output.glob("*.flight")) == []


@pytest.mark.slow  # a real 2-rank msrun job, one rank SIGKILLed
@pytest.mark.integration
@pytest.mark.msrun_job
def test_under_msrun_a_killed_ranks_tail_goes_to_its_own_log_only():
    """Rank 1 kills itself after step 23; msrun ends the job (rank 0 dies with it, however
    msrun ends it). Each rank's log, after `report`, holds its own lines only: every rank's
    tail went to its own log, once, and the killed rank's last step is exact."""
    with restart_worker.private_dir() as workdir:
        config = {
            "interval": 5, "output_type": ["json_file"], "json_log_path": "./output/train_metric.json",
            "report_ranks": "all",
        }  # fmt: skip
        spec = {"config": config, "epochs": 1, "steps": 60, "kill_rank": 1, "kill_at": 23}
        command = [
            str(BIN / "msrun"), "--worker_num=2", "--local_worker_num=2", f"--master_port={free_port()}",
            "--join=True", f"--log_dir={workdir / 'msrun_log'}",
            str(REPO / "tests" / "support" / "msrun_restart_worker.py"), json.dumps(spec),
        ]  # fmt: skip
        job = subprocess.run(command, cwd=workdir, env=child_env(), capture_output=True, text=True, timeout=600)
        assert job.returncode != 0
        output = workdir / "output"
        report = _cli_report(output)
        for rank in (0, 1):
            lines = json_lines(output / f"train_metric_rank_{rank}.json")
            assert {line["rank"] for line in lines} == {rank}
            steps = [line["step"] for line in lines]
            assert steps == sorted(set(steps)), f"rank {rank}: a step twice or out of order: {steps}"
            assert steps[0] == 1 and all(s % 5 == 0 for s in steps[1:]), steps
        rank1 = [line["step"] for line in json_lines(output / "train_metric_rank_1.json")]
        assert rank1 == [1, 5, 10, 15, 20]
        (attempt,) = report["job"]["attempts"]
        (rank1_run,) = finished_steps_of(str(output / "train_metric.json"), 1).values()
        assert rank1_run.step == 23 and not rank1_run.alive
        # Rank 0 cannot pass step 23 without rank 1's gradients: the job's last step is 23.
        assert attempt["last_step"] == 23
