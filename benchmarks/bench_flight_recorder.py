"""What the flight recorder (docs/flight_recorder.md) costs the training thread, inside the
real `Model.train` loop: MonitorCallback's `on_train_step_end` with the ring and without it.

    .venv/bin/python benchmarks/bench_flight_recorder.py [--rounds 10] [--steps 300] [--interval 10]

One process trains the small MLP of bench_overhead.py (graph mode, 3-5 ms steps, json_file
only) in rounds that alternate the two variants (the order flips every round), so both see
the same load; the variant without a ring is the same run with `flight_recorder.start`
returning a `NoRecorder` (the step hook still stores the step, into a buffer of its own).
Prints the medians of the hook's wall time on unsampled and sampled steps per variant, and
the median of the per-round differences (ring - none), which is what the ring costs.
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

import mindspore as ms  # noqa: E402  (before anything imports protobuf)
import numpy as np  # noqa: E402
from _mlp import BATCH, CLASSES, FEATURES, HIDDEN, Redirected, build_model  # noqa: E402
from mindspore.dataset import NumpySlicesDataset  # noqa: E402

from otel_mindformers.flight_recorder import recorder  # noqa: E402
from otel_mindformers.runtime.callback import MonitorCallback  # noqa: E402

_start = recorder.start


def _no_ring(*args, **kwargs):
    return recorder.NoRecorder()


def _timed_round(folder: Path, with_ring: bool, steps: int, interval: int) -> tuple[list[float], list[float]]:
    """One training; the hook's seconds on (unsampled, sampled) steps."""
    recorder.start = _start if with_ring else _no_ring
    callback = MonitorCallback(
        {"interval": interval, "output_type": ["json_file"], "json_log_path": str(folder / "m.json")}
    )
    hook = callback.on_train_step_end
    unsampled: list[float] = []
    sampled: list[float] = []

    def timed(run_context):
        step = run_context.original_args()["cur_step_num"]
        start = time.perf_counter()
        hook(run_context)
        (sampled if step == 1 or step % interval == 0 else unsampled).append(time.perf_counter() - start)

    callback.on_train_step_end = timed  # an instance attribute shadows the class's method
    rng = np.random.default_rng(0)
    x = rng.standard_normal((steps * BATCH, FEATURES), dtype=np.float32)
    y = rng.integers(0, CLASSES, steps * BATCH).astype(np.int32)
    dataset = NumpySlicesDataset({"x": x, "y": y}, shuffle=False).batch(BATCH)
    model = build_model(HIDDEN["small"])
    with Redirected(folder / "training.log"):
        model.train(1, dataset, callbacks=[callback], dataset_sink_mode=False)
    return unsampled[10:], sampled[2:]  # the first steps compile


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--interval", type=int, default=10)
    args = parser.parse_args()
    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_device("CPU")
    print(f"load average at start: {' '.join(f'{v:.1f}' for v in os.getloadavg())}, {os.cpu_count()} CPUs")
    medians: dict[bool, dict[str, list[float]]] = {
        True: {"unsampled": [], "sampled": []},
        False: {"unsampled": [], "sampled": []},
    }
    with tempfile.TemporaryDirectory() as folder:
        for round_ in range(args.rounds):
            for with_ring in (True, False) if round_ % 2 else (False, True):
                target = Path(folder) / f"{round_}-{with_ring}"
                target.mkdir()
                unsampled, sampled = _timed_round(target, with_ring, args.steps, args.interval)
                medians[with_ring]["unsampled"].append(statistics.median(unsampled) * 1e6)
                medians[with_ring]["sampled"].append(statistics.median(sampled) * 1e6)
    recorder.start = _start
    print(f"load average at end: {' '.join(f'{v:.1f}' for v in os.getloadavg())}")
    print(f"graph mode, small model, interval {args.interval}, json_file, {args.steps} steps x {args.rounds} rounds")
    print("| on_train_step_end | without a ring, µs | with the ring, µs | ring - none, median of rounds, µs |")
    print("|---|---:|---:|---:|")
    for kind in ("unsampled", "sampled"):
        without, with_ = medians[False][kind], medians[True][kind]
        difference = statistics.median(w - n for w, n in zip(with_, without))
        print(f"| {kind} | {statistics.median(without):.2f} | {statistics.median(with_):.2f} | {difference:+.2f} |")
    for kind in ("unsampled", "sampled"):  # the scatter behind each median
        rounds = (w - n for w, n in zip(medians[True][kind], medians[False][kind]))
        print(f"{kind}, ring - none per round, µs: {' '.join(f'{d:+.1f}' for d in rounds)}")


if __name__ == "__main__":
    main()
