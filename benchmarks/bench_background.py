"""Does background Python work slow `Model.train` through the GIL, or only through the cores?

    .venv/bin/python benchmarks/bench_background.py [--busy-ms 0.5] [--period-ms 4] [--rounds 8]

The same duty cycle of pure-Python CPU work (`--busy-ms` of every `--period-ms`, what our
pipeline worker and exporters spend per step at interval 1) runs beside a real graph-mode
`Model.train` (the small MLP of bench_overhead.py), in interleaved rounds: none, in a thread
of the training process (it needs the GIL the training thread needs), and in another process
(it needs only a core). Per round, each variant's wall time over the mean of the round's two
bare runs; the medians with a 95 % bootstrap interval.

If the thread costs more than the process, the GIL is a cost of its own, and moving the work
out of the process (a local OTLP forwarder) would pay; if they cost the same, the work costs
its CPU wherever it runs, and only less work helps.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import mindspore as ms  # noqa: E402
import numpy as np  # noqa: E402
from _mlp import BATCH, CLASSES, FEATURES, HIDDEN, build_model  # noqa: E402
from bench_overhead import bootstrap_median  # noqa: E402
from mindspore.dataset import NumpySlicesDataset  # noqa: E402


def burn(stop: Any, busy: float, period: float) -> None:
    """Pure-Python work for `busy` seconds of CPU in every `period`, until `stop` is set."""
    while not stop.is_set():
        until = time.thread_time() + busy
        count = 0
        while time.thread_time() < until:
            for _ in range(100):
                count += 1
        time.sleep(max(period - busy, 0.0))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--busy-ms", type=float, default=0.5)
    parser.add_argument("--period-ms", type=float, default=4.0)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--steps", type=int, default=400)
    args = parser.parse_args()
    busy, period = args.busy_ms / 1e3, args.period_ms / 1e3
    print(f"load average at start: {' '.join(f'{v:.1f}' for v in os.getloadavg())}, {os.cpu_count()} CPUs")
    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_device("CPU")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((args.steps * BATCH, FEATURES)).astype(np.float32)
    y = rng.integers(0, CLASSES, args.steps * BATCH).astype(np.int32)
    model = build_model(HIDDEN["small"])

    def train() -> float:
        dataset = NumpySlicesDataset({"x": x, "y": y}, shuffle=False).batch(BATCH)
        started = time.perf_counter()
        model.train(1, dataset, dataset_sink_mode=False)
        return time.perf_counter() - started

    def beside(make_event: Any, make_worker: Any) -> float:
        """A bare run with `burn` going in a worker of `make_worker`'s kind."""
        stop = make_event()
        worker = make_worker(target=burn, args=(stop, busy, period), daemon=True)
        worker.start()
        try:
            return train()
        finally:
            stop.set()
            worker.join()

    train()  # compile
    variants = {
        "thread": lambda: beside(threading.Event, threading.Thread),
        "process": lambda: beside(multiprocessing.Event, multiprocessing.Process),
    }
    ratios: dict[str, list[float]] = {name: [] for name in variants}
    for round_ in range(args.rounds):
        names = list(variants) if round_ % 2 == 0 else list(reversed(variants))
        first = train()
        walls = {name: variants[name]() for name in names}
        bare = (first + train()) / 2
        for name, wall in walls.items():
            ratios[name].append(wall / bare)
        print(f"  round {round_ + 1}/{args.rounds}: bare {bare / args.steps * 1e3:.2f} ms/step", file=sys.stderr)
    print(f"background work: {args.busy_ms} ms of pure-Python CPU every {args.period_ms} ms")
    for name, values in ratios.items():
        median, low, high = bootstrap_median(values)
        print(
            f"  in a {name:7s}: whole run / bare {median:.3f} [{low:.3f}, {high:.3f}]  rounds {[round(v, 3) for v in values]}"
        )
    paired = [t / p for t, p in zip(ratios["thread"], ratios["process"])]
    median, low, high = bootstrap_median(paired)
    print(f"  thread / process, paired: {median:.3f} [{low:.3f}, {high:.3f}] (above 1: the GIL costs beyond the core)")


if __name__ == "__main__":
    main()
