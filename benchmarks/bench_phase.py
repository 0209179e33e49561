"""What one `otel_mindformers.phase()` costs the training thread (enter + exit), measured
inside a real MindSpore training loop.

    .venv/bin/python benchmarks/bench_phase.py [--steps 200] [--phases 20]

At every step end a callback on the training thread opens and closes `--phases` phases
(four distinct names) and times each pair with `time.perf_counter()`. Two runs: JSON lines
only, and JSON lines plus OTLP to a receiver in another process (spans exported). Prints the
median and p90 per phase (target: <= 20 us enter + exit), and the same without a run (the
phase is remembered for the next one).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION", "python")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _receiver import ReceiverProcess  # noqa: E402
from mindspore.train import Callback  # noqa: E402

import otel_mindformers  # noqa: E402
from otel_mindformers import MonitorCallback  # noqa: E402
from tests.support import training  # noqa: E402


class _Phases(Callback):
    def __init__(self, count: int) -> None:
        super().__init__()
        self.count = count
        self.seconds: list[float] = []

    def on_train_step_end(self, run_context) -> None:
        clock, phase, seconds = time.perf_counter, otel_mindformers.phase, self.seconds
        for i in range(self.count):
            start = clock()
            with phase(f"upload_{i % 4}"):
                pass
            seconds.append(clock() - start)


def _summary(label: str, seconds: list[float]) -> str:
    us = sorted(s * 1e6 for s in seconds[len(seconds) // 10 :])  # the first tenth warms up
    p90 = us[int(len(us) * 0.9)]
    return f"| {label} | {len(us)} | {statistics.median(us):.1f} | {p90:.1f} |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--phases", type=int, default=20, help="phases per step")
    args = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.1f}\n")
    print("| run | phases | median µs | p90 µs |\n|---|---|---|---|")
    with tempfile.TemporaryDirectory() as folder, ReceiverProcess() as receiver:
        os.chdir(folder)
        outputs = {
            "JSON lines only": {"output_type": ["json_file"]},
            "JSON lines + OTLP (gRPC)": {
                "output_type": ["json_file", "otlp"],
                "otlp": {"endpoint": receiver.grpc_endpoint, "protocol": "grpc"},
            },
        }
        for label, output in outputs.items():
            marker = _Phases(args.phases)
            config = {"interval": 10, "json_log_path": str(Path(folder) / f"{len(label)}.json"), **output}
            training.train([MonitorCallback(config), marker], steps=args.steps)
            print(_summary(label, marker.seconds))
        outside = _Phases(1)
        for _ in range(args.steps * args.phases // 10):
            outside.on_train_step_end(None)
        print(_summary("no run (kept for the next run)", outside.seconds))


if __name__ == "__main__":
    main()
