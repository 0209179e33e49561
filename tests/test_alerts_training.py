"""Alerts end to end in real MindSpore training: NaN → alert + early stop, a loss spike that
fires once and resolves, a stalled step named by the watchdog, and broken receivers that
training does not notice."""

import json
import logging
import threading
import time

import mindspore as ms
import pytest
from mindspore.train import Callback
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import InMemoryLogRecordExporter, SimpleLogRecordProcessor
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from otel_mindformers.runtime.callback import MonitorCallback
from tests.support.blocking_data import train_blocking, use_cpu
from tests.support.metrics import counter_values
from tests.support.training import Faults, train
from tests.support.waiting import wait_until
from tests.support.webhook_receiver import WebhookReceiver, closed_port_url

pytestmark = pytest.mark.slow  # real training runs


class Run:
    """A MonitorCallback on in-memory SDK pipelines, writing JSON lines under `workdir`."""

    def __init__(self, workdir, alert_section, **extra_config):
        self.json_path = workdir / "train_metric.json"
        self.spans = InMemorySpanExporter()
        self.metrics = InMemoryMetricReader()
        tracer_provider = TracerProvider()
        tracer_provider.add_span_processor(SimpleSpanProcessor(self.spans))
        self.logs = InMemoryLogRecordExporter()
        logger_provider = LoggerProvider()
        logger_provider.add_log_record_processor(SimpleLogRecordProcessor(self.logs))
        self.callback = MonitorCallback(
            {
                "interval": 1,
                "grad_monitor": False,  # the tiny scalar network returns no gradient norm
                "output_type": ["json_file"],
                "json_log_path": str(self.json_path),
                "shutdown_timeout": 5.0,
                "alert_config": {"enable_alert": True, **alert_section},
                **extra_config,
            },
            tracer_provider=tracer_provider,
            meter_provider=MeterProvider(metric_readers=[self.metrics]),
            logger_provider=logger_provider,
        )

    def lines(self):
        return [json.loads(line) for line in self.json_path.read_text().splitlines()]

    def log_records(self):
        return [data.log_record for data in self.logs.get_finished_logs()]

    def counter(self, name):
        return counter_values(self.metrics, name)

    def span(self, name, step=None):
        for span in self.spans.get_finished_spans():
            if span.name == name and (step is None or span.attributes.get("training.step") == step):
                return span
        raise AssertionError(f"no span {name} at step {step}")


def notices(receiver):
    return [(r.body["rule"], r.body["status"], r.body["step"]) for r in receiver.requests]


def test_nan_loss_alerts_at_its_step_and_stops_training(workdir):
    with WebhookReceiver() as receiver:
        run = Run(workdir, {"notifiers": [{"type": "webhook", "url": receiver.url()}]})
        train([run.callback], steps=20, faults=Faults(nan_at={7}))
        assert notices(receiver) == [("nonfinite", "firing", 7), ("early_stop", "firing", 7)]
    lines = run.lines()
    assert [line["step"] for line in lines] == list(range(1, 8))
    assert lines[-1]["loss"] is None and lines[-1]["nonfinite"] == ["loss"]
    assert run.callback.stop_reason == "non-finite loss (nan) at step 7"
    assert run.span("mindformers.train").attributes["training.stop_reason"] == run.callback.stop_reason
    step_span = run.span("mindformers.train.step", 7)
    assert [e.name for e in step_span.events] == ["mindformers.alert"]
    assert run.counter("mindformers.train.nonfinite") == {(("training.metric", "loss"), ("training.rank", 0)): 1}
    assert run.counter("mindformers.alerts") == {
        (("training.alert.rule", "nonfinite"), ("training.alert.severity", "critical"), ("training.rank", 0)): 1
    }


def test_stop_after_configured_number_of_anomalous_steps(workdir):
    run = Run(workdir, {"stop_on_nonfinite": False, "stop_after_anomalous_steps": 3})
    train([run.callback], steps=80, faults=Faults(nan_at={7}))
    # The NaN poisons the weights: steps 7, 8 and 9 are all non-finite. The rules run off the
    # training thread, in batches at most BATCH_INTERVAL apart, so their stop is honoured at
    # the first step boundary after the batch holding step 9 (a few ms-steps later here).
    lines = run.lines()
    assert 10 <= lines[-1]["step"] < 80
    assert run.callback.stop_reason == "3 consecutive anomalous sampled steps, the last at step 9"
    nonfinite_lines = sum(1 for line in lines if line["loss"] is None)
    assert nonfinite_lines == lines[-1]["step"] - 6
    assert run.counter("mindformers.train.nonfinite") == {
        (("training.metric", "loss"), ("training.rank", 0)): nonfinite_lines
    }


def test_a_rules_stop_is_honoured_at_the_next_step_end_not_the_next_sampled_one(workdir):
    # Interval 5000: after step 1 the next sampled step would be past the end of the run.
    run = Run(workdir, {"stop_on_nonfinite": False, "stop_after_anomalous_steps": 1}, interval=5000)
    train([run.callback], steps=1500, faults=Faults(nan_at={1}))
    assert run.callback.stop_reason == "1 consecutive anomalous sampled steps, the last at step 1"
    last = run.lines()[-1]["step"]  # the run's last step, sampled at train end
    assert 1 < last < 1500, "the worker's stop request wakes the next step end"


