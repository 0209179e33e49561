"""Two `Model.train` runs in one process on one borrowed MeterProvider (passed in, as the
instrumentor does, or the global one that user code or `opentelemetry-instrument` set):
every observable instrument reports the run going on, and a run that ended reports nothing
(telemetry/observables.py). The SDK caches the meter, so each run reaches the same one."""

from __future__ import annotations

import json
import signal
import time

import pytest
from mindspore.train.callback import Callback
from opentelemetry.sdk.trace import TracerProvider

from otel_mindformers import MonitorCallback
from otel_mindformers.names import diagnosis, job, semconv
from otel_mindformers.names.spec import Kind
from tests.support.in_memory import Capture
from tests.support.instrumented import child_env, instrumented, run
from tests.support.metrics import observed
from tests.support.paths import PLAIN_TRAIN
from tests.support.training import train
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slow  # real training runs

HEARTBEAT = (diagnosis.PROGRESS_STEP.name, diagnosis.PROGRESS_LAST_STEP_TIME.name)
JOB = (job.JOB_INFO.name, job.JOB_GOODPUT.name, job.JOB_ATTEMPT.name, job.JOB_NO_PROGRESS_ATTEMPTS.name)
DEVICES = tuple(spec.name for spec in semconv.DEVICE_METRICS if spec.kind is not Kind.COUNTER)
PER_RUN = HEARTBEAT + JOB + DEVICES  # every observable instrument a run registers


class SeeAt(Callback):
    """At `step` (after MonitorCallback's hook), one collection once the host readings are in."""

    def __init__(self, reader, step: int) -> None:
        self.reader, self.step = reader, step
        self.points: dict = {}

    def on_train_step_end(self, run_context):
        if run_context.original_args().cur_step_num != self.step:
            return

        def has_devices() -> bool:
            self.points = observed(self.reader.collect_now())
            return any(name in self.points for name in DEVICES)

        wait_until(has_devices, "the host readings")


def config(workdir, **overrides) -> dict:
    return {
        "interval": 2,
        "output_type": ["json_file"],
        "json_log_path": str(workdir / "output" / "train_metric.json"),
        "job_id": "borrowed-job",
        "device_monitor": True,
        "device_config": {"sources": ["host"], "poll_interval": 0.1},
        **overrides,
    }


def per_run(points: dict) -> dict:
    return {name: values for name, values in points.items() if name in PER_RUN}


def ranks(points: dict) -> set[int]:
    return {attributes[semconv.ATTR_RANK] for values in per_run(points).values() for _, attributes in values}


def test_a_second_run_reports_only_itself_while_it_runs_and_at_its_end(workdir, monkeypatch):
    capture = Capture()  # one provider for both runs: borrowed, flushed but never shut down
    monkeypatch.setenv("RANK", "3")  # run 1 is rank 3 of 4, so any point of it stands out
    first = SeeAt(capture.reader, 3)
    train([capture.callback(config(workdir)), first], steps=5)
    first_end = observed(capture.reader.batches[-1])  # the train-end flush
    assert set(per_run(first_end)) >= set(HEARTBEAT + JOB) and any(name in first_end for name in DEVICES)
    assert first_end[diagnosis.PROGRESS_STEP.name] == [(5, {semconv.ATTR_RANK: 3})]
    assert per_run(observed(capture.reader.collect_now())) == {}  # ended: nothing

    monkeypatch.delenv("RANK")
    second = SeeAt(capture.reader, 7)
    begun = time.time()
    train([capture.callback(config(workdir)), second], steps=12)
    second_end = observed(capture.reader.batches[-1])
    for points, step in ((second.points, 7), (second_end, 12)):
        # Rank 0's first attempt has timed no steps by step 7 (its heartbeat writes every 5 s):
        # no job goodput yet, rather than 0.0.
        expected = set(HEARTBEAT + JOB) - ({job.JOB_GOODPUT.name} if step == 7 else set())
        assert set(per_run(points)) >= expected and any(name in points for name in DEVICES)
        assert ranks(points) == {0}, f"a point of run 1 at step {step}: {per_run(points)}"
        assert points[diagnosis.PROGRESS_STEP.name] == [(step, {semconv.ATTR_RANK: 0})]
        ((stamp, _),) = points[diagnosis.PROGRESS_LAST_STEP_TIME.name]
        assert begun < stamp <= time.time()
        ((one, info),) = points[job.JOB_INFO.name]
        assert one == 1 and info[semconv.ATTR_WORLD_SIZE] == 1 and info[semconv.ATTR_JOB_ID] == "borrowed-job"
    assert per_run(observed(capture.reader.collect_now())) == {}


