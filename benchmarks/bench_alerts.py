"""Alert engine costs: evaluate() time per sampled step, notification latency, and
step times of real training while a notification receiver is healthy, down, slow or failing.

    .venv/bin/python benchmarks/bench_alerts.py            # all three parts
    .venv/bin/python benchmarks/bench_alerts.py evaluate   # or one: evaluate | latency | training

The training part runs in a temporary directory and writes its JSON lines there.
"""

from __future__ import annotations

import json
import logging
import os
import statistics
import sys
import tempfile
import time
import types
from pathlib import Path

os.environ.setdefault("PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION", "python")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from opentelemetry.sdk._logs import LoggerProvider  # noqa: E402
from opentelemetry.sdk.metrics import MeterProvider  # noqa: E402
from opentelemetry.sdk.trace import TracerProvider  # noqa: E402

from otel_mindformers.alerts import AlertEngine  # noqa: E402
from otel_mindformers.config import load_monitor_config  # noqa: E402
from otel_mindformers.core.step_record import StepRecord
from otel_mindformers.job.identity import Identity
from otel_mindformers.telemetry.providers import build_telemetry  # noqa: E402
from tests.support.webhook_receiver import WebhookReceiver, closed_port_url  # noqa: E402

IDENTITY = Identity(rank=0, world_size=1, job_id="bench", host_name="bench")
PLATFORM_REPLIES = {
    "webhook": {"ok": True},
    "wecom": {"errcode": 0, "errmsg": "ok"},
    "dingtalk": {"errcode": 0, "errmsg": "ok"},
    "feishu": {"code": 0, "msg": "success"},
    "slack": b"ok",
}


def _engine(alert_section: dict) -> tuple[AlertEngine, object]:
    config = load_monitor_config(
        {"output_type": [], "alert_config": {"enable_alert": True, "stall_timeout": None, **alert_section}}
    )
    telemetry = build_telemetry(
        config.telemetry, IDENTITY, tracer_provider=TracerProvider(), meter_provider=MeterProvider(),
        logger_provider=LoggerProvider(),
    )  # fmt: skip
    progress = types.SimpleNamespace(step=0, last_step_end=time.perf_counter())
    return AlertEngine.start(
        config.alert_config,
        IDENTITY,
        telemetry,
        progress,
        job="bench",
        reports_training=True,
        json_log_path=config.json_log_path,
    ), telemetry


def _record(step: int, loss: float) -> StepRecord:
    return StepRecord(
        step=step, epoch=1, rank=0, time_stamp=time.time(),
        values={"loss": loss, "grad_norm": 1.0 + 0.01 * (step % 7), "overflow": False,
                "loss_scale": 1024.0, "train_per_step_time": 100.0 + step % 5},
    )  # fmt: skip


def _summary(samples_s: list[float], unit: float = 1e6, name: str = "us") -> str:
    ordered = sorted(samples_s)
    p99 = ordered[int(0.99 * (len(ordered) - 1))]
    return f"median {statistics.median(ordered) * unit:8.2f} {name}   p99 {p99 * unit:8.2f} {name}"


def bench_evaluate(calls: int = 20000) -> None:
    """Time of evaluate() per sampled step, every rule on, inside a real span."""
    print(f"evaluate() per sampled step, all rules, {calls} calls:")
    with WebhookReceiver() as receiver:
        cases = {
            "normal step": (50, lambda s: 2.0),
            "anomalous, rate-limited": (10**9, lambda s: 20.0),
            "anomalous, notifying": (1, lambda s: 20.0),
        }
        for label, (interval, loss) in cases.items():
            engine, telemetry = _engine(
                {"loss_threshold": 8.0, "alert_interval": interval,
                 "notifiers": [{"type": "webhook", "url": receiver.url()}]}
            )  # fmt: skip
            logging.getLogger("otel_mindformers.alerts.engine").disabled = True
            samples = []
            for step in range(1, calls + 1):
                record = _record(step, loss(step))
                span = telemetry.tracer.start_span("mindformers.train.step")
                started = time.perf_counter()
                engine.evaluate(record, span)
                samples.append(time.perf_counter() - started)
                span.end()
            engine.shutdown(0.0)
            print(f"  {label:26s} {_summary(samples[100:])}")


