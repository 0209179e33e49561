"""MonitorCallback's own cost on the training thread, per step, and its device readbacks.

    .venv/bin/python benchmarks/bench_hot_path.py [--steps 5000] [--interval 10]

Drives a real MonitorCallback (every output on: stdout, json_file, tensorboard, and OTLP to
a receiver in another process) through MindSpore's own RunContext / cb_params with real
tensors as `net_outputs`, in both shapes that matter: a scalar loss and MindFormers'
5-tuple. Reports, per shape:
- unsampled steps: time inside `on_train_step_begin` + `on_train_step_end` (target <= 1 us);
  by default the hooks run back to back (warm caches; the background threads compete for
  the GIL); `--device-step-ms 2` sleeps between them instead (the GIL released, as while
  MindSpore runs a compiled graph): the background threads work there, and the hooks run
  with cold caches, as inside a real training loop;
- sampled steps: time inside it, minus the time spent reading tensors back (`Tensor.asnumpy` / `Tensor._item`)
  (target <= 30 us);
- host readbacks (`Tensor.asnumpy` and `Tensor._item` calls made inside the hook) per unsampled and per
  sampled step (target: 0 on unsampled steps);
- the CPU the background threads (the sampled-step pipeline, the SDK's exporters) spend per
  sampled step: the process's CPU time minus the training thread's, over the whole run
  including the drain at train end;
- the slowdown that causes on the training thread: each step first runs `--step-work-us` of
  pure-Python work (the Python side of a training step, which needs the GIL the background
  threads hold while they encode); its total time with monitoring is compared with the
  same work without a callback.
stdout goes to a file in a temporary folder while the steps run, as under a job scheduler.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION", "python")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import mindspore as ms  # noqa: E402  (before anything imports protobuf)
import numpy as np  # noqa: E402
from _receiver import ReceiverProcess  # noqa: E402
from mindspore import nn  # noqa: E402
from mindspore.train.callback import RunContext, _InternalCallbackParam  # noqa: E402

from otel_mindformers.runtime.callback import MonitorCallback
from tests.support.readbacks import READS  # noqa: E402


class ReadbackSpy:
    """Counts and times the calls that read a tensor back (the tests' `READS`: `asnumpy`,
    and `_item`, through which `item()` reads) while `armed`."""

    def __init__(self) -> None:
        self.armed = False
        self.readbacks = 0
        self.to_host_seconds = 0.0
        self._originals = {name: getattr(ms.Tensor, name) for name in READS}

    def __enter__(self) -> ReadbackSpy:
        spy = self

        def counted(original):
            def read(tensor):
                if not spy.armed:
                    return original(tensor)
                spy.readbacks += 1
                started = time.perf_counter()
                try:
                    return original(tensor)
                finally:
                    spy.to_host_seconds += time.perf_counter() - started

            return read

        for name, original in self._originals.items():
            setattr(ms.Tensor, name, counted(original))
        return self

    def __exit__(self, *exc: object) -> None:
        for name, original in self._originals.items():
            setattr(ms.Tensor, name, original)


def _cb_params(shape: str, steps: int) -> _InternalCallbackParam:
    """What Model.train hands callbacks, built with MindSpore's own class and real tensors."""
    net = nn.Dense(8, 1)
    optimizer = nn.Momentum(net.trainable_params(), learning_rate=0.01, momentum=0.9)
    params = _InternalCallbackParam()
    params.batch_num = steps
    params.epoch_num = 1
    params.cur_epoch_num = 1
    params.cur_step_num = 0
    params.optimizer = optimizer
    params.train_network = nn.TrainOneStepCell(nn.WithLossCell(net, nn.MSELoss()), optimizer)
    params.train_dataset = None
    loss = ms.Tensor(np.array([2.5], np.float32))
    if shape == "scalar":
        params.net_outputs = loss
    else:
        params.net_outputs = (
            loss,
            ms.Tensor(False),
            ms.Parameter(ms.Tensor(1024.0, ms.float32), name="scale"),
            ms.Tensor(np.float32(1e-4)),
            ms.Tensor(np.array([0.7], np.float32)),
        )
    return params


ALL_OUTPUTS = ("stdout", "json_file", "tensorboard", "otlp")


def python_work(microseconds: float) -> Callable[[], None]:
    """A pure-Python busy loop taking about `microseconds` on this machine (calibrated once)."""

    def spin(n: int) -> None:
        total = 0
        for i in range(n):
            total += i

    started = time.perf_counter()
    spin(200_000)
    per_iteration = (time.perf_counter() - started) / 200_000
    iterations = max(1, int(microseconds * 1e-6 / per_iteration))
    return lambda: spin(iterations)


def bare_work_seconds(steps: int, work: Callable[[], None]) -> float:
    """The same per-step work with no callback and no background threads."""
    started = time.perf_counter()
    for _ in range(steps):
        work()
    return time.perf_counter() - started


