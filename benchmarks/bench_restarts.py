"""The cost of the job's ledger (docs/restarts.md) on the training thread: MonitorCallback's
per-step hooks with `restarts.enable` on and off, and where the ledger writes happen.

    .venv/bin/python benchmarks/bench_restarts.py [--steps 5000] [--interval 10]

Each configuration runs `--rounds` times, alternating, in this process (json_file output
only, so the numbers are the hooks' own); prints medians of the per-step hook time and the
ledger writes made on the training thread and off it.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

os.environ.setdefault("PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION", "python")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import mindspore as ms  # noqa: E402
from bench_hot_path import _cb_params  # noqa: E402
from mindspore.train.callback import RunContext  # noqa: E402

from otel_mindformers.restarts import attempt_tracker as attempts  # noqa: E402
from otel_mindformers.restarts import ledger
from otel_mindformers.runtime.callback import MonitorCallback  # noqa: E402

WRITES: list[int] = []
_original = ledger.write_ledger


def _counted(path, data):
    WRITES.append(threading.get_ident())
    return _original(path, data)


attempts.write_ledger = ledger.write_ledger = _counted


def measure(steps: int, interval: int, restarts: bool, folder: Path) -> dict[str, float]:
    config = {
        "interval": interval,
        "output_type": ["json_file"],
        "json_log_path": str(folder / f"run_{restarts}.json"),
        "restarts": {"enable": restarts, "heartbeat_interval": 1.0},
    }
    callback = MonitorCallback(config)
    params = _cb_params("scalar", steps)
    run_context = RunContext(params)
    WRITES.clear()
    unsampled, sampled = [], []
    callback.on_train_begin(run_context)
    callback.on_train_epoch_begin(run_context)
    started_run = time.perf_counter()
    for step in range(1, steps + 1):
        params.cur_step_num = step
        started = time.perf_counter()
        callback.on_train_step_begin(run_context)
        callback.on_train_step_end(run_context)
        elapsed = time.perf_counter() - started
        (sampled if step == 1 or step % interval == 0 else unsampled).append(elapsed)
    seconds = time.perf_counter() - started_run
    callback.on_train_epoch_end(run_context)
    callback.on_train_end(run_context)
    main = threading.get_ident()
    return {
        "unsampled_us": statistics.median(unsampled) * 1e6,
        "sampled_us": statistics.median(sampled) * 1e6,
        "writes_training_thread": WRITES.count(main),
        "writes_elsewhere": len(WRITES) - WRITES.count(main),
        "seconds": seconds,
        "max_ms": max(unsampled + sampled) * 1e3,
        "hooks_seconds": sum(unsampled) + sum(sampled),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5000)
    parser.add_argument("--interval", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    ms.set_context(mode=ms.PYNATIVE_MODE)
    ms.set_device("CPU")
    print(f"{args.steps} steps, interval {args.interval}, {args.rounds} rounds (load average {os.getloadavg()[0]:.1f})")
    results: dict[bool, list[dict[str, float]]] = {True: [], False: []}
    with tempfile.TemporaryDirectory() as folder:
        measure(200, args.interval, True, Path(folder))  # warm-up, discarded
        for _ in range(args.rounds):
            for restarts in (False, True):
                results[restarts].append(measure(args.steps, args.interval, restarts, Path(folder)))
    print(
        "| restarts | unsampled step, median us | sampled step, median us | slowest step, ms | all hooks, s "
        "| ledger writes on the training thread | ledger writes off it |"
    )
    print("|---|---|---|---|---|---|---|")
    for restarts in (False, True):
        rows = results[restarts]
        med = {key: statistics.median(r[key] for r in rows) for key in rows[0]}
        print(
            f"| {'on' if restarts else 'off'} | {med['unsampled_us']:.2f} | {med['sampled_us']:.1f} | "
            f"{med['max_ms']:.2f} | {med['hooks_seconds']:.3f} | "
            f"{med['writes_training_thread']:.0f} | {med['writes_elsewhere']:.0f} |"
        )


if __name__ == "__main__":
    main()
