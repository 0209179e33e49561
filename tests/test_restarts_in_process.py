"""The job's step after a resume, the ledger's robustness and the no-progress alert, with
real MindSpore trainings in this process (each `Model.train` is one attempt)."""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import mindspore as ms
import numpy as np
import pytest
from mindspore import nn
from mindspore.dataset import GeneratorDataset
from mindspore.train import Model
from mindspore.train.callback import Callback
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from otel_mindformers import MonitorCallback
from otel_mindformers.restarts.ledger_file import ledger_path
from otel_mindformers.restarts.offline.attempts_report import job_report, render_job
from tests.support import training
from tests.support.cli import cli
from tests.support.webhook_receiver import WebhookReceiver

pytestmark = [pytest.mark.slow, pytest.mark.mindspore_api]

STEPS = 10  # per epoch


class CrashAt(Callback):
    """Raise from the training loop at a job step (after MonitorCallback's hook)."""

    def __init__(self, step: int, initial_epoch: int = 0) -> None:
        self.step, self.offset = step, initial_epoch * STEPS

    def on_train_step_end(self, run_context):
        step = self.offset + run_context.original_args().cur_step_num
        if step == self.step:
            raise RuntimeError(f"injected crash at step {step}")


def config(workdir: Path, **overrides) -> dict:
    return {
        "interval": 5,
        "output_type": ["json_file"],
        "json_log_path": str(workdir / "output" / "train_metric.json"),
        "restarts": {"heartbeat_interval": 0.1},
        **overrides,
    }


def train(
    callbacks,
    *,
    epochs: int,
    initial_epoch: int = 0,
    lr=0.01,
    sink: bool = False,
    sink_size=STEPS,
    save=None,
    load=None,
) -> None:
    """`save`: a checkpoint of the train network (the optimizer's step with it) written after
    training; `load`: one loaded before, as a resume does."""
    ms.set_context(mode=ms.PYNATIVE_MODE)
    ms.set_device("CPU")
    model = training.build_model(lr=lr)
    if load is not None:
        ms.load_checkpoint(str(load), model.train_network)
    dataset = training.build_dataset(STEPS)
    if sink:
        model.train(
            epochs,
            dataset,
            callbacks=callbacks,
            dataset_sink_mode=True,
            sink_size=sink_size,
            initial_epoch=initial_epoch,
        )
    else:
        model.train(epochs, dataset, callbacks=callbacks, dataset_sink_mode=False, initial_epoch=initial_epoch)
    if save is not None:
        ms.save_checkpoint(model.train_network, str(save))


def lines(workdir: Path) -> list[dict]:
    return [json.loads(line) for line in (workdir / "output" / "train_metric.json").read_text().splitlines()]


def ledger(workdir: Path) -> dict:
    return json.loads(ledger_path(str(workdir / "output" / "train_metric.json"), 0).read_text())


# --- the job's goodput -------------------------------------------------------------------------
class PacedSource:
    """Batch k (k >= 2) is made 0.1 s after step k-1 ended: every step waits for its data,
    however long the machine takes for a step (a loader that only sleeps runs ahead of slow
    steps, and its wait hides in the prefetch)."""

    def __init__(self, steps: int) -> None:
        rng = np.random.default_rng(0)
        self.x = rng.standard_normal((steps * training.BATCH, training.FEATURES)).astype(np.float32)
        self.y = (self.x.sum(axis=1, keepdims=True) * 0.5).astype(np.float32)
        self.ended = [threading.Event() for _ in range(steps + 1)]  # set at the end of step k

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int):
        step = index // training.BATCH + 1
        if step > 1 and index % training.BATCH == 0:
            self.ended[step - 1].wait(timeout=60)  # never a hang: a run that stopped early
            time.sleep(0.1)
        return self.x[index], self.y[index]


class StepEnded(Callback):
    def __init__(self, source: PacedSource) -> None:
        self.source = source

    def on_train_step_end(self, run_context):
        self.source.ended[run_context.original_args().cur_step_num].set()


