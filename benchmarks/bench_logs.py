"""What shipping Python logging (`monitor_config.logs`) costs the training thread.

    .venv/bin/python benchmarks/bench_logs.py [--steps 300] [--lines 20] [--rounds 3]

A real MindSpore training (tests/support/training.py, PyNative, CPU) whose callback logs
`--lines` WARNING lines per step through a script logger, monitored by MonitorCallback with
OTLP to a receiver in another process. Variants, alternated round by round, medians:
- `logs off`: the lines go to the script's own (file) handler only;
- `logs on, within the limit`: every line also becomes an OTel log record (rate limit above
  the run's total);
- `logs on, rate-limited`: the default limit (100 per logger per 60 s) drops most lines.
Reports the whole-run time and the time per logging call on the training thread.

    .venv/bin/python benchmarks/bench_logs.py --carry [--rates 1000,2000,3000] [--seconds 15] [--burst N]

What the OTLP log queue carries (docs/logs.md): the log bridge and the providers as a run
builds them (`otlp.logs_queue_size` unset), to a receiver in another process that decodes
with protobuf's C implementation, as fast as a collector. Per protocol: a burst of a queue's
worth of lines logged in a tight loop, and lines logged at each steady rate for `--seconds`;
for each, the lines the receiver counted and the drops the SDK's queue counted. No training
runs beside it: a training thread takes its own share of the interpreter.
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from mindspore.train import Callback  # noqa: E402

from benchmarks._receiver import ReceiverProcess  # noqa: E402
from otel_mindformers.runtime.callback import MonitorCallback
from tests.support.training import train  # noqa: E402


class Chatty(Callback):
    def __init__(self, lines: int) -> None:
        self.log = logging.getLogger("bench_script")
        self.lines = lines
        self.seconds = 0.0
        self.calls = 0

    def on_train_step_end(self, run_context):
        start = time.perf_counter()
        for i in range(self.lines):
            self.log.warning("loss line %d of step %d", i, run_context.original_args()["cur_step_num"])
        self.seconds += time.perf_counter() - start
        self.calls += self.lines


def one_run(variant: str, args, endpoint: str, folder: Path) -> tuple[float, float]:
    logs = {
        "logs off": {"enable": False},
        "logs on, within the limit": {"enable": True, "rate_limit_per_logger": args.steps * args.lines + 1},
        "logs on, rate-limited": {"enable": True},
    }[variant]
    chatty = Chatty(args.lines)
    monitor = MonitorCallback(
        {
            "interval": 10,
            "grad_monitor": False,
            "output_type": ["otlp"],
            "otlp": {"endpoint": endpoint, "insecure": True},
            "logs": logs,
        }
    )
    start = time.perf_counter()
    train([chatty, monitor], steps=args.steps)
    return time.perf_counter() - start, chatty.seconds / chatty.calls * 1e6


class _Clock:  # what the bridge reads of a run's step clock
    step = 0
    phase = "train"


def carried(protocol: str, receiver: ReceiverProcess, lines: int, rate: float) -> tuple[float, int, int]:
    """(seconds spent logging, lines received, drops counted) for `lines` lines at `rate` per
    second (0: a tight loop) through a fresh bridge and providers."""
    from otel_mindformers.config import LogsConfig, OtlpConfig, PrometheusConfig, TelemetryConfig
    from otel_mindformers.job.identity import Identity
    from otel_mindformers.telemetry.log_bridge import LogBridge, RunCorrelation
    from otel_mindformers.telemetry.providers import build_telemetry

    receiver.clear()
    endpoint = receiver.grpc_endpoint if protocol == "grpc" else receiver.http_endpoint
    otlp = OtlpConfig(endpoint=endpoint, protocol=protocol, insecure=True)
    telemetry = build_telemetry(TelemetryConfig(None, ["otlp"], otlp, PrometheusConfig()), Identity())
    logs = LogsConfig(enable=True, level="WARNING", rate_limit_per_logger=lines + 1)
    bridge = LogBridge.start(logs, telemetry.logger_provider, RunCorrelation(0, _Clock(), None, None))
    assert bridge is not None and telemetry._export_errors is not None
    log = logging.getLogger("bench_carry")
    log.propagate, log.disabled = True, False
    start = time.perf_counter()
    for i in range(lines):
        if rate:
            due = start + i / rate
            while (wait := due - time.perf_counter()) > 0:
                time.sleep(min(wait, 0.001))
        log.warning("loss line %d of step %d", i, i // 20)
    seconds = time.perf_counter() - start
    dropped = telemetry._export_errors.dropped.get("Log", 0)
    bridge.close()
    telemetry.close(120.0)
    return seconds, receiver.wait_quiet(0.5)["log_records"], dropped


def carry(args) -> None:
    from otel_mindformers.config import OtlpConfig

    queue = OtlpConfig().resolved_logs_queue_size()
    burst = args.burst or queue
    rates = [float(rate) for rate in args.rates.split(",") if rate]
    logging.getLogger().addHandler(logging.NullHandler())  # no last-resort printing of each line
    rows = []
    with ReceiverProcess() as receiver:
        for protocol in args.protocols.split(","):
            seconds, received, dropped = carried(protocol, receiver, burst, 0.0)
            rows.append((protocol, f"burst of {burst}", f"{burst / seconds:.0f}", burst, received, dropped))
            for rate in rates:
                lines = int(rate * args.seconds)
                seconds, received, dropped = carried(protocol, receiver, lines, rate)
                rows.append(
                    (protocol, f"{rate:g}/s for {args.seconds:g} s", f"{lines / seconds:.0f}", lines, received, dropped)
                )
    print(f"queue {queue} records, load average {os.getloadavg()[0]:.1f}")
    print("| protocol | lines | logged per s | logged | received | dropped (queue) |\n|---|---|---:|---:|---:|---:|")
    for row in rows:
        print("| " + " | ".join(str(cell) for cell in row) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--lines", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--carry", action="store_true", help="what the OTLP log queue carries, not the run cost")
    parser.add_argument("--protocols", default="grpc,http/json,http/protobuf")
    parser.add_argument("--rates", default="1000,2000,3000", help="lines per second, comma-separated ('': none)")
    parser.add_argument("--burst", type=int, default=0, help="lines of the burst (default: the queue's size)")
    parser.add_argument("--seconds", type=float, default=15.0)
    args = parser.parse_args()
    if args.carry:
        carry(args)
        return
    variants = ["logs off", "logs on, within the limit", "logs on, rate-limited"]
    results: dict[str, list[tuple[float, float]]] = {v: [] for v in variants}
    with tempfile.TemporaryDirectory() as folder, ReceiverProcess() as receiver:
        os.chdir(folder)
        script_log = logging.FileHandler(Path(folder) / "script.log")
        logging.getLogger("bench_script").addHandler(script_log)
        for _ in range(args.rounds):
            for variant in variants:
                results[variant].append(one_run(variant, args, receiver.grpc_endpoint, Path(folder)))
    print(
        f"{args.steps} steps x {args.lines} WARNING lines per step, {args.rounds} rounds, "
        f"load average {os.getloadavg()[0]:.1f}"
    )
    print("| variant | whole run (s) | vs logs off | per logging call (us) |\n|---|---:|---:|---:|")
    base = statistics.median(r[0] for r in results["logs off"])
    for variant in variants:
        run = statistics.median(r[0] for r in results[variant])
        call = statistics.median(r[1] for r in results[variant])
        print(f"| {variant} | {run:.2f} | {run / base:.3f} | {call:.1f} |")


if __name__ == "__main__":
    main()