def bench_latency(rounds: int = 50) -> None:
    """Anomalous step → the platform's endpoint receives the notification."""
    print(f"notification latency, anomalous step -> receiver, {rounds} alerts per platform:")
    for kind, reply in PLATFORM_REPLIES.items():
        with WebhookReceiver(reply=reply) as receiver:
            notifier = {"type": kind, "url": receiver.url()}
            if kind in ("dingtalk", "feishu"):
                notifier["secret"] = "SECbench"
            engine, _ = _engine(
                {"loss_threshold": 8.0, "alert_interval": 1, "notifiers": [notifier],
                 "loss_spike": {"enable": False}}
            )  # fmt: skip
            logging.getLogger("otel_mindformers.alerts.engine").disabled = True
            latencies = []
            for step in range(1, rounds + 1):
                seen = len(receiver.requests)
                started = time.monotonic()
                engine.evaluate(_record(2 * step, 20.0), None)  # fires
                arrived = receiver.wait_for(seen + 1)[seen].arrived
                latencies.append(arrived - started)
                engine.evaluate(_record(2 * step + 1, 2.0), None)  # resolves
                receiver.wait_for(seen + 2)
            engine.shutdown(5.0)
            print(f"  {kind:9s} {_summary(latencies, 1e3, 'ms')}")


def _timed_evaluate(monitor, samples: list[float]):
    """A callback placed after `monitor` that times its engine's evaluate() (on the pipeline's
    worker thread)."""
    from mindspore.train import Callback

    class EvaluateTimer(Callback):
        def on_train_begin(self, run_context):
            engine = monitor._run.alerts if monitor._run is not None else None
            if engine is None:
                return
            evaluate = engine.evaluate

            def timed(record, span):
                started = time.perf_counter()
                reason = evaluate(record, span)
                samples.append(time.perf_counter() - started)
                return reason

            engine.evaluate = timed

    return EvaluateTimer()


def bench_training(steps: int = 150, rounds: int = 3) -> None:
    """Per-step time of real MindSpore training (interval 1, every step anomalous), and the
    time inside evaluate() (the pipeline's worker thread) while the receiver is down, slow or failing.

    The cases run round-robin, `rounds` times, in a rotating order, so a load change on a
    shared machine spreads over all of them instead of landing on one.
    """
    from otel_mindformers.runtime.callback import MonitorCallback
    from tests.support.training import train

    logging.disable(logging.WARNING)
    print(f"real training, {rounds} x {steps} steps per case, interval 1, loss_threshold 0 (every step"
          " anomalous), alert_interval 10; per-step time from the JSON lines:")  # fmt: skip
    with WebhookReceiver() as healthy, WebhookReceiver(status=500) as failing, WebhookReceiver(delay=3.0) as slow:
        cases = {
            "alerts off": None,
            "alerts, no notifier": [],
            "healthy receiver": [{"type": "webhook", "url": healthy.url()}],
            "receiver down": [{"type": "webhook", "url": closed_port_url()}],
            "receiver slow (3 s)": [{"type": "webhook", "url": slow.url()}],
            "receiver answers 500": [{"type": "webhook", "url": failing.url()}],
        }
        labels = list(cases)
        samples: dict[str, list[float]] = {label: [] for label in labels}
        evaluations: dict[str, list[float]] = {label: [] for label in labels}
        with tempfile.TemporaryDirectory() as tmp:
            os.chdir(tmp)
            for round_index in range(rounds):
                for label in labels[round_index:] + labels[:round_index]:
                    notifiers = cases[label]
                    path = Path(tmp) / f"{round_index}_{label.replace(' ', '_')}.json"
                    alert_config = {
                        "enable_alert": notifiers is not None,
                        "loss_threshold": 0.0,
                        "alert_interval": 10,
                        "notify_timeout": 0.5,
                        "notifiers": notifiers or [],
                    }
                    callback = MonitorCallback(
                        {"interval": 1, "grad_monitor": False, "output_type": ["json_file"],
                         "json_log_path": str(path), "shutdown_timeout": 2.0, "alert_config": alert_config}
                    )  # fmt: skip
                    train([callback, _timed_evaluate(callback, evaluations[label])], steps=steps)
                    lines = path.read_text().splitlines()[5:]  # past graph building and warm-up
                    samples[label] += [json.loads(line)["train_per_step_time"] / 1e3 for line in lines]
        for label in labels:
            line = f"  {label:22s} step {_summary(samples[label], 1e3, 'ms')}"
            if evaluations[label]:
                line += f"   evaluate() median {statistics.median(evaluations[label]) * 1e6:6.1f} us"
                line += f" max {max(evaluations[label]) * 1e3:6.2f} ms"
            print(line)


if __name__ == "__main__":
    parts = {"evaluate": bench_evaluate, "latency": bench_latency, "training": bench_training}
    for name in sys.argv[1:] or parts:
        parts[name]()