def test_the_wait_for_data_is_the_jobs_badput_as_it_is_the_runs(workdir):
    # Every batch after the first comes 100 ms after the step before it ended: much of the
    # run waits for data.
    ms.set_context(mode=ms.PYNATIVE_MODE)
    ms.set_device("CPU")
    source = PacedSource(20)
    dataset = GeneratorDataset(source, column_names=["x", "y"], shuffle=False).batch(training.BATCH)
    training.build_model().train(
        1, dataset, callbacks=[MonitorCallback(config(workdir)), StepEnded(source)], dataset_sink_mode=False
    )
    run_time = lines(workdir)[-1]["time"]
    assert run_time["data_wait"] > 0.5
    totals = job_report([workdir / "output"])["totals"]
    assert totals["seconds"]["data_wait"] == pytest.approx(run_time["data_wait"])
    # The job's productive time is its steps' compute, as the run's own breakdown says: the
    # job counts an attempt's whole first step as compile, the run only what it took beyond a
    # steady step (docs/time.md), so the two add up to the same. A first step no longer than
    # the steady ones (a loaded host's steady steps) leaves the run no compile time at all.
    job = totals["seconds"]
    run_compile = run_time.get("compile", 0.0)
    assert job["productive"] + job["compile"] == pytest.approx(run_time["productive"] + run_compile, abs=0.05)
    assert totals["goodput"] < 1 - totals["seconds"]["data_wait"] / totals["wall_seconds"]


def test_an_evaluation_between_epochs_is_the_jobs_badput_as_it_is_the_runs(workdir):
    # Model.fit evaluates for 0.4 s after each epoch of 5 steps: the first evaluation lies
    # between steps 5 and 6, the second after the last step (10, sampled at train end: its
    # line holds both; the job counts that one after the steps, in `other`).
    ms.set_context(mode=ms.PYNATIVE_MODE)
    ms.set_device("CPU")
    net = nn.SequentialCell(nn.Dense(training.FEATURES, 16), nn.ReLU(), nn.Dense(16, 1))
    optimizer = nn.Momentum(net.trainable_params(), learning_rate=0.01, momentum=0.9)
    Model(net, loss_fn=nn.MSELoss(), optimizer=optimizer, metrics={"mae"}).fit(
        2,
        training.build_dataset(5),
        valid_dataset=training.build_dataset(2, training.Faults(sleep_at={1: 0.4})),
        callbacks=[MonitorCallback(config(workdir, interval=4))],
        dataset_sink_mode=False,
        valid_dataset_sink_mode=False,
    )
    run_time = {line["step"]: line["time"] for line in lines(workdir)}
    between = run_time[8]["evaluation"]  # the first evaluation only
    assert between >= 0.4 and run_time[10]["evaluation"] >= between + 0.4
    totals = job_report([workdir / "output"])["totals"]
    job = totals["seconds"]
    # The run's own seconds (its phase accounting, not timed again).
    assert job["evaluation"] == pytest.approx(between, abs=1e-6)
    assert job["user_phases"] == 0.0
    assert job["other"] >= run_time[10]["evaluation"] - between
    assert sum(job.values()) == pytest.approx(totals["wall_seconds"])
    # The job's productive time is its steps' compute, as the run's own breakdown says (see
    # the data-wait test above for compile): neither holds an evaluation.
    run_compile = run_time[10].get("compile", 0.0)
    assert job["productive"] + job["compile"] == pytest.approx(run_time[10]["productive"] + run_compile, abs=0.05)


# --- the job's step ----------------------------------------------------------------------------
def test_a_resume_with_initial_epoch_carries_the_jobs_step_and_appends(workdir):
    schedule = [0.001 * (i + 1) for i in range(4 * STEPS)]  # a per-step learning rate
    checkpoint = workdir / "resume.ckpt"
    train([MonitorCallback(config(workdir))], epochs=2, lr=schedule, save=checkpoint)
    train([MonitorCallback(config(workdir))], epochs=4, initial_epoch=2, lr=schedule, load=checkpoint)
    got = lines(workdir)
    # Sampling follows the job's step: the first step of the attempt, then multiples of 5.
    assert [line["step"] for line in got] == [1, 5, 10, 15, 20, 21, 25, 30, 35, 40]
    assert [line["epoch"] for line in got[5:]] == [3, 3, 3, 4, 4]
    # The learning rate of job step s is the schedule's s-th: the checkpoint restored the
    # optimizer's step, whose index the rate follows (the job's step agrees with it).
    assert {line["step"]: round(line["learning_rate"], 6) for line in got[5:]} == {
        s: round(schedule[s - 1], 6) for s in (21, 25, 30, 35, 40)
    }
    # The resumed run wrote on after the first one ("a resume appends", outputs/runs.py).
    assert not list((workdir / "output").glob("train_metric.*.json"))
    entries = ledger(workdir)["attempts"]
    assert [(a["attempt"], a["resume_step"], a["last_step"], a["outcome"]) for a in entries] == [
        (1, 0, 20, "completed"),
        (2, 20, 40, "completed"),
    ]


