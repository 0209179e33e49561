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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--lines", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
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
