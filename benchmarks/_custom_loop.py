"""`bench_overhead.py --door custom`: what the run API costs a step of a real MindSpore custom
loop (the quick start's shape: `value_and_grad`, `optimizer(grads)`, a Python `for`), in
PyNative or with the step under `mindspore.jit`.

One process trains the benchmarks' MLP (_mlp.py) again and again in interleaved rounds; each
round runs, in a rotated order between two bare runs:
- `bare`: `with contextlib.nullcontext(): loss, grads = train_step(x, y)`, nothing logged;
- `ours`: `with run.step(step): loss, grads = train_step(x, y); run.log(loss=loss, grads=grads)`
  (the whole-run figure);
- `bare timed` / `ours timed`: the same, the loop's own calls timed apart from the train
  step: `nullcontext()` and its enter, then its exit; `run.step(n)` and its enter, then
  `run.log(...)` and the exit (perf_counter and thread_time). In odd rounds the gradient
  norm's call and every readback of the values are timed on their own too;
- `ours timed, jit norm`: `ours timed` with the norm called through `mindspore.jit`'s
  per-call wrapper, as before compat/mindspore_graph.py (the sampled step's end only);
- `handing over timed`: `bare timed` plus a call of a function with `run.log`'s signature that
  does nothing, `handed(loss=loss, grads=grads)`: what handing the step's values to any
  Python function costs there, the floor under `run.log`.

Reported: each part's median and p90 on unsampled and sampled steps, ours next to bare, the
difference on unsampled steps (the budget: 2 µs), the sampled step's end split into the
norm's call (its launch, and on a CPU its run), the readbacks and our host work (the budget:
60 µs besides the norm), the norm alone (the device idle before it), the calls' warm floor
(nothing between them), `start()` and `end()`,
and the whole run's slowdown (paired ratios, 95 % bootstrap interval, sign test).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import defaultdict
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import mindspore as ms
import numpy as np
from _mlp import BATCH, CLASSES, FEATURES, HIDDEN, Redirected, build_parts

WARMUP_STEPS = 20  # left out of the per-step figures (compile settling)
PARTS = ("enter", "exit")  # the loop's calls before the train step, and after it


def _sampled(step: int, interval: int) -> bool:
    return step == 1 or step % interval == 0


class _Timed:
    """Wall seconds of every call of a function while installed, summed until `take()`."""

    def __init__(self) -> None:
        self.seconds = 0.0

    def wrap(self, fn: Any) -> Any:
        clock = time.perf_counter

        def timed(*args: Any, **kwargs: Any) -> Any:
            started = clock()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds += clock() - started

        return timed

    def take(self) -> float:
        seconds, self.seconds = self.seconds, 0.0
        return seconds


class _Norm:
    """The norm graph the run API uses (runtime/logged_values.py), swapped while a run starts:
    timed, or called through `jit`'s wrapper."""

    def __init__(self) -> None:
        from otel_mindformers.compat import mindspore_graph
        from otel_mindformers.runtime import logged_values

        self._slots = logged_values._NORM_GRAPHS
        self.compiled = logged_values._global_norm_graph(False)
        self.through_jit = mindspore_graph._JitCall(self.compiled._fn)

    def use(self, norm: Any) -> None:
        self._slots[False] = norm


def _handed(
    loss: Any = None,
    grads: Any = None,
    grad_norm: Any = None,
    lr: Any = None,
    overflow: Any = None,
    loss_scale: Any = None,
    **scalars: Any,
) -> None:
    """`run.log`'s signature, doing nothing: the floor (`handing over timed`)."""


def _loop(args: argparse.Namespace) -> tuple[Any, Any, list[tuple[Any, Any]]]:
    net, loss_fn, optimizer = build_parts(HIDDEN[args.model])

    def forward(x: Any, y: Any) -> Any:
        return loss_fn(net(x), y)

    grad_fn = ms.value_and_grad(forward, None, optimizer.parameters)

    def train_step(x: Any, y: Any) -> Any:
        loss, grads = grad_fn(x, y)
        optimizer(grads)
        return loss, grads

    rng = np.random.default_rng(0)
    batches = [
        (
            ms.Tensor(rng.standard_normal((BATCH, FEATURES)).astype(np.float32)),
            ms.Tensor(rng.integers(0, CLASSES, BATCH).astype(np.int32)),
        )
        for _ in range(args.steps)
    ]
    return optimizer, ms.jit(train_step) if args.mode == "jit" else train_step, batches