def test_sink_mode_resume_carries_the_jobs_step(workdir):
    train([MonitorCallback(config(workdir))], epochs=3, initial_epoch=1, sink=True)
    assert [line["step"] for line in lines(workdir)] == [11, 15, 20, 25, 30]


def test_cpu_sink_fallback_counts_whole_epochs_in_the_resume_and_the_eta(workdir):
    """On a CPU, sink mode falls back to feeding whole epochs (10 steps) step by step while
    MindSpore's `batch_num` says the sink size (4): the job's step after `initial_epoch` and
    the ETA count the steps that ran (with the sink size: steps 5..24, ETA 0 from step 10)."""
    train([MonitorCallback(config(workdir))], epochs=3, initial_epoch=1, sink=True, sink_size=4)
    written = lines(workdir)
    assert [line["step"] for line in written] == [11, 15, 20, 25, 30]
    assert [line["eta"] > 0 for line in written[1:]] == [True, True, True, False]


def test_a_fresh_run_without_a_job_id_starts_a_new_job(workdir):
    train([MonitorCallback(config(workdir))], epochs=1)
    first = ledger(workdir)["job_id"]
    train([MonitorCallback(config(workdir))], epochs=1)  # from step 0 again: a new run
    second = ledger(workdir)
    assert second["job_id"] != first and [a["attempt"] for a in second["attempts"]] == [1]
    kept = ledger_path(str(workdir / "output" / "train_metric.json"), 0).with_name(
        "train_metric.job.rank_0.ledger.job1"
    )
    assert json.loads(kept.read_text())["job_id"] == first


