"""What a step of MonitorCallback costs inside MindSpore's real `Model.train` loop.

    .venv/bin/python benchmarks/bench_overhead.py                          # small model, graph, interval 10, local outputs
    .venv/bin/python benchmarks/bench_overhead.py --model default --mode pynative --interval 1 --outputs all
    .venv/bin/python benchmarks/bench_overhead.py --rounds 40 --json out.json
    .venv/bin/python benchmarks/bench_overhead.py --door custom --mode jit          # a custom loop (the run API)

One process trains one MLP (`--model small`: 3-5 ms graph-mode steps; `default`: ~15 ms) again
and again, in interleaved rounds. Each round runs, in a rotated order between two bare runs:
- `bare`: no callback;
- `ours`: MonitorCallback, hooks not wrapped (the whole-run figure);
- `ours timed`: the same, each hook wrapped with perf_counter / thread_time accounting; in
  odd rounds every device readback (`Tensor._item`, `Tensor.asnumpy`) is timed on its own
  too (that wrapper costs a frame per read, so the hook figures come from the even rounds);
- `bare callback timed`: a callback whose `on_train_step_end` reads `cb_params["cur_step_num"]`,
  and on sampled steps reads the loss back with `item()` (the device wait and copy alone),
  under the same wrapper.

Reported, side by side:
- each hook's median and p90, unsampled and sampled, ours next to the bare callback, with the
  training thread's CPU time for the sampled step (a hook that waits on the GIL or a lock
  shows wall time without CPU time);
- for the sampled step, the readbacks' time apart from our host work;
- the share of the run inside our step hooks, and with train begin / end;
- on_train_begin / on_train_end (warm: median of every round; first: the process's first run);
- the CPU time our background threads take per sampled step (the process's CPU time off the
  training thread, beyond a bare run's), and by thread: the CPU of every Python thread that
  starts and ends with the run (the pipeline worker, the exporters), without MindSpore's;
- the whole-run slowdown of `ours` against `bare`: per round the paired ratio
  ours / mean(the round's two bare runs); the median of those ratios with a 95 % interval from
  a percentile bootstrap (10,000 resamples of the rounds), and a two-sided sign test.
`--door custom` measures the other door, the run API in a custom loop (`--mode pynative` or
`jit`), against the same loop with `contextlib.nullcontext()`: benchmarks/_custom_loop.py.
`--outputs local` is json_file + tensorboard; `all` adds stdout and OTLP/gRPC to a receiver in
another process (benchmarks/_receiver.py). stdout and stderr go to a log file while training
runs, as under a job scheduler. `--json` writes every figure and every per-round value.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager, nullcontext
from math import comb
from pathlib import Path
from typing import Any

os.environ.setdefault("PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION", "python")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import mindspore as ms  # noqa: E402  (before anything imports protobuf)
import numpy as np  # noqa: E402
from _mlp import BATCH, CLASSES, FEATURES, HIDDEN, HOOKS, Redirected, build_model  # noqa: E402
from _receiver import ReceiverProcess  # noqa: E402
from _switchback import Gate, Periods, SwitchbackPlan, mean_periods, pair_ratios  # noqa: E402
from mindspore import Tensor  # noqa: E402
from mindspore.dataset import NumpySlicesDataset  # noqa: E402
from mindspore.train import Callback  # noqa: E402

STEP_HOOKS = ("on_train_step_begin", "on_train_step_end")
WARMUP_STEPS = 20  # left out of the per-step figures (compile settling)


class BareCallback(Callback):
    """The floor: the step number, and on sampled steps the loss read back with `item()`."""

    def __init__(self, interval: int) -> None:
        super().__init__()
        self.interval = interval
        self.step = 0

    def on_train_step_end(self, run_context: Any) -> None:
        cb_params = run_context.original_args()
        self.step = step = cb_params["cur_step_num"]
        if step % self.interval == 0 or step == 1:
            cb_params["net_outputs"].item()


class _Readbacks:
    """Times every `Tensor._item` / `Tensor.asnumpy` call while entered (the readback: the
    device wait and the copy); `seconds` accumulates until read and reset by the wrapper."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.count = 0

    def __enter__(self) -> _Readbacks:
        self._saved = {name: getattr(Tensor, name) for name in ("_item", "asnumpy")}
        for name, real in self._saved.items():

            def timed(tensor: Any, *args: Any, real: Any = real) -> Any:
                started = time.perf_counter()
                try:
                    return real(tensor, *args)
                finally:
                    self.seconds += time.perf_counter() - started
                    self.count += 1

            setattr(Tensor, name, timed)
        return self

    def __exit__(self, *exc: object) -> None:
        for name, real in self._saved.items():
            setattr(Tensor, name, real)