def test_loss_spike_fires_once_then_resolves(workdir):
    with WebhookReceiver() as receiver:
        run = Run(
            workdir,
            {
                "alert_interval": 1,
                "loss_spike": {"warmup": 5},
                "step_time_regression": {"enable": False},
                "notifiers": [{"type": "webhook", "url": receiver.url()}],
            },
        )
        # Labels x6 at step 15: loss ~3x the rule's limit. A small learning rate keeps the
        # spike's own update from knocking later steps over the limit too.
        train([run.callback], steps=30, faults=Faults(spike_at={15: 6.0}), lr=0.003)
        spike = [n for n in notices(receiver) if n[0] == "loss_spike"]
    assert spike[0] == ("loss_spike", "firing", 15)
    assert [status for _, status, _ in spike] == ["firing", "resolved"]
    assert spike[1][2] > 15
    assert len(run.lines()) == 30


class SlowSteps(Callback):
    """Sleeps inside the given steps (after the monitor's step begin): seconds by step."""

    def __init__(self, seconds_at: dict[int, float]) -> None:
        self.seconds_at = seconds_at

    def on_train_step_begin(self, run_context):
        time.sleep(self.seconds_at.get(run_context.original_args().cur_step_num, 0.0))


def test_step_time_regression_ignores_millisecond_jitter_and_fires_on_a_slow_step(workdir):
    """Graph-mode steps of about a millisecond: one 25 ms longer is jitter (it fired at twice
    the median), one 400 ms longer is a regression."""
    with WebhookReceiver() as receiver:
        run = Run(workdir, {"notifiers": [{"type": "webhook", "url": receiver.url()}]})
        train([run.callback, SlowSteps({30: 0.025, 45: 0.4})], steps=60, mode=ms.GRAPH_MODE)
        fired = [
            step for rule, status, step in notices(receiver) if (rule, status) == ("step_time_regression", "firing")
        ]
    step_times = {line["step"]: line["train_per_step_time"] for line in run.lines()}
    assert step_times[30] >= 25.0 > 2 * sorted(step_times.values())[30], "step 30 was more than twice the median"
    assert 30 not in fired and 45 in fired, fired


