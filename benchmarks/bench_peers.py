"""Training overhead of MonitorCallback against the monitors users would use instead
(what a step of ours costs inside `Model.train` on its own: bench_overhead.py).

    .venv/bin/python benchmarks/bench_peers.py                 # graph and PyNative
    .venv/bin/python benchmarks/bench_peers.py --modes graph --rounds 7 --steps 600

One real MindSpore CPU training loop (an MLP sized for ~10-20 ms per step in graph mode, or
`--model small` for 2-5 ms steps), trained again and again in one process with each
variant's callbacks:
- bare (no callback);
- ours at interval 1, 10 and 100, with stdout, json_file, tensorboard and OTLP (gRPC) to a
  receiver running in another process, and at interval 10 with OTLP over HTTP/JSON;
- MindSpore LossMonitor(10), TimeMonitor, SummaryCollector(collect_freq=10);
- MindFormers MFLossMonitor(per_print_times=10);
- a hand-written tensorboardX callback logging the loss every 10 steps.
Variants alternate in a rotated order for several rounds, each round in a fresh process
(MFLossMonitor slows every later training in its process; it and SummaryCollector run last
in each round). Per variant it reports the median
whole-run time and its ratio to bare, and the share of run time spent inside the variant's
callback hooks (each hook is wrapped with perf_counter accounting): whole-run times move by
several percent between identical runs on a shared machine, the share in hooks does not.
`begin+end` is the time of the start and end hooks (building and flushing exporters), which
a long real run amortises. stdout and stderr go to a log file while a variant trains, as
under a job scheduler.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION", "python")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import mindspore as ms  # noqa: E402  (before anything imports protobuf)
import numpy as np  # noqa: E402
from _mlp import BATCH, CLASSES, FEATURES, HIDDEN, HOOKS, Redirected, build_model  # noqa: E402
from _receiver import ReceiverProcess  # noqa: E402
from mindspore.dataset import NumpySlicesDataset  # noqa: E402
from mindspore.train import Callback, LossMonitor, SummaryCollector, TimeMonitor  # noqa: E402

EDGE_HOOKS = ("on_train_begin", "on_train_end")


class TensorBoardXEvery10(Callback):
    """What users write today: read the loss back and log it every 10 steps."""

    def __init__(self, logdir: str) -> None:
        from tensorboardX import SummaryWriter

        super().__init__()
        self.writer = SummaryWriter(logdir)

    def on_train_step_end(self, run_context):
        cb_params = run_context.original_args()
        if cb_params.cur_step_num % 10 == 0:
            loss = float(np.mean(cb_params.net_outputs.asnumpy()))
            self.writer.add_scalar("loss", loss, cb_params.cur_step_num)

    def on_train_end(self, run_context):
        self.writer.close()


def _variants(folder: Path, endpoints: dict[str, str], steps: int) -> dict[str, Callable[[int], list]]:
    """Variant name → factory of a fresh callback list for run number `n`."""
    from mindformers.core.callback import MFLossMonitor

    from otel_mindformers.runtime.callback import MonitorCallback

    def ours(interval: int, protocol: str = "grpc") -> Callable[[int], list]:
        def make(n: int) -> list:
            return [
                MonitorCallback(
                    {
                        "interval": interval,
                        "output_type": ["stdout", "json_file", "tensorboard", "otlp"],
                        "json_log_path": str(folder / f"ours_{n}" / "train_metric.json"),
                        "tensorboard_path": str(folder / f"ours_{n}" / "tensorboard"),
                        "otlp": {"endpoint": endpoints[protocol], "protocol": protocol},
                    }
                )
            ]

        return make

    return {
        "bare": lambda n: [],
        "ours interval=1": ours(1),
        "ours interval=10": ours(10),
        "ours interval=10 http/json": ours(10, "http/json"),
        "ours interval=100": ours(100),
        "LossMonitor(10)": lambda n: [LossMonitor(10)],
        "TimeMonitor": lambda n: [TimeMonitor()],
        "SummaryCollector(10)": lambda n: [
            SummaryCollector(
                str(folder / f"summary_{n}"),
                collect_freq=10,
                # Its dataset-graph collector fails with the protobuf this environment needs.
                collect_specified_data={"collect_dataset_graph": False},
            )
        ],
        "MFLossMonitor(10)": lambda n: [
            MFLossMonitor(
                learning_rate=0.01, per_print_times=10, origin_epochs=1, dataset_size=steps, global_batch_size=BATCH
            )
        ],
        "tensorboardX every 10": lambda n: [TensorBoardXEvery10(str(folder / f"tbx_{n}"))],
    }


def _timed(callbacks: list, seconds: dict[str, float]) -> list:
    """Wrap each callback's hooks (instance attributes shadow the class's methods)."""
    for callback in callbacks:
        for hook in HOOKS:
            method = getattr(callback, hook)

            def timed(run_context, method=method, hook=hook):
                started = time.perf_counter()
                try:
                    method(run_context)
                finally:
                    seconds[hook] += time.perf_counter() - started

            setattr(callback, hook, timed)
    return callbacks


# Run last in their process: SummaryCollector adds summary operators to the network, and
# after MFLossMonitor's first step every later training in the process runs ~2x slower.
_LAST = ("SummaryCollector(10)", "MFLossMonitor(10)")


def run_round(
    mode: str, round_: int, steps: int, folder: Path, endpoints: dict[str, str], model_size: str
) -> dict[str, dict[str, float]]:
    """One round in this process: a warm-up, then every variant once."""
    ms.set_context(mode=ms.GRAPH_MODE if mode == "graph" else ms.PYNATIVE_MODE)
    ms.set_device("CPU")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((steps * BATCH, FEATURES)).astype(np.float32)
    y = rng.integers(0, CLASSES, steps * BATCH).astype(np.int32)
    model = build_model(HIDDEN[model_size])
    variants = _variants(folder, endpoints, steps)
    rotating = [name for name in variants if name not in _LAST]
    shift = round_ % len(rotating)
    order = rotating[shift:] + rotating[:shift] + list(_LAST)

    def train(callbacks: list) -> float:
        dataset = NumpySlicesDataset({"x": x, "y": y}, shuffle=False).batch(BATCH)
        with Redirected(folder / "training.log"):
            started = time.perf_counter()
            model.train(1, dataset, callbacks=callbacks, dataset_sink_mode=False)
            return time.perf_counter() - started

    train([])  # compile and warm up
    results = {}
    for run, name in enumerate(order):
        seconds: dict[str, float] = defaultdict(float)
        wall = train(_timed(variants[name](run), seconds))
        edge = sum(seconds[h] for h in EDGE_HOOKS)
        results[name] = {"wall": wall, "step_share": (sum(seconds.values()) - edge) / wall, "edge": edge}
    return results


def run_mode(mode: str, rounds: int, steps: int, folder: Path, endpoints: dict[str, str], model_size: str) -> None:
    """Each round in a fresh process (see _LAST); prints the table."""
    runs: dict[str, list[dict[str, float]]] = defaultdict(list)
    for round_ in range(rounds):
        round_folder = folder / f"{mode}_{round_}"
        round_folder.mkdir()
        command = [
            sys.executable,
            __file__,
            "--round-worker",
            mode,
            str(round_),
            str(steps),
            str(round_folder),
            json.dumps(endpoints),
            model_size,
        ]
        output = subprocess.run(command, check=True, capture_output=True, text=True, cwd=round_folder).stdout
        for name, result in json.loads(output.splitlines()[-1]).items():
            runs[name].append(result)
        print(f"  {mode}: round {round_ + 1}/{rounds} done (load average {os.getloadavg()[0]:.1f})", flush=True)

    bare = statistics.median(r["wall"] for r in runs["bare"])
    print(
        f"\n{mode} mode, {model_size} model, {steps} steps x {rounds} rounds, bare median {bare / steps * 1e3:.2f} ms/step"
    )
    print("| variant | whole run vs bare | time in step hooks | per round | begin+end |")
    print("|---|---:|---:|---:|---:|")
    for name, results in runs.items():
        ratio = statistics.median(r["wall"] for r in results) / bare
        share = statistics.median(r["step_share"] for r in results)
        rounds_ = " / ".join(f"{r['step_share'] * 100:.2f}" for r in results)
        edge = statistics.median(r["edge"] for r in results)
        print(f"| {name} | {ratio:.3f} | {share * 100:.2f} % | {rounds_} | {edge * 1e3:.0f} ms |")


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--round-worker":
        mode, round_, steps, folder, endpoints, model_size = sys.argv[2:]
        results = run_round(mode, int(round_), int(steps), Path(folder), json.loads(endpoints), model_size)
        print(json.dumps(results))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modes", nargs="+", default=["graph", "pynative"], choices=["graph", "pynative"])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument(
        "--model",
        choices=sorted(HIDDEN),
        default="default",
        help="small: 2-5 ms graph-mode steps, where a callback's cost shows most",
    )
    args = parser.parse_args()
    print(f"load average at start: {' '.join(f'{v:.1f}' for v in os.getloadavg())}, {os.cpu_count()} CPUs")
    with tempfile.TemporaryDirectory() as folder, ReceiverProcess() as receiver:
        for mode in args.modes:
            endpoints = {"grpc": receiver.grpc_endpoint, "http/json": receiver.http_endpoint}
            run_mode(mode, args.rounds, args.steps, Path(folder), endpoints, args.model)
    print(f"load average at end: {' '.join(f'{v:.1f}' for v in os.getloadavg())}")


if __name__ == "__main__":
    main()