class HookTimes:
    """Per-hook wall and thread-CPU seconds; step hooks per step number."""

    def __init__(self, readbacks: _Readbacks | None) -> None:
        self.edge: dict[str, float] = defaultdict(float)
        self.steps: dict[str, dict[int, tuple[float, float, float]]] = {hook: {} for hook in STEP_HOOKS}
        self._readbacks = readbacks
        self.times_readbacks = readbacks is not None

    def wrap(self, callback: Callback) -> Callback:
        """Instance attributes shadow the class's methods."""
        for hook in HOOKS:
            method = getattr(callback, hook)
            if hook in STEP_HOOKS:
                setattr(callback, hook, self._step_hook(method, self.steps[hook]))
            else:
                setattr(callback, hook, self._edge_hook(method, hook))
        return callback

    def _edge_hook(self, method: Any, hook: str) -> Any:
        def timed(run_context: Any) -> None:
            started = time.perf_counter()
            try:
                method(run_context)
            finally:
                self.edge[hook] += time.perf_counter() - started

        return timed

    def _step_hook(self, method: Any, per_step: dict) -> Any:
        readbacks = self._readbacks
        clock, cpu = time.perf_counter, time.thread_time

        def timed(run_context: Any) -> None:
            if readbacks is not None:
                readbacks.seconds = 0.0
            started_cpu = cpu()
            started = clock()
            try:
                method(run_context)
            finally:
                wall = clock() - started
                used = cpu() - started_cpu
                step = run_context.original_args()["cur_step_num"]
                per_step[step] = (wall, used, readbacks.seconds if readbacks is not None else 0.0)

        return timed


def _ours_config(args: argparse.Namespace, folder: Path, endpoint: str | None) -> dict[str, Any]:
    outputs = ["json_file", "tensorboard"]
    config: dict[str, Any] = {
        "interval": args.interval,
        "json_log_path": str(folder / "train_metric.json"),
        "tensorboard_path": str(folder / "tensorboard"),
    }
    if args.outputs == "all":
        outputs = ["stdout", *outputs, "otlp"]
        config["otlp"] = {"endpoint": endpoint, "protocol": "grpc"}
    config["output_type"] = outputs
    return config


def _sampled(step: int, interval: int) -> bool:
    return step == 1 or step % interval == 0


def _rows(runs: list, hook: str, kind: str, interval: int, *, with_readbacks: bool) -> list[tuple]:
    """(wall, cpu, readback) seconds of `hook` on `kind` steps past the warm-up."""
    return [
        times
        for run_ in runs
        if run_.times_readbacks == with_readbacks
        for step, times in run_.steps[hook].items()
        if step > WARMUP_STEPS and _sampled(step, interval) == (kind == "sampled")
    ]