def test_the_job_gauges_follow_the_second_attempt(workdir):
    capture = Capture()
    train([capture.callback(config(workdir, device_monitor=False))], steps=5)
    train([capture.callback(config(workdir, device_monitor=False))], steps=12)
    end = observed(capture.reader.batches[-1])
    assert end[job.JOB_ATTEMPT.name] == [(2, {semconv.ATTR_RANK: 0})]
    assert end[diagnosis.PROGRESS_STEP.name] == [(12, {semconv.ATTR_RANK: 0})]
    runs = capture.finished(semconv.SPAN_RUN)
    assert [span.attributes[job.ATTR_ATTEMPT] for span in runs] == [1, 2]
    goodputs = [span.attributes["training.job.goodput"] for span in runs]
    assert goodputs[0] != goodputs[1]
    assert end[job.JOB_GOODPUT.name] == [(goodputs[1], {semconv.ATTR_RANK: 0})]
    assert end[job.JOB_NO_PROGRESS_ATTEMPTS.name] == [(0, {semconv.ATTR_RANK: 0})]


class CrashAt(Callback):
    """Raise from the training loop at `step` (after MonitorCallback's hook)."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_step_end(self, run_context):
        if run_context.original_args().cur_step_num == self.step:
            raise RuntimeError(f"injected crash at step {self.step}")


def test_a_run_that_crashed_reports_nothing_and_the_next_reports_itself(workdir):
    capture = Capture()
    with pytest.raises(RuntimeError, match="injected crash"):
        train([capture.callback(config(workdir)), SeeAt(capture.reader, 2), CrashAt(3)], steps=8)
    assert observed(capture.reader.batches[-1])[diagnosis.PROGRESS_STEP.name] == [(3, {semconv.ATTR_RANK: 0})]
    assert per_run(observed(capture.reader.collect_now())) == {}
    train([capture.callback(config(workdir))], steps=6)
    end = observed(capture.reader.batches[-1])
    assert end[diagnosis.PROGRESS_STEP.name] == [(6, {semconv.ATTR_RANK: 0})]
    assert end[job.JOB_ATTEMPT.name] == [(2, {semconv.ATTR_RANK: 0})]


class RefusingTracerProvider:
    """A tracer provider (the user's own, passed in) whose tracer refuses every span: the
    run fails to start after its device readings were registered."""

    def get_tracer(self, *_args, **_kwargs):
        return self

    def start_span(self, name, *_args, **_kwargs):
        raise RuntimeError(f"this tracer refuses {name}")


def test_a_failed_start_leaves_no_source_behind(workdir):
    capture = Capture()
    refused = MonitorCallback(
        config(workdir), tracer_provider=RefusingTracerProvider(), meter_provider=capture.meter_provider
    )
    with pytest.raises(RuntimeError, match="refuses mindformers.train"):
        train([refused], steps=4)
    assert capture.reader.batches, "the failed start flushed the borrowed provider"
    assert per_run(observed(capture.reader.collect_now())) == {}
    train([capture.callback(config(workdir))], steps=4)
    assert observed(capture.reader.batches[-1])[diagnosis.PROGRESS_STEP.name] == [(4, {semconv.ATTR_RANK: 0})]


class RunSpanEndRaises:
    """A tracer provider (the user's own) whose run span raises as it ends: what closes
    before telemetry at the run's end fails."""

    def __init__(self) -> None:
        self._tracer = TracerProvider().get_tracer("test")

    def get_tracer(self, *_args, **_kwargs):
        return self

    def start_span(self, name, *args, **kwargs):
        span = self._tracer.start_span(name, *args, **kwargs)
        if name == semconv.SPAN_RUN:

            def refuse(*_args, **_kwargs):
                raise RuntimeError("this run span refuses to end")

            span.end = refuse
        return span


def test_a_run_whose_span_fails_to_end_still_closes_everything_else(workdir, caplog):
    """Each closer runs whatever the one before it did: no observable source, no SIGUSR1
    handler, no training error from a broken tracer."""
    before = signal.getsignal(signal.SIGUSR1)
    capture = Capture()
    broken = MonitorCallback(
        config(workdir, device_monitor=False), tracer_provider=RunSpanEndRaises(), meter_provider=capture.meter_provider
    )
    train([broken], steps=3)  # the broken span is warned about, training ends normally
    assert per_run(observed(capture.reader.collect_now())) == {}
    assert signal.getsignal(signal.SIGUSR1) is before  # the stack dumper stopped after it
    assert "this run span refuses to end" in caplog.text


# Under opentelemetry-instrument: the SDK's global providers, one plain script training twice.
TWICE = f"""
import runpy, sys, time
from opentelemetry import metrics
for steps in (5, 12):
    print("BEGIN", time.time(), flush=True)
    sys.argv = [{str(PLAIN_TRAIN)!r}, "--steps", str(steps)]
    runpy.run_path(sys.argv[0], run_name="__main__")
print("END", time.time(), flush=True)
metrics.get_meter_provider().force_flush()  # one collection after both runs ended
"""


@pytest.mark.integration
def test_zero_code_second_run_exports_its_own_heartbeat(workdir, otlp_receiver):
    (workdir / "monitor.yaml").write_text(
        json.dumps({"monitor_config": {"interval": 2, "output_type": ["otlp"], "job_id": "zero-code-job"}})
    )
    (workdir / "twice.py").write_text(TWICE)
    result = run(
        instrumented("python", "twice.py"),
        child_env(
            otlp_receiver,
            OTEL_PYTHON_MINDFORMERS_CONFIG=str(workdir / "monitor.yaml"),
            OTEL_METRIC_EXPORT_INTERVAL="100",
        ),
        workdir,
    )
    second_begun = int(float(result.stdout.split("BEGIN")[2].split()[0]) * 1e9)
    ended = int(float(result.stdout.split("END")[1].split()[0]) * 1e9)
    steps = sorted(otlp_receiver.points(diagnosis.PROGRESS_STEP.name), key=lambda p: p.time_unix_nano)
    assert steps and steps[-1].value == 12
    # What was collected after run 2 began is run 2's: run 1's last step time is gone.
    times = otlp_receiver.points(diagnosis.PROGRESS_LAST_STEP_TIME.name)
    later = [p.value for p in times if p.time_unix_nano > second_begun]
    assert later and min(later) * 1e9 > second_begun, later
    # After both runs ended the SDK still exports (the step counters), but no run's gauges.
    after = {p.metric for p in otlp_receiver.points() if p.time_unix_nano > ended}
    assert after and not after & set(HEARTBEAT + JOB), after


class GoodputAt(Callback):
    """The job goodput gauge's points at step 1, and at `later` once the heartbeat has
    written a timeline with timed steps (the gauge reads the tracker's last write)."""

    def __init__(self, reader, later: int) -> None:
        self.reader, self.later, self.first, self.then = reader, later, None, None

    def on_train_step_end(self, run_context):
        step = run_context.original_args().cur_step_num
        if step == 1:
            self.first = observed(self.reader.collect_now())
        elif step == self.later:

            def measured() -> bool:
                self.then = observed(self.reader.collect_now()).get(job.JOB_GOODPUT.name)
                return bool(self.then)

            wait_until(measured, "a job goodput point", timeout=60)


def test_the_job_goodput_gauge_reports_nothing_until_it_was_measured(workdir):
    """Before the attempt has timed two steps it has no productive time to divide: the gauge
    says nothing rather than 0.0 (a dip to 0 on every dashboard, a min over ranks of 0)."""
    capture = Capture()
    seen = GoodputAt(capture.reader, 6)
    train([capture.callback(config(workdir, interval=1, restarts={"heartbeat_interval": 0.1})), seen], steps=8)
    assert job.JOB_GOODPUT.name not in seen.first
    assert job.JOB_ATTEMPT.name in seen.first  # the job's gauges are up, goodput among them
    ((value, _),) = seen.then
    assert 0 < value <= 1
