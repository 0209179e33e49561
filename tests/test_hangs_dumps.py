"""Diagnosis pieces on real SDK pipelines: the heartbeat gauges, stack dumps on SIGUSR1 and
on demand (bounded), and the first non-finite value of a run."""

from __future__ import annotations

import json
import math
import os
import signal
import threading
import time
import types

import numpy as np
import pytest
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from otel_mindformers.hangs import Heartbeat, StackDumper, dump_stacks, stacks
from otel_mindformers.job.identity import Identity
from otel_mindformers.nonfinite.first_nonfinite import FirstNonFinite
from otel_mindformers.outputs import diagnosis_file as records
from otel_mindformers.telemetry.observables import RunObservables
from tests.support.in_memory import Capture
from tests.support.metrics import counter_values
from tests.support.waiting import wait_until

IDENTITY = Identity(rank=5, world_size=8, host_name="node-b")


pytestmark = pytest.mark.slow  # real training runs


def gauge_points(reader):
    points = {}
    data = reader.get_metrics_data()  # None: nothing was observed
    for resource_metrics in data.resource_metrics if data else []:
        for scope_metrics in resource_metrics.scope_metrics:
            for metric in scope_metrics.metrics:
                for point in metric.data.data_points:
                    points[metric.name] = (point.value, dict(point.attributes))
    return points


def test_heartbeat_reads_the_progress_at_each_collection():
    reader = InMemoryMetricReader()
    progress = types.SimpleNamespace(step=0, last_step_end=time.perf_counter())
    observables = RunObservables(MeterProvider(metric_readers=[reader]).get_meter("t"))
    Heartbeat.start(observables, progress, {"training.rank": 5})
    progress.step, progress.last_step_end = 41, time.perf_counter()
    finished_at = time.time()
    points = gauge_points(reader)
    assert points["mindformers.progress.step"] == (41, {"training.rank": 5})
    stamp, attributes = points["mindformers.progress.last_step_time"]
    assert attributes == {"training.rank": 5} and abs(stamp - finished_at) < 1.0
    progress.step = 42
    assert gauge_points(reader)["mindformers.progress.step"][0] == 42
    observables.close()  # the run ended: its heartbeat is no longer observed
    assert "mindformers.progress.step" not in gauge_points(reader)


class Pipelines(Capture):
    """The shared in-memory providers, plus a meter for instruments made outside a run."""

    def __init__(self):
        super().__init__()
        self.metrics = self.reader
        self.meter = self.meter_provider.get_meter("t")


@pytest.fixture
def dumper(tmp_path):
    pipelines = Pipelines()
    progress = types.SimpleNamespace(step=7, last_step_end=time.perf_counter(), phase="checkpoint.save")
    started = StackDumper.start(
        str(tmp_path / "train_metric.json"), IDENTITY, pipelines.logger_provider.get_logger("t"), progress
    )
    run_span = pipelines.tracer_provider.get_tracer("t").start_span("mindformers.train")
    started.attach_run_span(run_span)
    yield types.SimpleNamespace(
        dumper=started, pipelines=pipelines, run_span=run_span, path=tmp_path / "diagnosis_rank_5.jsonl"
    )
    started.stop()


def test_sigusr1_dumps_from_the_signal_thread_while_the_main_thread_waits(dumper):
    assert signal.getsignal(signal.SIGUSR1) is not signal.SIG_DFL
    # The main thread waits in os.read until the dump is on disk: the signal thread takes it.
    read_end, write_end = os.pipe()
    threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGUSR1)).start()
    waiter = threading.Thread(target=lambda: (wait_for_dump(dumper.path), os.write(write_end, b"x")), daemon=True)
    waiter.start()
    os.read(read_end, 1)  # returns only once the dump was written
    os.close(read_end), os.close(write_end)
    (record,) = list(records.read(dumper.path))
    assert (record["reason"], record["rank"], record["step"], record["phase"]) == ("SIGUSR1", 5, 7, "checkpoint.save")
    main = record["threads"][0]
    assert main["name"] == "MainThread" and main["training"]
    assert main["frames"][-1]["function"] == "test_sigusr1_dumps_from_the_signal_thread_while_the_main_thread_waits"
    dumper.run_span.end()
    (span,) = dumper.pipelines.spans.get_finished_spans()
    (event,) = span.events
    assert event.name == "mindformers.stacks" and event.attributes["training.stacks.reason"] == "SIGUSR1"
    assert "test_sigusr1_dumps_from_the_signal_thread" in event.attributes["training.stacks.text"]


def wait_for_dump(path, timeout=30.0):
    deadline = time.monotonic() + timeout
    while not (path.exists() and path.read_text().endswith("\n")) and time.monotonic() < deadline:
        time.sleep(0.02)