def run(args: argparse.Namespace, folder: Path, paired: Callable[[list[float]], dict[str, Any]]) -> dict[str, Any]:
    """`paired`: bench_overhead.py's paired-ratio summary (median, bootstrap interval, sign test)."""
    import otel_mindformers
    from otel_mindformers.compat import mindspore_tensor

    ms.set_context(mode=ms.PYNATIVE_MODE)
    ms.set_device("CPU")
    optimizer, train_step, batches = _loop(args)
    log = folder / "training.log"
    norm = _Norm()
    norm_time, read_time = _Timed(), _Timed()
    plain_read = mindspore_tensor.read_scalar

    def config(run_folder: Path) -> dict[str, Any]:
        return {
            "interval": args.interval,
            "output_type": ["json_file", "tensorboard"],
            "json_log_path": str(run_folder / "train_metric.json"),
            "tensorboard_path": str(run_folder / "tensorboard"),
        }

    def bare() -> float:
        with Redirected(log):
            started = time.perf_counter()
            for x, y in batches:
                with nullcontext():
                    loss, grads = train_step(x, y)
            ms.runtime.synchronize()  # the device's work done: dispatch alone would be no step time
            return time.perf_counter() - started

    def ours(run_folder: Path) -> tuple[float, dict[str, float]]:
        with Redirected(log):
            started = time.perf_counter()
            run = otel_mindformers.start(config(run_folder), optimizer=optimizer, batch_size=BATCH)
            begun = time.perf_counter()
            for step, (x, y) in enumerate(batches, start=1):
                with run.step(step):
                    loss, grads = train_step(x, y)
                    run.log(loss=loss, grads=grads)
            ms.runtime.synchronize()
            ending = time.perf_counter()
            run.end()
            ended = time.perf_counter()
        return ended - started, {"start_ms": (begun - started) * 1e3, "end_ms": (ended - ending) * 1e3}

    def timed(run_folder: Path | None, hand_over: bool = False) -> dict[int, tuple[float, ...]]:
        """Per step: (wall, cpu) of each part, then the norm's and the readbacks' seconds (0
        unless `with_norm` timed them). No run: `nullcontext()`, and with `hand_over` the
        values handed to `_handed`."""
        clock, cpu = time.perf_counter, time.thread_time
        rows: dict[int, tuple[float, ...]] = {}
        run = None if run_folder is None else otel_mindformers.start(config(run_folder), optimizer=optimizer)
        with Redirected(log):
            for step, (x, y) in enumerate(batches, start=1):
                c0, t0 = cpu(), clock()
                scope = nullcontext() if run is None else run.step(step)
                scope.__enter__()
                t1, c1 = clock(), cpu()
                loss, grads = train_step(x, y)
                c2, t2 = cpu(), clock()
                if run is not None:
                    run.log(loss=loss, grads=grads)
                elif hand_over:
                    _handed(loss=loss, grads=grads)
                scope.__exit__(None, None, None)
                t3, c3 = clock(), cpu()
                rows[step] = (t1 - t0, c1 - c0, t3 - t2, c3 - c2, norm_time.take(), read_time.take())
            if run is not None:
                run.end()
        return rows

    def with_norm(selected: Any, split: bool, body: Any) -> Any:
        norm.use(norm_time.wrap(selected) if split else selected)
        mindspore_tensor.read_scalar = read_time.wrap(plain_read) if split else plain_read
        try:
            return body()
        finally:
            norm.use(norm.compiled)
            mindspore_tensor.read_scalar = plain_read
            norm_time.take(), read_time.take()

    bare()  # compile and warm up
    with_norm(norm.compiled, False, lambda: ours(folder / "warm"))
    walls: dict[str, list[float]] = defaultdict(list)
    edges: list[dict[str, float]] = []
    steps: dict[str, list[tuple[bool, dict[int, tuple[float, ...]]]]] = defaultdict(list)
    variants = ("ours timed", "bare timed", "ours", "ours timed, jit norm", "handing over timed")
    for round_ in range(args.rounds):
        shift = round_ % len(variants)
        order = ["bare", *variants[shift:], *variants[:shift], "bare"]
        split = bool(round_ % 2)
        bare_walls = []
        for n, name in enumerate(order):
            run_folder = folder / f"r{round_}_{n}"
            if name == "bare":
                bare_walls.append(bare())
            elif name == "ours":
                wall, edge = with_norm(norm.compiled, False, lambda run_folder=run_folder: ours(run_folder))
                walls[name].append(wall)
                edges.append(edge)
            elif name == "bare timed":
                steps[name].append((split, timed(None)))
            elif name == "handing over timed":
                steps[name].append((split, timed(None, hand_over=True)))
            else:
                selected = norm.through_jit if name.endswith("jit norm") else norm.compiled
                rows = with_norm(selected, split, lambda run_folder=run_folder: timed(run_folder))
                steps[name].append((split, rows))
        walls["bare"].append(statistics.fmean(bare_walls))
        print(f"  round {round_ + 1}/{args.rounds}: ours/bare {walls['ours'][-1] / walls['bare'][-1]:.4f}", flush=True)
    result = _summarise(args, walls, edges, steps, paired)
    result["norm alone, us"] = _norm_alone(norm, train_step, batches[0])
    result["warm floor, us"] = _warm_floor(folder)
    return result


