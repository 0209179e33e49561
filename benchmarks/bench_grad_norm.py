"""What `grad_monitor: True` costs a step when the train cell returns no norm (the probe).

    .venv/bin/python benchmarks/bench_grad_norm.py                    # small model (3-5 ms steps), graph, interval 10
    .venv/bin/python benchmarks/bench_grad_norm.py --model default    # ~15 ms steps
    .venv/bin/python benchmarks/bench_grad_norm.py --rounds 12 --json out.json

The probe (otel_mindformers/model_state/grad_norm_probe.py) enters the step's compiled graph,
so it cannot be switched on and off in one Model: one process trains two Models of the same
MLP (benchmarks/_mlp.py), one whose optimizer the first monitored run wrapped, one never
wrapped, in interleaved rounds (the order rotated each round):
- `bare`: the plain model, no callback;
- `off`: the plain model, MonitorCallback with `grad_monitor: false`;
- `on`: the probed model, MonitorCallback with `grad_monitor: true` (the norm in every step,
  read back on sampled steps);
- `probe only`: the probed model, no callback (what the norm costs in the graph alone).
Then the graph's own cost, without the loop's noise: both train cells called directly on one
batch, in interleaved blocks of 100 calls (the median per call over the blocks).
Per run, the step time is the mean of the steps after the first WARMUP_STEPS (sampled ones
included, as a job pays them) and the median of the unsampled ones. Per round the paired
ratios on/off, probe only/bare and off/bare; reported: their median over the rounds and
their range.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import mindspore as ms  # noqa: E402
import numpy as np  # noqa: E402
from _mlp import BATCH, CLASSES, FEATURES, HIDDEN, Redirected, build_model  # noqa: E402
from mindspore.dataset import NumpySlicesDataset  # noqa: E402
from mindspore.train import Callback  # noqa: E402

WARMUP_STEPS = 20
VARIANTS = ("bare", "off", "on", "probe only")


class _StepEnds(Callback):
    """perf_counter at each step's end (one call: the same in every variant)."""

    def __init__(self) -> None:
        self.ends: list[float] = []

    def on_train_step_end(self, run_context: Any) -> None:
        self.ends.append(time.perf_counter())


def _config(folder: Path, interval: int, grad_monitor: bool) -> dict[str, Any]:
    return {
        "interval": interval,
        "grad_monitor": grad_monitor,
        "output_type": ["json_file", "tensorboard"],
        "json_log_path": str(folder / "m.json"),
        "tensorboard_path": str(folder / "tb"),
    }


def run(args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    from otel_mindformers import MonitorCallback

    ms.set_context(mode=ms.GRAPH_MODE if args.mode == "graph" else ms.PYNATIVE_MODE)
    ms.set_device("CPU")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((args.steps * BATCH, FEATURES)).astype(np.float32)
    y = rng.integers(0, CLASSES, args.steps * BATCH).astype(np.int32)
    ms.set_seed(0)
    plain = build_model(HIDDEN[args.model])
    ms.set_seed(0)
    probed = build_model(HIDDEN[args.model])
    log = folder / "training.log"

    def train(name: str, round_: int) -> tuple[float, float]:
        ends = _StepEnds()
        callbacks: list[Any] = [ends]
        if name in ("off", "on"):
            run_folder = folder / f"r{round_}_{name.replace(' ', '_')}"
            callbacks.insert(0, MonitorCallback(_config(run_folder, args.interval, name == "on")))
        model = probed if name in ("on", "probe only") else plain
        dataset = NumpySlicesDataset({"x": x, "y": y}, shuffle=False).batch(BATCH)
        with Redirected(log):
            model.train(1, dataset, callbacks=callbacks, dataset_sink_mode=False)
        steps = np.diff(np.asarray(ends.ends))[WARMUP_STEPS:]  # steps[i] ends step WARMUP_STEPS + i + 2
        numbers = np.arange(WARMUP_STEPS + 2, WARMUP_STEPS + 2 + steps.size)
        unsampled = steps[numbers % args.interval != 0]
        return float(steps.mean()), float(np.median(unsampled))

    # Compile and warm up both; the first monitored run wraps the probed model's optimizer.
    train("off", -1)
    train("on", -1)
    means: dict[str, list[float]] = {name: [] for name in VARIANTS}
    unsampled: dict[str, list[float]] = {name: [] for name in VARIANTS}
    for round_ in range(args.rounds):
        shift = round_ % len(VARIANTS)
        for name in VARIANTS[shift:] + VARIANTS[:shift]:
            mean, median_unsampled = train(name, round_)
            means[name].append(mean)
            unsampled[name].append(median_unsampled)
        print(
            f"  round {round_ + 1}/{args.rounds}: on/off {means['on'][-1] / means['off'][-1]:.4f} "
            f"(load average {os.getloadavg()[0]:.1f})",
            file=sys.stderr,
            flush=True,
        )

    batch = (ms.Tensor(x[:BATCH]), ms.Tensor(y[:BATCH]))
    cell_ms: dict[str, list[float]] = {"plain": [], "probed": []}
    for _ in range(args.rounds * 2):
        for name, model in (("plain", plain), ("probed", probed)):
            cell = model._train_network
            started = time.perf_counter()
            for _ in range(100):
                loss = cell(*batch)
            loss.asnumpy()  # the last call's end
            cell_ms[name].append((time.perf_counter() - started) * 10)

    def paired(a: str, b: str, table: dict[str, list[float]]) -> dict[str, float]:
        ratios = [p / q for p, q in zip(table[a], table[b])]
        return {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios)}

    return {
        "model": args.model,
        "mode": args.mode,
        "interval": args.interval,
        "steps": args.steps,
        "rounds": args.rounds,
        "ms_per_step_mean": {name: statistics.median(values) * 1e3 for name, values in means.items()},
        "ms_per_unsampled_step": {name: statistics.median(values) * 1e3 for name, values in unsampled.items()},
        "on/off (every step)": paired("on", "off", means),
        "on/off (unsampled steps)": paired("on", "off", unsampled),
        "probe only/bare": paired("probe only", "bare", means),
        "off/bare": paired("off", "bare", means),
        "cell_ms_per_call": {name: statistics.median(values) for name, values in cell_ms.items()},
        "cell probed/plain": paired("probed", "plain", cell_ms),
        "per_round": {"mean": means, "unsampled": unsampled, "cell": cell_ms},
    }


def report(result: dict[str, Any]) -> None:
    print(
        f"grad_monitor cost: {result['model']} model, {result['mode']} mode, interval {result['interval']}, "
        f"{result['rounds']} rounds of {result['steps']} steps"
    )
    for name in VARIANTS:
        print(
            f"  {name:<11} {result['ms_per_step_mean'][name]:7.3f} ms/step (mean), "
            f"{result['ms_per_unsampled_step'][name]:7.3f} ms per unsampled step (median)"
        )
    cell = result["cell_ms_per_call"]
    print(f"  train cell alone: {cell['plain']:.3f} ms plain, {cell['probed']:.3f} ms with the probe (median per call)")
    for key in ("on/off (every step)", "on/off (unsampled steps)", "probe only/bare", "off/bare", "cell probed/plain"):
        figure = result[key]
        print(
            f"  {key:<25} {100 * (figure['median'] - 1):+6.2f} %  "
            f"(rounds: {100 * (figure['min'] - 1):+.2f} .. {100 * (figure['max'] - 1):+.2f} %)"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=["graph", "pynative"], default="graph")
    parser.add_argument("--model", choices=sorted(HIDDEN), default="small")
    parser.add_argument("--interval", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        result = run(args, Path(folder))
    report(result)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