def _percentile(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def bootstrap_median(ratios: list[float], resamples: int = 10_000, seed: int = 0) -> tuple[float, float, float]:
    """The median of the paired ratios and its 95 % percentile-bootstrap interval."""
    rng = random.Random(seed)
    n = len(ratios)
    medians = sorted(statistics.median(rng.choices(ratios, k=n)) for _ in range(resamples))
    return statistics.median(ratios), medians[int(0.025 * resamples)], medians[int(0.975 * resamples) - 1]


def _paired(ratios: list[float]) -> dict[str, Any]:
    """The per-round paired ratios, their median, its 95 % interval, and the sign test."""
    median, low, high = bootstrap_median(ratios)
    return {"median_ratio": median, "ci95": [low, high], "sign_test_p": sign_test(ratios), "ratios": ratios}


def sign_test(ratios: list[float]) -> float:
    """Two-sided sign test of "ratio = 1": the p-value (exact binomial)."""
    above = sum(r > 1 for r in ratios)
    n = sum(r != 1 for r in ratios)
    if n == 0:
        return 1.0
    k = min(above, n - above)
    return min(1.0, 2 * sum(comb(n, i) for i in range(k + 1)) / 2**n)


def run(args: argparse.Namespace, folder: Path, endpoint: str | None) -> dict[str, Any]:
    from otel_mindformers.runtime.callback import MonitorCallback

    ms.set_context(mode=ms.GRAPH_MODE if args.mode == "graph" else ms.PYNATIVE_MODE)
    ms.set_device("CPU")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((args.steps * BATCH, FEATURES)).astype(np.float32)
    y = rng.integers(0, CLASSES, args.steps * BATCH).astype(np.int32)
    model = build_model(HIDDEN[args.model])
    log = folder / "training.log"

    background: dict[str, list[float]] = defaultdict(list)  # CPU seconds off the training thread, per run
    threads = _ThreadCPU()

    def train(callbacks: list, name: str = "bare") -> float:
        dataset = NumpySlicesDataset({"x": x, "y": y}, shuffle=False).batch(BATCH)
        with Redirected(log), threads.counting(name):
            cpu, own = time.process_time(), time.thread_time()
            started = time.perf_counter()
            model.train(1, dataset, callbacks=callbacks, dataset_sink_mode=False)
            wall = time.perf_counter() - started
            background[name].append((time.process_time() - cpu) - (time.thread_time() - own))
            return wall

    train([])  # compile and warm up
    walls: dict[str, list[float]] = defaultdict(list)
    timed: dict[str, list[HookTimes]] = defaultdict(list)
    first_edge: dict[str, float] | None = None
    variants = ("ours timed", "bare callback timed", "ours")  # round 1 starts with ours timed: its first run
    for round_ in range(args.rounds):
        shift = round_ % len(variants)
        order = ["bare", *variants[shift:], *variants[:shift], "bare"]
        bare_walls = []
        for n, name in enumerate(order):
            run_folder = folder / f"r{round_}_{n}"
            if name == "bare":
                bare_walls.append(train([], name))
                continue
            if name == "bare callback timed":
                times = HookTimes(None)
                walls[name].append(train([times.wrap(BareCallback(args.interval))], name))
                timed[name].append(times)
                continue
            callback = MonitorCallback(_ours_config(args, run_folder, endpoint))
            if name == "ours":
                walls[name].append(train([callback], name))
                continue
            # Readbacks timed in odd rounds only: the timing wrapper costs a frame per read.
            with _Readbacks() if round_ % 2 else nullcontext() as readbacks:
                times = HookTimes(readbacks)
                walls[name].append(train([times.wrap(callback)], name))
            timed[name].append(times)
            if first_edge is None:
                first_edge = dict(times.edge)
        walls["bare"].append(statistics.fmean(bare_walls))
        print(
            f"  round {round_ + 1}/{args.rounds}: ours/bare {walls['ours'][-1] / walls['bare'][-1]:.4f} "
            f"(load average {os.getloadavg()[0]:.1f})",
            file=sys.stderr,
            flush=True,
        )
    result = _summarise(args, walls, timed, first_edge or {})
    if args.pairs:
        bare_step = result["bare_ms_per_step"] / 1e3
        result["switchback"] = switchback(args, model, x, y, folder, endpoint, bare_step, threads)
    sampled_steps = sum(_sampled(step, args.interval) for step in range(1, args.steps + 1))
    extra = statistics.median(background["ours"]) - statistics.median(background["bare"])
    result["ours: background CPU per sampled step, us"] = extra / sampled_steps * 1e6
    result["ours: background CPU per sampled step by thread, us"] = threads.per_step("ours", sampled_steps)
    return result


def switchback(
    args: argparse.Namespace,
    model: Any,
    x: np.ndarray,
    y: np.ndarray,
    folder: Path,
    endpoint: str | None,
    bare_step: float,
    threads: _ThreadCPU,
) -> dict[str, Any]:
    """One long run, ours switched on and off in blocks (benchmarks/_switchback.py)."""
    from otel_mindformers.runtime.callback import MonitorCallback

    plan = SwitchbackPlan.for_step_time(bare_step, args.interval, args.pairs)
    repeats = -(-plan.steps // args.steps)
    dataset = NumpySlicesDataset({"x": x, "y": y}, shuffle=False).batch(BATCH).repeat(repeats)
    gate = Gate(MonitorCallback(_ours_config(args, folder / "switchback", endpoint)))
    periods = Periods(gate, plan)
    print(
        f"  switchback: {plan.pairs} pairs of {plan.block}-step blocks (guard {plan.guard}), {plan.steps} steps",
        file=sys.stderr,
        flush=True,
    )
    with Redirected(folder / "training.log"), threads.counting("switchback"):
        started = time.perf_counter()
        model.train(1, dataset, callbacks=[gate, periods], dataset_sink_mode=False)
        wall = time.perf_counter() - started
    ends = periods.ends[: plan.steps]
    ratios = pair_ratios(plan, ends)
    means = mean_periods(plan, ends)
    on_steps = plan.arms.count(True) * plan.block
    sampled_on = on_steps // args.interval
    return {
        "plan": {"block": plan.block, "guard": plan.guard, "pairs": plan.pairs, "steps": plan.steps},
        "wall_s": wall,
        "ms_per_step_on": means[True] * 1e3,
        "ms_per_step_off": means[False] * 1e3,
        "per_step": _paired(ratios),
        "background CPU per sampled step by thread, us": {
            thread: seconds / sampled_on * 1e6 for thread, seconds in threads.runs["switchback"][-1].items()
        },
    }


class _ThreadCPU:
    """The CPU time of every Python thread that ends during a run, by thread name (numbers
    stripped): our pipeline worker and exporters start and end with the run, MindSpore's
    own threads do not, so this is our background work alone, without the bare run's noise."""

    def __init__(self) -> None:
        self.runs: dict[str, list[dict[str, float]]] = defaultdict(list)
        self._bucket: dict[str, float] | None = None
        real_run, outer = threading.Thread.run, self

        def run(thread: threading.Thread) -> None:
            try:
                real_run(thread)
            finally:
                if outer._bucket is not None:
                    name = thread.name.rstrip("0123456789-_ ") or "thread"
                    outer._bucket[name] = outer._bucket.get(name, 0.0) + time.thread_time()

        threading.Thread.run = run  # type: ignore[method-assign]

    @contextmanager
    def counting(self, name: str) -> Iterator[None]:
        self._bucket = {}
        try:
            yield
        finally:
            self.runs[name].append(self._bucket)
            self._bucket = None

    def per_step(self, name: str, steps: int) -> dict[str, float]:
        runs = self.runs[name]
        names = {thread for run in runs for thread in run}
        return {
            thread: statistics.median(run.get(thread, 0.0) for run in runs) / steps * 1e6 for thread in sorted(names)
        }


def _summarise(
    args: argparse.Namespace, walls: dict[str, list[float]], timed: dict[str, list[HookTimes]], first_edge: dict
) -> dict[str, Any]:
    result: dict[str, Any] = {"config": vars(args), "load_average": os.getloadavg()}
    bare = walls["bare"]
    result["bare_ms_per_step"] = statistics.median(bare) / args.steps * 1e3
    for name in ("ours", "ours timed", "bare callback timed"):
        ratios = [w / b for w, b in zip(walls[name], bare)]
        result[f"{name}: whole run"] = _paired(ratios)
    for name, runs in timed.items():
        hooks: dict[str, Any] = {}
        for hook in STEP_HOOKS:
            for kind in ("unsampled", "sampled"):
                plain = _rows(runs, hook, kind, args.interval, with_readbacks=False)
                read = _rows(runs, hook, kind, args.interval, with_readbacks=True)
                if not plain:
                    continue
                wall = [r[0] * 1e6 for r in plain]
                readback = statistics.median(r[2] * 1e6 for r in read) if read else 0.0
                hooks[f"{hook} {kind}"] = {
                    "median_us": statistics.median(wall),
                    "p90_us": _percentile(wall, 90),
                    "cpu_median_us": statistics.median(r[1] * 1e6 for r in plain),
                    "readback_median_us": readback,
                    "host_median_us": statistics.median(wall) - readback,
                    "steps": len(plain),
                }
        run_walls = walls[name]
        step_seconds = [sum(sum(v[0] for v in r.steps[h].values()) for h in STEP_HOOKS) for r in runs]
        edge_seconds = [sum(r.edge.values()) for r in runs]
        # The steps alone: the whole run less train begin and end (the end's final flush
        # weighs on a short run; a long one amortises it).
        steps_only = [(w - e) / b for w, e, b in zip(run_walls, edge_seconds, walls["bare"])]
        result[f"{name}: whole run less begin/end"] = _paired(steps_only)
        hooks["share_in_step_hooks_pct"] = statistics.median(s / w * 100 for s, w in zip(step_seconds, run_walls))
        hooks["share_with_begin_end_pct"] = statistics.median(
            (s + e) / w * 100 for s, e, w in zip(step_seconds, edge_seconds, run_walls)
        )
        for edge in ("on_train_begin", "on_train_end"):
            hooks[f"{edge}_ms"] = statistics.median(r.edge[edge] * 1e3 for r in runs)
        result[f"{name}: hooks"] = hooks
    result["ours: first run"] = {
        f"{k}_ms": v * 1e3 for k, v in first_edge.items() if k in ("on_train_begin", "on_train_end")
    }
    return result


def report(result: dict[str, Any]) -> None:
    cfg = result["config"]
    print(
        f"\n{cfg['mode']} mode, {cfg['model']} model ({result['bare_ms_per_step']:.2f} ms/step bare), interval "
        f"{cfg['interval']}, outputs {cfg['outputs']}, {cfg['steps']} steps x {cfg['rounds']} rounds, "
        f"load average at end {' '.join(f'{v:.1f}' for v in result['load_average'])}"
    )
    ours, bare = result["ours timed: hooks"], result["bare callback timed: hooks"]
    print(
        "| hook, step kind | ours median / p90 | ours CPU | ours readbacks | ours host work | bare callback median / p90 |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    for key, row in ours.items():
        if not isinstance(row, dict):
            continue
        other = bare.get(key)
        floor = f"{other['median_us']:.1f} / {other['p90_us']:.1f} µs" if other else "—"
        if other and key.endswith("sampled") and not key.endswith("unsampled"):
            floor += f" (item() {other['median_us']:.1f})"
        print(
            f"| {key} | {row['median_us']:.1f} / {row['p90_us']:.1f} µs | {row['cpu_median_us']:.1f} µs | "
            f"{row['readback_median_us']:.1f} µs | {row['host_median_us']:.1f} µs | {floor} |"
        )
    print(
        f"share of the run in our step hooks {ours['share_in_step_hooks_pct']:.3f} % "
        f"(bare callback {bare['share_in_step_hooks_pct']:.3f} %); with begin/end {ours['share_with_begin_end_pct']:.3f} %"
    )
    first = result["ours: first run"]
    print(
        f"on_train_begin {ours['on_train_begin_ms']:.1f} ms warm ({first.get('on_train_begin_ms', float('nan')):.1f} ms "
        f"first run), on_train_end {ours['on_train_end_ms']:.1f} ms warm ({first.get('on_train_end_ms', float('nan')):.1f} ms first)"
    )
    print(
        f"background CPU (off the training thread, beyond bare's) per sampled step: "
        f"{result['ours: background CPU per sampled step, us']:.0f} µs; by thread (ours alone): "
        + ", ".join(
            f"{thread} {us:.0f} µs"
            for thread, us in sorted(
                result["ours: background CPU per sampled step by thread, us"].items(), key=lambda kv: -kv[1]
            )
            if us >= 1
        )
    )
    if "switchback" in result:
        _report_switchback(result)
    for name in ("ours", "ours timed", "ours timed: whole run less begin/end", "bare callback timed"):
        whole = result[name if name.endswith("begin/end") else f"{name}: whole run"]
        low, high = whole["ci95"]
        print(
            f"whole run {name.replace(': whole run', ',')} / bare: median of paired ratios {whole['median_ratio']:.4f}, 95 % bootstrap interval "
            f"[{low:.4f}, {high:.4f}] (±{(high - low) / 2 * 100:.2f} %), sign test p = {whole['sign_test_p']:.3g}"
        )


def _report_switchback(result: dict[str, Any]) -> None:
    sb, cfg = result["switchback"], result["config"]
    plan, per_step = sb["plan"], sb["per_step"]
    low, high = per_step["ci95"]
    edges = result["ours timed: hooks"]
    edge_ms = edges["on_train_begin_ms"] + edges["on_train_end_ms"]
    run_ms = cfg["steps"] * sb["ms_per_step_off"]
    print(
        f"switchback, one run of {plan['steps']} steps ({sb['wall_s']:.0f} s), {plan['pairs']} pairs of "
        f"{plan['block']}-step blocks, the first {plan['guard']} of each left out: step period "
        f"{sb['ms_per_step_on']:.3f} ms with ours, {sb['ms_per_step_off']:.3f} ms without; "
        f"per-step slowdown, median of paired block ratios {per_step['median_ratio']:.4f}, 95 % bootstrap "
        f"interval [{low:.4f}, {high:.4f}] (±{(high - low) / 2 * 100:.2f} %), sign test p = {per_step['sign_test_p']:.3g}; "
        f"with begin + end ({edge_ms:.1f} ms warm) a {cfg['steps']}-step run: "
        f"{per_step['median_ratio'] + edge_ms / run_ms:.4f}"
    )
    print(
        "  background CPU per sampled step with ours on (by thread): "
        + ", ".join(
            f"{thread} {us:.0f} µs"
            for thread, us in sorted(sb["background CPU per sampled step by thread, us"].items(), key=lambda kv: -kv[1])
            if us >= 1
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--door",
        choices=["model", "custom"],
        default="model",
        help="Model.train's callback, or a custom loop's run API",
    )
    parser.add_argument(
        "--mode",
        choices=["graph", "pynative", "jit"],
        help="model: graph (default) or pynative; custom: jit (default) or pynative",
    )
    parser.add_argument("--model", choices=sorted(HIDDEN), default="small")
    parser.add_argument("--interval", type=int, default=10)
    parser.add_argument("--outputs", choices=["local", "all"], default="local")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument(
        "--pairs", type=int, default=60, help="switchback block pairs in one long run after the rounds (0: none)"
    )
    parser.add_argument("--json", type=Path, help="write every figure here")
    args = parser.parse_args()
    args.mode = args.mode or ("graph" if args.door == "model" else "jit")
    if args.mode not in (("graph", "pynative") if args.door == "model" else ("jit", "pynative")):
        parser.error(f"--door {args.door} does not take --mode {args.mode}")
    if args.door == "custom":
        import _custom_loop

        print(f"load average at start: {' '.join(f'{v:.1f}' for v in os.getloadavg())}, {os.cpu_count()} CPUs")
        with tempfile.TemporaryDirectory() as folder:
            custom = _custom_loop.run(args, Path(folder), _paired)
        custom["load_average"] = os.getloadavg()
        _custom_loop.report(custom)
        if args.json:
            args.json.write_text(json.dumps(custom, indent=1, default=str))
        return
    print(f"load average at start: {' '.join(f'{v:.1f}' for v in os.getloadavg())}, {os.cpu_count()} CPUs")
    with tempfile.TemporaryDirectory() as folder, ExitStack() as stack:
        endpoint = stack.enter_context(ReceiverProcess()).grpc_endpoint if args.outputs == "all" else None
        result = run(args, Path(folder), endpoint)
    report(result)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1, default=str))


if __name__ == "__main__":
    main()