def measure(
    shape: str,
    steps: int,
    interval: int,
    endpoint: str,
    folder: Path,
    outputs: tuple[str, ...] = ALL_OUTPUTS,
    protocol: str = "grpc",
    work: Callable[[], None] = lambda: None,
    captures: bool = False,
) -> dict[str, float]:
    config = {
        "interval": interval,
        "output_type": list(outputs),
        "json_log_path": str(folder / f"{shape}.json"),
        "tensorboard_path": str(folder / f"tb_{shape}"),
        "otlp": {"endpoint": endpoint, "protocol": protocol},
    }
    if captures:  # watching for on-demand requests (docs/captures.md), none made
        config["alert_config"] = {"capture": {"on_demand": True, "path": str(folder / "captures")}}
    callback = MonitorCallback(config)
    params = _cb_params(shape, steps)
    run_context = RunContext(params)
    unsampled: list[float] = []
    sampled: list[float] = []
    readbacks = {"unsampled": 0, "sampled": 0}
    with ReadbackSpy() as spy, open(folder / "stdout.log", "w") as log, contextlib.redirect_stdout(log):
        process_cpu0, thread_cpu0 = time.process_time(), time.thread_time()
        callback.on_train_begin(run_context)
        callback.on_train_epoch_begin(run_context)
        work_seconds = 0.0
        for step in range(1, steps + 1):
            params.cur_step_num = step
            # Both hooks the callback runs per step: the step-begin one (the data wait's clock
            # read and addition) and the step-end one.
            started = time.perf_counter()
            callback.on_train_step_begin(run_context)
            begin_elapsed = time.perf_counter() - started
            work_started = time.perf_counter()
            work()
            work_seconds += time.perf_counter() - work_started
            is_sampled = step == 1 or step % interval == 0 or step == steps
            spy.armed, spy.readbacks, spy.to_host_seconds = True, 0, 0.0
            started = time.perf_counter()
            callback.on_train_step_end(run_context)
            elapsed = time.perf_counter() - started + begin_elapsed
            spy.armed = False
            if is_sampled:
                sampled.append(elapsed - spy.to_host_seconds)
                readbacks["sampled"] += spy.readbacks
            else:
                unsampled.append(elapsed)
                readbacks["unsampled"] += spy.readbacks
        callback.on_train_epoch_end(run_context)
        callback.on_train_end(run_context)
        background_cpu = (time.process_time() - process_cpu0) - (time.thread_time() - thread_cpu0)
    unsampled.sort()
    sampled.sort()
    return {
        "unsampled_median_us": statistics.median(unsampled) * 1e6,
        "unsampled_p99_us": unsampled[int(0.99 * (len(unsampled) - 1))] * 1e6,
        "sampled_median_us": statistics.median(sampled) * 1e6,
        "sampled_p99_us": sampled[int(0.99 * (len(sampled) - 1))] * 1e6,
        "readbacks_per_unsampled_step": readbacks["unsampled"] / len(unsampled),
        "readbacks_per_sampled_step": readbacks["sampled"] / len(sampled),
        "background_cpu_per_sampled_us": background_cpu / len(sampled) * 1e6,
        "work_seconds": work_seconds,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5000)
    parser.add_argument("--interval", type=int, default=10)
    parser.add_argument("--protocol", default="grpc", choices=["grpc", "http/protobuf", "http/json"])
    parser.add_argument(
        "--device-step-ms",
        type=float,
        default=0.0,
        help="GIL-free time per step between the hooks (a compiled graph running)",
    )
    parser.add_argument(
        "--step-work-us",
        type=float,
        default=2000.0,
        help="pure-Python work per step, to see the background threads' GIL cost",
    )
    parser.add_argument(
        "--outputs", default=",".join(ALL_OUTPUTS), help="comma-separated output_type list (default: all, with OTLP)"
    )
    parser.add_argument(
        "--captures", action="store_true", help="with alert_config.capture.on_demand on (no request made)"
    )
    args = parser.parse_args()
    outputs = tuple(filter(None, args.outputs.split(",")))
    ms.set_context(mode=ms.PYNATIVE_MODE)
    ms.set_device("CPU")
    print(
        f"MonitorCallback.on_train_step_begin + on_train_step_end, {args.steps} steps, interval {args.interval}, "
        f"device step {args.device_step_ms:g} ms, "
        f"outputs {', '.join(outputs)}, OTLP {args.protocol} (load average {os.getloadavg()[0]:.1f})"
    )
    print(
        f"{'net_outputs':12s} {'unsampled us':>20s} {'sampled us (no readback)':>26s} "
        f"{'readbacks/unsampled':>20s} {'readbacks/sampled':>18s} {'background CPU us/sampled':>26s} "
        f"{'step work slowdown':>19s}"
    )
    work = python_work(args.step_work_us)
    with ReceiverProcess() as receiver, tempfile.TemporaryDirectory() as folder:
        endpoint = receiver.grpc_endpoint if args.protocol == "grpc" else receiver.http_endpoint
        # A short run first, discarded: the exporters' and writers' first-use imports and
        # connections would otherwise land in the first shape's numbers.
        measure("scalar", 10 * args.interval, args.interval, endpoint, Path(folder), outputs, args.protocol)
        device_seconds = args.device_step_ms / 1000.0
        device_step = (lambda: time.sleep(device_seconds)) if device_seconds > 0 else (lambda: None)
        for shape in ("scalar", "tuple5"):
            r = measure(
                shape,
                args.steps,
                args.interval,
                endpoint,
                Path(folder),
                outputs,
                args.protocol,
                device_step,
                args.captures,
            )
            # A second pass for the slowdown: the work would inflate the hook times above
            # (the hook waits for the GIL too), so they are measured without it.
            with_work = measure(shape, args.steps, args.interval, endpoint, Path(folder), outputs, args.protocol, work)[
                "work_seconds"
            ]
            bare = bare_work_seconds(args.steps, work)
            print(
                f"{shape:12s} {r['unsampled_median_us']:8.2f} (p99 {r['unsampled_p99_us']:6.2f}) "
                f"{r['sampled_median_us']:12.1f} (p99 {r['sampled_p99_us']:7.1f}) "
                f"{r['readbacks_per_unsampled_step']:20.2f} {r['readbacks_per_sampled_step']:18.2f} "
                f"{r['background_cpu_per_sampled_us']:26.0f} {(with_work / bare - 1) * 100:18.2f}%"
            )


if __name__ == "__main__":
    main()