def test_stop_restores_the_previous_sigusr1_handler_and_chains_a_users(tmp_path):
    assert signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL
    logger = LoggerProvider().get_logger("t")
    progress = types.SimpleNamespace(step=0, last_step_end=time.perf_counter())
    first = StackDumper.start(str(tmp_path / "m.json"), IDENTITY, logger, progress)
    assert signal.getsignal(signal.SIGUSR1) is not signal.SIG_DFL
    first.stop()
    assert signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL
    assert signal.set_wakeup_fd(-1) == -1  # the wakeup fd was handed back too

    called = threading.Event()

    def users_handler(signum, frame):
        called.set()

    previous = signal.signal(signal.SIGUSR1, users_handler)
    try:
        second = StackDumper.start(str(tmp_path / "m.json"), IDENTITY, logger, progress)
        # Ours is installed in front of the user's, which still runs.
        assert signal.getsignal(signal.SIGUSR1) is not users_handler
        os.kill(os.getpid(), signal.SIGUSR1)
        assert called.wait(10)
        wait_for_dump(second.path)
        assert json.loads(second.path.read_text().splitlines()[-1])["reason"] == "SIGUSR1"
        second.stop()
        assert signal.getsignal(signal.SIGUSR1) is users_handler
    finally:
        signal.signal(signal.SIGUSR1, previous)


def test_dump_stacks_on_demand_records_through_the_running_dumper(dumper):
    text = dump_stacks("before checkpoint")
    assert "test_dump_stacks_on_demand_records_through_the_running_dumper" in text
    (record,) = list(records.read(dumper.path))
    assert record["reason"] == "before checkpoint" and record["threads"][0]["training"]
    (log,) = dumper.pipelines.log_records()
    assert log.event_name == "mindformers.stacks" and log.attributes["training.rank"] == 5
    assert log.attributes["training.stacks.threads"][0] == "MainThread"


def test_dump_stacks_without_a_run_only_returns_the_text(tmp_path):
    assert "test_dump_stacks_without_a_run_only_returns_the_text" in dump_stacks("debugging")
    assert list(tmp_path.iterdir()) == []


def _recurse(depth, started, done):
    if depth:
        return _recurse(depth - 1, started, done)
    started.set()
    done.wait(30)


def test_a_dump_is_bounded_in_threads_frames_and_text():
    done = threading.Event()
    threads = []
    for _ in range(stacks.MAX_THREADS + 8):
        started = threading.Event()
        thread = threading.Thread(target=_recurse, args=(200, started, done), daemon=True)
        thread.start()
        started.wait(10)
        threads.append(thread)
    try:
        snapshot = stacks.capture(threading.get_ident())
    finally:
        done.set()
    assert len(snapshot.threads) <= stacks.MAX_THREADS and snapshot.omitted_threads >= 8
    assert sum(len(t.frames) for t in snapshot.threads) <= stacks.MAX_FRAMES_TOTAL
    deep = [t for t in snapshot.threads if t.omitted_frames]
    assert deep and all(len(t.frames) <= stacks.MAX_FRAMES_PER_THREAD for t in deep)
    assert deep[0].frames[-1].function == "wait"  # the innermost frames are the ones kept
    assert len(snapshot.text(10_000)) <= 10_000 + 40


def test_first_nonfinite_is_recorded_once_with_rank_step_and_value(tmp_path):
    pipelines = Pipelines()
    first = FirstNonFinite(
        pipelines.meter, pipelines.logger_provider.get_logger("t"), IDENTITY, str(tmp_path / "train_metric.json")
    )
    span = pipelines.tracer_provider.get_tracer("t").start_span("mindformers.train")
    assert first.check(11, {"loss": 2.0, "grad_norm": np.float32(1.5), "overflow": False}, span) == []
    # A custom scalar's NaN (a user's 0/0 accuracy) is the user's metric, not the run's first bad step.
    assert first.check(11, {"loss": 2.0, "grad_norm": 1.5, "accuracy": math.nan, "val": math.inf}, span) == []
    assert first.check(12, {"loss": np.float32("nan"), "grad_norm": math.inf}, span) == ["loss", "grad_norm"]
    assert first.check(13, {"loss": math.nan}, span) == []  # once per run
    span.end()
    counts = counter_values(pipelines.metrics, "mindformers.train.nonfinite.first")
    assert counts == {(("training.metric", "loss"), ("training.rank", 5), ("training.step", 12)): 1}
    (event,) = pipelines.spans.get_finished_spans()[0].events
    assert event.name == "mindformers.nonfinite.first" and event.attributes["training.step"] == 12
    (log,) = pipelines.log_records()
    assert log.body == "rank 5: first non-finite value of the run at step 12: loss = nan, grad_norm = inf"
    (line,) = (tmp_path / "diagnosis_rank_5.jsonl").read_text().splitlines()
    assert {k: v for k, v in json.loads(line).items() if k != "time_stamp"} == {
        "kind": "nonfinite",
        "rank": 5,
        "step": 12,
        "metrics": ["loss", "grad_norm"],
        "values": {"loss": "nan", "grad_norm": "inf"},
    }