def test_stalled_data_wait_is_dumped_named_stuck_and_resolved(workdir):
    """Step 6's data blocks in a distinctively named function until the second stack dump
    (at twice `stall_timeout`) is taken; then training goes on to its end."""
    second_dump = threading.Event()

    class SecondDump(logging.Handler):
        def emit(self, record):
            if "(stall_second_threshold, step 5)" in record.getMessage():  # the blocked step's, not an earlier one's
                second_dump.set()

    handler = SecondDump()
    logging.getLogger("otel_mindformers").addHandler(handler)
    try:
        with WebhookReceiver() as receiver:
            run = Run(
                workdir,
                {
                    "stall_timeout": 1.0,
                    "step_time_regression": {"enable": False},
                    "notifiers": [{"type": "webhook", "url": receiver.url()}],
                },
            )
            use_cpu()
            train_blocking([run.callback], steps=10, block_at_step=6, release=lambda: second_dump.wait(60))
            stall = [r.body for r in receiver.requests if r.body["rule"] == "stall"]
    finally:
        logging.getLogger("otel_mindformers").removeHandler(handler)
    assert len(run.lines()) == 10

    # A loaded host may stall an earlier step past the timeout too: its notices come before,
    # firing then resolved; the blocked step's are the test's.
    earlier = [b for b in stall if b["step"] < 5]
    assert [b["status"] for b in earlier] == ["firing", "resolved"] * (len(earlier) // 2)
    stall = stall[len(earlier) :]
    # The notice names the rank, the last step, the phase and where the data loader waits.
    assert [(b["status"], b["step"]) for b in stall][0] == ("firing", 5)
    assert [b["status"] for b in stall] == ["firing", "resolved"] and stall[1]["step"] >= 6
    assert "rank 0" in stall[0]["message"] and "stalled after step 5" in stall[0]["message"]
    assert "phase data_wait" in stall[0]["message"]
    assert "wait_for_the_test_to_release_batch" in stall[0]["message"]

    # Two dumps in the rank's diagnosis file: the second says the stacks did not move.
    dumps = [json.loads(line) for line in (workdir / "diagnosis_rank_0.jsonl").read_text().splitlines()]
    dumps = [d for d in dumps if d["step"] == 5]  # an earlier stall's on a loaded host: not this test's
    assert [(d["reason"], d["step"], d["verdict"]) for d in dumps] == [
        ("stall", 5, None),
        ("stall_second_threshold", 5, "stuck"),
    ]
    for dump in dumps:
        assert dump["phase"] == "data_wait" and dump["idle_seconds"] >= 1.0
        functions = [f["function"] for t in dump["threads"] for f in t["frames"]]
        assert "wait_for_the_test_to_release_batch" in functions
        assert dump["threads"][0]["name"] == "MainThread" and dump["threads"][0]["training"]
    # Ours move (their workers wait in loops), and so may the test's webhook receiver (its
    # serve_forever polls every 0.5 s): the training process's own threads must not.
    moved = [
        t
        for t in dumps[1]["threads"]
        if t["moved"]
        and not t["name"].startswith("otel-mindformers")
        and "serve_forever" not in [f["function"] for f in t["frames"]]
    ]
    assert not moved, [(t["name"], [f["function"] for f in t["frames"]][-4:]) for t in moved]

    # The same stacks as OTel log records.
    logs = [r for r in run.log_records() if r.event_name == "mindformers.stacks" and r.attributes["training.step"] == 5]
    assert [r.attributes["training.stacks.reason"] for r in logs] == ["stall", "stall_second_threshold"]
    assert logs[1].attributes["training.stacks.verdict"] == "stuck"
    assert "wait_for_the_test_to_release_batch" in logs[0].body
    assert (
        logs[0].attributes["training.phase"] == "data_wait"
        and "MainThread" in logs[0].attributes["training.stacks.threads"]
    )


def test_a_stall_that_ends_with_the_last_step_is_resolved(workdir):
    """The last step's data arrives once the stall notice is out; training ends at once, and
    the watchdog's last check on stop still sends the resolved notice."""
    with WebhookReceiver() as receiver:
        run = Run(
            workdir,
            {"stall_timeout": 0.5, "notifiers": [{"type": "webhook", "url": receiver.url()}]},
        )
        use_cpu()
        train_blocking([run.callback], steps=8, block_at_step=8, release=lambda: _stall_notice(receiver, 7))
        stall = [(r.body["status"], r.body["step"]) for r in receiver.requests if r.body["rule"] == "stall"]
    # An earlier step stalled past 0.5 s by a loaded host is notified and resolved before.
    assert [notice for notice in stall if notice[1] >= 7] == [("firing", 7), ("resolved", 8)], stall


def _stall_notice(receiver, step: int) -> None:
    """Until the stall notice after `step` is out."""
    wait_until(
        lambda: any(r.body["rule"] == "stall" and r.body["step"] == step for r in receiver.requests),
        f"the stall notice after step {step}",
        timeout=60,
    )


CUSTOM_MONITOR = """
from otel_mindformers import BaseMonitor


class LossWatcher(BaseMonitor):
    def on_train_step_end(self, run_context):
        cb_params = run_context.original_args()
        if cb_params.cur_step_num == 4:
            loss = float(cb_params.train_loss.asnumpy().reshape(-1)[0])
            self.raise_alert("custom_loss_check", f"loss {loss:.3f} seen by a custom monitor", value=loss)
"""


def test_custom_monitor_raises_through_the_engine(workdir):
    (workdir / "loss_watcher.py").write_text(CUSTOM_MONITOR)
    with WebhookReceiver() as receiver:
        run = Run(
            workdir,
            {"notifiers": [{"type": "webhook", "url": receiver.url()}]},
            custom_monitor_callback="loss_watcher.LossWatcher",
        )
        train([run.callback], steps=8)
        custom = [r.body for r in receiver.requests if r.body["rule"] == "custom_loss_check"]
    assert [(b["status"], b["step"], b["severity"]) for b in custom] == [("firing", 4, "warning")]
    assert custom[0]["message"].startswith("loss ") and custom[0]["value"] > 0
    assert (
        run.counter("mindformers.alerts")[
            (("training.alert.rule", "custom_loss_check"), ("training.alert.severity", "warning"), ("training.rank", 0))
        ]
        == 1
    )


@pytest.mark.parametrize("failure", ["down", "slow", "500"])
def test_broken_receiver_does_not_disturb_training(workdir, failure):
    with WebhookReceiver(status=500 if failure == "500" else 200, delay=3.0 if failure == "slow" else 0.0) as receiver:
        url = closed_port_url() if failure == "down" else receiver.url()
        run = Run(
            workdir,
            {
                "loss_threshold": 0.0,  # every step is anomalous
                "alert_interval": 5,
                "notify_timeout": 0.2,
                "notify_retries": 1,
                "notifiers": [{"type": "webhook", "url": url}],
            },
        )
        train([run.callback], steps=20)
    assert [line["step"] for line in run.lines()] == list(range(1, 21))
    assert run.callback.stop_reason is None
    assert (
        run.counter("mindformers.alerts")[
            (("training.alert.rule", "loss_threshold"), ("training.alert.severity", "warning"), ("training.rank", 0))
        ]
        == 20
    )
    outcomes = {
        dict(attributes)["training.alert.outcome"]: value
        for attributes, value in run.counter("mindformers.alert.notifications").items()
    }
    assert "delivered" not in outcomes and outcomes.get("failed", 0) >= 1
    # Step times with broken receivers are compared in benchmarks/bench_alerts.py.