# --- the ledger ----------------------------------------------------------------------------------
@pytest.mark.parametrize("damage", ["garbage", "truncated", "not_a_ledger"])
def test_a_corrupt_ledger_gives_one_warning_and_a_fresh_ledger(workdir, caplog, damage):
    train([MonitorCallback(config(workdir, job_id="j"))], epochs=1)
    path = ledger_path(str(workdir / "output" / "train_metric.json"), 0)
    good = path.read_bytes()
    path.write_bytes(
        {"garbage": b"\x00\xff{{{", "truncated": good[: len(good) // 2], "not_a_ledger": b"[1, 2]"}[damage]
    )
    with caplog.at_level(logging.WARNING, logger="otel_mindformers"):
        train([MonitorCallback(config(workdir, job_id="j"))], epochs=1)
    warnings = [r.getMessage() for r in caplog.records if "ledger" in r.getMessage()]
    assert len(warnings) == 1 and "corrupt or truncated" in warnings[0], warnings
    fresh = ledger(workdir)
    assert fresh["job_id"] == "j" and [a["attempt"] for a in fresh["attempts"]] == [1]
    assert fresh["attempts"][0]["outcome"] == "completed"
    assert path.with_name(path.name + ".corrupt").read_bytes() != good


# --- no progress across restarts -------------------------------------------------------------------
def _attempts_crashing_at(workdir: Path, steps: list[int], threshold: int, receiver: WebhookReceiver) -> list[str]:
    for step in steps:
        callback = MonitorCallback(
            config(
                workdir,
                job_id="stuck-job",
                restarts={"heartbeat_interval": 0.1, "no_progress_attempts": threshold},
                alert_config={
                    "enable_alert": True,
                    "notify_run_end": True,
                    "notifiers": [{"type": "webhook", "url": receiver.url()}],
                },
            )
        )
        with pytest.raises(RuntimeError, match="injected crash"):
            train([callback, CrashAt(step)], epochs=2)
    return [r.body["rule"] for r in receiver.requests]


def test_three_attempts_crashing_at_the_same_step_fire_the_no_progress_alert(workdir):
    with WebhookReceiver() as receiver:
        rules = _attempts_crashing_at(workdir, [7, 7], 3, receiver)
        assert "no_progress" not in rules  # two attempts stuck: not yet
        rules = _attempts_crashing_at(workdir, [7], 3, receiver)
        (notice,) = [r.body for r in receiver.wait_for(1) if r.body["rule"] == "no_progress"]
    assert notice["severity"] == "critical" and notice["value"] == 3
    assert "3 attempts in a row ended without passing step 7" in notice["message"]
    # The end-of-run notice says where the job stands across its attempts.
    run_ends = [r.body["message"] for r in receiver.requests if r.body["rule"] == "run_end"]
    assert len(run_ends) == 3 and "job stuck-job: attempt 3, job goodput" in run_ends[-1]
    entries = ledger(workdir)["attempts"]
    assert [(a["outcome"], a["last_step"]) for a in entries] == [("crashed", 7)] * 3
    assert entries[0]["reason"] == "RuntimeError: injected crash at step 7"
    # No checkpoint: the last attempt's 7 steps are lost unless something saved them.
    text = render_job(job_report([workdir / "output"]))
    rows = {line.split()[0]: line for line in text.splitlines() if line.split()[:1] and line.split()[0].isdigit()}
    assert "crashed" in rows["3"] and "0 (7 at risk)" in rows["3"]
    assert "at risk" not in rows["1"] and "at risk" not in rows["2"]


def test_two_attempts_that_make_progress_do_not_fire_it(workdir):
    with WebhookReceiver() as receiver:
        rules = _attempts_crashing_at(workdir, [7, 12], 2, receiver)
    assert "no_progress" not in rules
    assert [a["last_step"] for a in ledger(workdir)["attempts"]] == [7, 12]


# --- cost on the training thread -------------------------------------------------------------------
class CheckpointEvery(Callback):
    """A `checkpoint.save` phase every `every` steps, as a user's own save would be marked."""

    def __init__(self, every: int) -> None:
        self.every = every

    def on_train_step_end(self, run_context):
        from otel_mindformers import phase

        if run_context.original_args().cur_step_num % self.every == 0:
            with phase("checkpoint.save"):
                pass


def test_the_ledger_is_written_on_events_not_per_step(workdir, monkeypatch):
    import threading

    from otel_mindformers.restarts import attempt_tracker as attempts_module

    writes: list[int] = []
    original = attempts_module.write_ledger

    def counted(path, data):
        writes.append(threading.get_ident())
        return original(path, data)

    monkeypatch.setattr(attempts_module, "write_ledger", counted)
    from otel_mindformers.restarts import ledger_file as ledger_module

    monkeypatch.setattr(ledger_module, "write_ledger", counted)
    training_thread = threading.get_ident()
    # A heartbeat interval longer than the run: every write is an event's.
    train(
        [MonitorCallback(config(workdir, restarts={"heartbeat_interval": 600.0})), CheckpointEvery(10)],
        epochs=4,
    )
    on_training_thread = writes.count(training_thread)
    assert on_training_thread == 2  # the attempt's begin and its end; none per step
    # Off the thread: its first write, the run span's ids, the first step, and the 4 saves
    # (wakes that arrive together may share a write).
    assert 3 <= len(writes) - on_training_thread <= 7
    assert ledger(workdir)["attempts"][0]["durable_step"] == 40


# --- an exit on purpose is a stop, not a crash -----------------------------------------------------
class SignalAt(Callback):
    """Send this process `signum` at step 4, as a scheduler does. (Not SIGINT: MindSpore's own
    handler turns Ctrl-C during training into a SIGTERM that ends the process, whatever
    handler Python has; the next attempt writes it down as killed.)"""

    def __init__(self, signum: int) -> None:
        self.signum = signum

    def on_train_step_end(self, run_context):
        if run_context.original_args().cur_step_num == 4:
            os.kill(os.getpid(), self.signum)


def _exit_143(signum, frame):  # the usual preemption handler, after saving a checkpoint
    sys.exit(128 + signum)


def _exit_0(signum, frame):
    sys.exit(0)


def _exit_1(signum, frame):
    sys.exit(1)


@pytest.mark.parametrize(
    ("signum", "handler", "raised", "outcome", "reason"),
    [
        (signal.SIGTERM, _exit_143, SystemExit, "stopped", "the process exited on SIGTERM (sys.exit(143))"),
        (signal.SIGTERM, _exit_0, SystemExit, "stopped", "the process exited (sys.exit(0))"),
        (signal.SIGTERM, _exit_1, SystemExit, "crashed", "SystemExit: 1"),
    ],
    ids=["handler-exits-143", "handler-exits-0", "handler-exits-1"],
)
def test_a_signal_that_ends_the_run_is_written_down_as_what_it_was(workdir, signum, handler, raised, outcome, reason):
    spans = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    previous = signal.signal(signum, handler)
    try:
        with WebhookReceiver() as receiver:
            callback = MonitorCallback(
                config(
                    workdir,
                    interval=1,
                    alert_config={
                        "enable_alert": True,
                        "notify_run_end": True,
                        "notifiers": [{"type": "webhook", "url": receiver.url()}],
                    },
                ),
                tracer_provider=provider,
            )
            with pytest.raises(raised):
                train([callback, SignalAt(signum)], epochs=1)
            (notice,) = [r.body for r in receiver.wait_for(1) if r.body["rule"] == "run_end"]
    finally:
        signal.signal(signum, previous)
    (entry,) = ledger(workdir)["attempts"]
    assert entry["outcome"] == outcome and entry["reason"].startswith(reason), entry
    assert entry["last_step"] >= 4
    assert notice["severity"] == ("critical" if outcome == "crashed" else "warning"), notice
    assert reason in notice["message"]
    (run_span,) = [span for span in spans.get_finished_spans() if span.name == "mindformers.train"]
    assert run_span.status.status_code is StatusCode.ERROR, "the run did not complete"
    assert run_span.attributes.get("training.stop_reason", "").startswith(reason) == (outcome == "stopped")


# --- a resume after a kill mid-line -------------------------------------------------------------
def test_a_resume_after_a_kill_mid_line_appends_after_the_last_whole_line(workdir, caplog):
    """The killed attempt's last line is cut in half (a kill inside a large write, a crash);
    the resumed attempt appends to the same file. Its first line was glued onto the half
    line, and `report` / `plot` / `replay` stopped at that line (malformed, not the last)
    for the whole log. The half line is cut off with one warning; every line is whole."""
    log = workdir / "output" / "train_metric.json"
    train([MonitorCallback(config(workdir, interval=1))], epochs=1)
    data = log.read_bytes()
    last = data.rstrip(b"\n").rfind(b"\n") + 1
    log.write_bytes(data[: last + 60])  # what the kill left: half of step 10's line
    with caplog.at_level(logging.WARNING, logger="otel_mindformers"):
        train([MonitorCallback(config(workdir, interval=1))], epochs=2, initial_epoch=1)
    assert [line["step"] for line in lines(workdir)] == [*range(1, 10), *range(11, 21)]
    said = [r.getMessage() for r in caplog.records if "ended in half a line" in r.getMessage()]
    assert len(said) == 1 and str(log) in said[0] and "(60 bytes," in said[0], said
    done = cli("report", str(log), "--format", "json")
    assert done.returncode == 0 and "error" not in done.stderr, done.stderr
    (series,) = json.loads(done.stdout)["series"]
    assert (series["records"], series["first_step"], series["last_step"]) == (19, 1, 20)
    assert [(gap["after"], gap["before"]) for gap in series["gaps"]] == [(9, 11)]


HOLD_LOCK = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)
fcntl.flock(fd, fcntl.LOCK_EX)
print("locked", flush=True)
time.sleep(float(sys.argv[2]))
"""


def test_a_ledger_lock_held_by_a_frozen_process_costs_the_run_its_ledger_not_its_training(workdir, caplog):
    """A previous attempt frozen while writing its ledger (SIGSTOP, a suspended job, a hung
    NFS mount) holds the lock: the run waits a second, warns once and trains without the
    ledger. The holder lets go after 120 s, so a run that waited for it would still end,
    with a ledger entry: that, not the time, is what fails here."""
    path = ledger_path(str(workdir / "output" / "train_metric.json"), 0)
    path.parent.mkdir(parents=True)
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_LOCK, str(path) + ".lock", "120"], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        with caplog.at_level(logging.WARNING, logger="otel_mindformers"):
            train([MonitorCallback(config(workdir))], epochs=1)
        assert holder.poll() is None, "the lock holder let go before the run ended"
    finally:
        holder.kill()
        holder.wait()
    warnings = [r.getMessage() for r in caplog.records if "ledger" in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert "held by another process" in warnings[0] and str(path) + ".lock" in warnings[0]
    assert not path.exists()
    assert [line["step"] for line in lines(workdir)] == [1, 5, 10]


def test_a_fixed_job_id_run_again_from_step_0_says_it_joins_the_job(workdir, caplog):
    """The documented rule (the same id: the same job) holds, and the run says what it means."""
    train([MonitorCallback(config(workdir, job_id="llama-pretrain"))], epochs=1)
    with caplog.at_level(logging.WARNING, logger="otel_mindformers"):
        train([MonitorCallback(config(workdir, job_id="llama-pretrain"))], epochs=1)
    joined = [r.getMessage() for r in caplog.records if "joining job" in r.getMessage()]
    assert joined == [
        "otel_mindformers: joining job llama-pretrain as attempt 2 from step 0 (all 10 earlier steps count as "
        "lost); give this run another job_id if it is a new experiment"
    ]
    assert [a["attempt"] for a in ledger(workdir)["attempts"]] == [1, 2]


def test_a_ledger_path_that_is_a_folder_is_one_warning(workdir, caplog):
    ledger_path(str(workdir / "output" / "train_metric.json"), 0).mkdir(parents=True)
    with caplog.at_level(logging.WARNING, logger="otel_mindformers"):
        train([MonitorCallback(config(workdir))], epochs=1)
    about = [r.getMessage() for r in caplog.records if "ledger" in r.getMessage()]
    assert len(about) == 1 and "Is a directory" in about[0], about
    assert [line["step"] for line in lines(workdir)] == [1, 5, 10]


def test_a_crashed_multi_rank_attempt_gives_the_reason_of_the_rank_that_crashed(workdir, monkeypatch):
    """Two ranks of one attempt (one process after the other, as msrun's would be): rank 0
    ends, rank 1 raises. The job's attempt is crashed, with rank 1's reason, named."""
    monkeypatch.setenv("RANK_SIZE", "2")
    for rank, callbacks in ((0, []), (1, [CrashAt(5)])):
        monkeypatch.setenv("RANK_ID", str(rank))
        try:
            train([MonitorCallback(config(workdir, job_id="two-ranks")), *callbacks], epochs=1)
        except RuntimeError:
            assert rank == 1
    report = job_report([workdir / "output"])
    (attempt,) = report["attempts"]
    assert attempt["ranks"] == [0, 1]
    assert attempt["outcome"] == "crashed"
    assert attempt["reason"] == "on rank 1: RuntimeError: injected crash at step 5"
    assert "crashed (on rank 1: RuntimeError: injected crash at step 5)" in render_job(report)


TIME_FIELDS = ("process_start", "train_begin", "last_step_time", "last_heartbeat", "durable_time", "end",
               "first_step_begin", "first_step_end")  # fmt: skip


def test_a_clock_set_back_between_attempts_gives_no_negative_time_and_keeps_goodput(workdir, caplog):
    """Attempt 2 runs on a node whose clock is an hour behind attempt 1's: as if attempt 1's
    recorded times were an hour later. Nothing negative, goodput kept, and it is said."""
    train([MonitorCallback(config(workdir, job_id="skewed"))], epochs=1)
    data = ledger(workdir)
    for field in TIME_FIELDS:
        if data["attempts"][0].get(field) is not None:
            data["attempts"][0][field] += 3600.0
    path = ledger_path(str(workdir / "output" / "train_metric.json"), 0)
    path.write_text(json.dumps(data))
    with caplog.at_level(logging.WARNING, logger="otel_mindformers"):
        train([MonitorCallback(config(workdir, job_id="skewed"))], epochs=1)
    assert any("the clock was set back" in r.getMessage() for r in caplog.records)
    assert "goodput" in lines(workdir)[-1]["job"]
    report = job_report([workdir / "output"])
    totals = report["totals"]
    assert totals["wall_seconds"] > 0 and totals["downtime_seconds"] >= 0 and totals["goodput"] is not None
    assert totals["clock_set_back_seconds"] > 3000
    assert all((row["downtime"] or {}).get("total", 0) >= 0 for row in report["attempts"])
    text = render_job(report)
    assert "clock set back" in text and not re.search(r"(?<![\w.])-\d", text), text