def test_the_first_bad_rank_across_a_job_is_named_by_both_reports(tmp_path, capsys):
    from otel_mindformers.cli import main
    from otel_mindformers.hangs.offline.hang_report import build_hang_report
    from otel_mindformers.nonfinite.offline.first_bad_rank import report_findings

    pipelines = Pipelines()
    for rank, step, values in (
        (0, 13, {"grad_norm": math.nan}),
        (517, 12, {"loss": math.nan}),
        (3, 12, {"grad_norm": math.inf}),
    ):
        identity = Identity(rank=rank, world_size=1024, host_name="n")
        FirstNonFinite(
            pipelines.meter, pipelines.logger_provider.get_logger("t"), identity, str(tmp_path / "m.json")
        ).check(step, values)
    lines = (  # a custom scalar's NaN at step 1 is not the job's first non-finite value
        {"time_stamp": 0.5, "step": 1, "epoch": 1, "rank": 0, "loss": 3.0, "accuracy": None, "nonfinite": ["accuracy"]},
        {"time_stamp": 1.0, "step": 14, "epoch": 1, "rank": 0, "loss": None, "nonfinite": ["loss"]},
    )
    (tmp_path / "train_metric_rank_0.json").write_text("".join(json.dumps(line) + "\n" for line in lines))
    report = build_hang_report([tmp_path])
    assert report.first_nonfinite.to_json() == {
        "step": 12,
        "ranks": [{"rank": 3, "metrics": ["grad_norm"]}, {"rank": 517, "metrics": ["loss"]}],
    }
    summary = types.SimpleNamespace(rank=0, files=[str(tmp_path / "train_metric_rank_0.json")], nonfinite_steps=[14])
    assert report_findings([summary]) == ["first non-finite value at step 12: rank 3 (grad_norm); rank 517 (loss)"]
    assert main(["report", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "first non-finite value at step 12: rank 3 (grad_norm); rank 517 (loss)" in out
    assert "rank 0: non-finite values at steps 14\n" in out


def test_a_dump_records_when_the_last_step_finished_not_when_it_was_taken(tmp_path):
    """The hang report orders ranks by `last_step_time`: it is the progress's last step end
    (here 30 s before the dump), on the wall clock."""
    progress = types.SimpleNamespace(step=4, last_step_end=time.perf_counter() - 30.0, phase="step")
    path = tmp_path / "diagnosis_rank_0.jsonl"
    before = time.time()
    StackDumper(Identity(rank=0, world_size=2, host_name="n"), LoggerProvider().get_logger("t"), progress, path).dump(
        "stall"
    )
    (record,) = records.read(path)
    assert record["time_stamp"] >= before
    assert record["time_stamp"] - record["last_step_time"] == pytest.approx(30.0, abs=1.0)
    assert record["step"] == 4


def _waiting_in(ident, function):
    """Whether thread `ident` is blocked in an Event wait called from `function`."""
    import sys

    frame = sys._current_frames().get(ident)
    if frame is None or frame.f_code.co_name != "wait":  # threading.Condition.wait, blocked
        return False
    while frame is not None and frame.f_code.co_name != function:
        frame = frame.f_back
    return frame is not None


def test_the_verdict_is_the_training_threads_when_another_thread_moves(tmp_path):
    """The training thread waits in the same place at both dumps while a thread of the
    user's moves on between them: stuck, not slow."""
    progress = types.SimpleNamespace(step=3, last_step_end=time.perf_counter(), phase="step")
    built, release = threading.Event(), threading.Event()
    move_on = threading.Event()
    made = {}

    def training_loop():
        made["dumper"] = StackDumper(IDENTITY, LoggerProvider().get_logger("t"), progress, tmp_path / "d.jsonl")
        built.set()
        release.wait(60)

    def first_batch():
        move_on.wait(60)
        second_batch()

    def second_batch():
        release.wait(60)

    training, loader = threading.Thread(target=training_loop), threading.Thread(target=first_batch, name="loader")
    training.start(), loader.start()
    try:
        built.wait(30)
        wait_until(lambda: _waiting_in(training.ident, "training_loop"), "the training thread waiting")
        wait_until(lambda: _waiting_in(loader.ident, "first_batch"), "the loader in its first batch")
        first = made["dumper"].dump("stall", idle_seconds=1.0)
        move_on.set()
        wait_until(lambda: _waiting_in(loader.ident, "second_batch"), "the loader in its second batch")
        second = made["dumper"].dump("stall again", idle_seconds=2.0, earlier=first)
    finally:
        release.set()
        training.join(30), loader.join(30)
    moved = {t["name"]: t["moved"] for t in second.record["threads"]}
    assert moved["loader"] is True and moved[training.name] is False
    assert second.verdict == "stuck"