def _warm_floor(folder: Path, steps: int = 100_000, repeats: int = 5) -> dict[str, float]:
    """An unsampled step's calls with nothing between them (no training: warm caches), per
    step: `with run.step(n): run.log(loss=, grads=)` and `with nullcontext(): pass`; the
    medians of `repeats` alternating loops of `steps`."""
    import otel_mindformers

    loss, grads = ms.Tensor(1.0), (ms.Tensor([1.0]),)
    config = {"interval": 10**9, "output_type": ["json_file"], "json_log_path": str(folder / "floor.json")}
    ours: list[float] = []
    bare: list[float] = []
    with otel_mindformers.start(config) as run:
        for repeat in range(repeats):
            first = 2 + repeat * steps  # after step 1, the first sampled
            started = time.perf_counter()
            for step in range(first, first + steps):
                with run.step(step):
                    run.log(loss=loss, grads=grads)
            ours.append((time.perf_counter() - started) / steps)
            started = time.perf_counter()
            for _ in range(steps):
                with nullcontext():
                    pass
            bare.append((time.perf_counter() - started) / steps)
    return {"ours": statistics.median(ours) * 1e6, "bare": statistics.median(bare) * 1e6}


def _norm_alone(norm: _Norm, train_step: Any, batch: tuple[Any, Any], repeats: int = 300) -> dict[str, float]:
    """The norm's own time, the device idle before it (`mindspore.runtime.synchronize`): its
    call and the readback of its value, compiled-phase and through `jit`'s wrapper, median
    over `repeats` alternating calls (on a CPU the call runs the graph)."""
    from otel_mindformers.compat import mindspore_tensor

    _, grads = train_step(*batch)
    times: dict[str, list[float]] = {"compiled phase": [], "jit wrapper": []}
    for _ in range(repeats):
        for name, graph in (("compiled phase", norm.compiled), ("jit wrapper", norm.through_jit)):
            ms.runtime.synchronize()
            started = time.perf_counter()
            mindspore_tensor.read_scalar(graph(grads))
            times[name].append(time.perf_counter() - started)
    return {name: statistics.median(values) * 1e6 for name, values in times.items()}


def _summarise(
    args: argparse.Namespace,
    walls: dict[str, list[float]],
    edges: list[dict[str, float]],
    steps: dict[str, list[tuple[bool, dict[int, tuple[float, ...]]]]],
    paired: Callable[[list[float]], dict[str, Any]],
) -> dict[str, Any]:
    result: dict[str, Any] = {"config": vars(args), "door": "custom"}
    result["bare_ms_per_step"] = statistics.median(walls["bare"]) / args.steps * 1e3
    result["ours: whole run"] = paired([o / b for o, b in zip(walls["ours"], walls["bare"])])
    result["ours: start_ms"] = statistics.median(e["start_ms"] for e in edges)
    result["ours: end_ms"] = statistics.median(e["end_ms"] for e in edges)
    for name, runs in steps.items():
        parts: dict[str, Any] = {}
        for kind in ("unsampled", "sampled"):
            chosen = [
                (split, row)
                for split, rows in runs
                for step, row in rows.items()
                if step > WARMUP_STEPS and _sampled(step, args.interval) == (kind == "sampled")
            ]
            plain = [row for split, row in chosen if not split]
            timed_apart = [row for split, row in chosen if split]
            for index, part in enumerate(PARTS):
                wall = [row[2 * index] * 1e6 for row in plain]
                parts[f"{part} {kind}"] = {
                    "median_us": statistics.median(wall),
                    "p90_us": float(np.percentile(wall, 90)),
                    "cpu_median_us": statistics.median(row[2 * index + 1] * 1e6 for row in plain),
                    "steps": len(plain),
                }
            total = [(row[0] + row[2]) * 1e6 for row in plain]
            parts[f"both {kind}"] = {"median_us": statistics.median(total), "p90_us": float(np.percentile(total, 90))}
            if kind == "sampled" and timed_apart and name.startswith("ours"):
                norm = [row[4] * 1e6 for row in timed_apart]
                reads = [row[5] * 1e6 for row in timed_apart]
                parts["sampled exit: norm call"] = statistics.median(norm)
                parts["sampled exit: readbacks"] = statistics.median(reads)
                parts["sampled exit: host work"] = statistics.median(
                    row[2] * 1e6 - n - r for row, n, r in zip(timed_apart, norm, reads)
                )
        result[f"{name}: parts"] = parts
    ours, bare = result["ours timed: parts"], result["bare timed: parts"]
    result["unsampled over bare, us"] = ours["both unsampled"]["median_us"] - bare["both unsampled"]["median_us"]
    handing = result["handing over timed: parts"]["both unsampled"]["median_us"]
    result["handing over, over bare, us"] = handing - bare["both unsampled"]["median_us"]
    return result


def report(result: dict[str, Any]) -> None:
    cfg = result["config"]
    print(
        f"\ncustom loop, {cfg['mode']}, {cfg['model']} model ({result['bare_ms_per_step']:.2f} ms/step bare), "
        f"interval {cfg['interval']}, json + TensorBoard, {cfg['steps']} steps x {cfg['rounds']} rounds"
    )
    print("| part, step kind | ours median / p90 | ours CPU | jit-wrapper norm median / p90 | bare median / p90 |")
    print("|---|---:|---:|---:|---:|")
    ours, jit_norm, bare = (result[f"{n}: parts"] for n in ("ours timed", "ours timed, jit norm", "bare timed"))
    for key, row in ours.items():
        if not isinstance(row, dict):
            continue
        cpu = f"{row['cpu_median_us']:.1f} µs" if "cpu_median_us" in row else "—"
        old, floor = jit_norm.get(key), bare.get(key)
        print(
            f"| {key} | {row['median_us']:.1f} / {row['p90_us']:.1f} µs | {cpu} | "
            + (f"{old['median_us']:.1f} / {old['p90_us']:.1f} µs" if old else "—")
            + " | "
            + (f"{floor['median_us']:.1f} / {floor['p90_us']:.1f} µs" if floor else "—")
            + " |"
        )
    print(f"unsampled step, ours over bare: {result['unsampled over bare, us']:.2f} µs (budget 2 µs)")
    print(
        "unsampled step, the floor: the values handed to a function that does nothing, over bare: "
        f"{result['handing over, over bare, us']:.2f} µs"
    )
    for name in ("ours timed", "ours timed, jit norm"):
        parts = result[f"{name}: parts"]
        if "sampled exit: norm call" in parts:
            print(
                f"{name}, sampled step's end: the norm's call {parts['sampled exit: norm call']:.1f} µs, readbacks "
                f"{parts['sampled exit: readbacks']:.1f} µs, our host work {parts['sampled exit: host work']:.1f} µs "
                "(budget 60 µs besides the norm)"
            )
    floor = result["warm floor, us"]
    print(
        f"warm floor (no training between the calls): ours {floor['ours']:.2f} µs, bare {floor['bare']:.2f} µs, "
        f"over bare {floor['ours'] - floor['bare']:.2f} µs per step"
    )
    alone = result["norm alone, us"]
    print(
        "the norm alone, the device idle before it (call + readback): "
        + ", ".join(f"{name} {us:.1f} µs" for name, us in alone.items())
    )
    whole = result["ours: whole run"]
    low, high = whole["ci95"]
    print(
        f"start() {result['ours: start_ms']:.1f} ms, end() {result['ours: end_ms']:.1f} ms (warm); whole run ours / bare: "
        f"median of paired ratios {whole['median_ratio']:.4f}, 95 % bootstrap interval [{low:.4f}, {high:.4f}], "
        f"sign test p = {whole['sign_test_p']:.3g}"
    )
