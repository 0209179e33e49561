"""Device telemetry costs on the training thread.

    .venv/bin/python benchmarks/bench_devices.py            # all parts
    .venv/bin/python benchmarks/bench_devices.py snapshot   # or some: snapshot | poll | training

`snapshot`: the only device work a sampled step does, `DeviceTelemetry.snapshot()`.
`poll`: what one poll costs off the training thread (wall, poll-thread CPU, tool CPU).
`training`: per-step time of real MindSpore training (interval 1, so every step is sampled
and takes a snapshot) with `device_monitor` off, on with the fake npu-smi and hccn_tool of
the tests first on PATH, on with both answering after 0.8 s per call, and on with both
hanging until the 1 s timeout kills them. The poll interval is 0.2 s, far busier than the
5 s default. The case order rotates between rounds so that drift on a shared machine shows
up as spread.
"""

from __future__ import annotations

import json
import logging
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION", "python")
REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from otel_mindformers.config import load_monitor_config  # noqa: E402
from otel_mindformers.devices import DeviceTelemetry  # noqa: E402
from otel_mindformers.devices.cache import ReadingCache  # noqa: E402
from otel_mindformers.devices.poller import Poller  # noqa: E402
from otel_mindformers.devices.selection import build_sources  # noqa: E402
from otel_mindformers.job.identity import Identity  # noqa: E402

FAKE_BIN = REPO / "tests" / "fixtures" / "bin"
IDENTITY = Identity(rank=0, world_size=1, local_rank=0, device_id=1, device_target="Ascend")


def _summary(samples_s: list[float], unit: float, name: str) -> str:
    ordered = sorted(samples_s)
    p90 = ordered[int(0.9 * (len(ordered) - 1))]
    return f"median {statistics.median(ordered) * unit:8.3f} {name}   p90 {p90 * unit:8.3f} {name}"


def _use_fake_tools(mode: str = "normal", delay: str = "") -> None:
    """The tests' fake npu-smi and hccn_tool first on PATH, both in `mode`."""
    if str(FAKE_BIN) not in os.environ["PATH"].split(os.pathsep):
        os.environ["PATH"] = f"{FAKE_BIN}{os.pathsep}{os.environ['PATH']}"
    os.environ["FAKE_NPU_SMI_MODE"] = os.environ["FAKE_HCCN_MODE"] = mode
    os.environ["FAKE_NPU_SMI_DELAY"] = os.environ["FAKE_HCCN_DELAY"] = delay


def bench_snapshot(calls: int = 100_000) -> None:
    _use_fake_tools()
    config = load_monitor_config({"device_monitor": True, "output_type": [], "device_config": {"poll_interval": 0.2}})
    telemetry = DeviceTelemetry.start(config.device_config, IDENTITY, None)
    while "npu_hbm_used_mb" not in telemetry.snapshot():
        time.sleep(0.01)
    samples = []
    for _ in range(calls):
        start = time.perf_counter()
        telemetry.snapshot()
        samples.append(time.perf_counter() - start)
    telemetry.shutdown()
    print(f"snapshot() on the training thread, {calls} calls, keys: {len(telemetry.snapshot())}:")
    print(f"  {_summary(samples, 1e6, 'us')}")


def bench_poll(polls: int = 50) -> None:
    """CPU one poll costs, on the poll thread and in the npu-smi processes it starts."""
    _use_fake_tools()
    config = load_monitor_config({"device_monitor": True, "device_config": {"sources": ["ascend", "host"]}})
    sources = build_sources(config.device_config, IDENTITY)
    poller = Poller(sources, ReadingCache(60.0), 60.0)
    print(f"one poll (fake npu-smi: 6 calls on the first poll, 5 after; fake hccn_tool: 4; psutil), {polls} polls:")
    wall, cpu, children = [], [], []
    for _ in range(polls):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start_wall, start_cpu = time.perf_counter(), time.thread_time()
        poller.poll_once()
        wall.append(time.perf_counter() - start_wall)
        cpu.append(time.thread_time() - start_cpu)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        children.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
    print(f"  wall                     {_summary(wall, 1e3, 'ms')}")
    print(f"  poll thread CPU          {_summary(cpu, 1e3, 'ms')}")
    print(f"  tool processes CPU       {_summary(children, 1e3, 'ms')}")


def bench_training(steps: int = 200, rounds: int = 5) -> None:
    from otel_mindformers.runtime.callback import MonitorCallback
    from tests.support.training import train

    logging.disable(logging.WARNING)
    cases = {
        "device_monitor off": None,
        "on, tools normal": ("normal", ""),
        "on, tools 0.8 s slow": ("normal", "0.8"),
        "on, every tool hangs": ("hang", ""),
    }
    os.environ["DEVICE_ID"] = "1"
    print(
        f"real training, {steps} steps, interval 1 (a snapshot every step), poll every 0.2 s, "
        f"tool timeout 1 s; per-step time from the JSON lines; {rounds} rounds, case order rotated:"
    )
    times: dict[str, list[float]] = {label: [] for label in cases}
    round_medians: dict[str, list[float]] = {label: [] for label in cases}
    with_npu: dict[str, int] = dict.fromkeys(cases, 0)
    labels = list(cases)
    with tempfile.TemporaryDirectory() as tmp:
        os.chdir(tmp)
        for round_ in range(rounds):
            for label in labels[round_ % len(labels) :] + labels[: round_ % len(labels)]:
                npu_smi = cases[label]
                if npu_smi is not None:
                    _use_fake_tools(*npu_smi)
                path = Path(tmp) / f"{round_}_{labels.index(label)}.json"
                callback = MonitorCallback(
                    {
                        "interval": 1,
                        "grad_monitor": False,
                        "output_type": ["json_file"],
                        "json_log_path": str(path),
                        "device_monitor": npu_smi is not None,
                        "device_config": {"poll_interval": 0.2, "command_timeout": 1.0},
                    }
                )
                train([callback], steps=steps)
                lines = [json.loads(line) for line in path.read_text().splitlines()][10:]
                step_times = [line["train_per_step_time"] / 1e3 for line in lines]
                times[label] += step_times
                round_medians[label].append(statistics.median(step_times))
                with_npu[label] += sum("npu_utilization" in line for line in lines)
    for label in cases:
        rounds_ms = " ".join(f"{m * 1e3:6.1f}" for m in round_medians[label])
        print(
            f"  {label:24s} {_summary(times[label], 1e3, 'ms')}   round medians {rounds_ms} ms"
            f"   steps with NPU readings {with_npu[label]}/{len(times[label])}"
        )


if __name__ == "__main__":
    parts = {"snapshot": bench_snapshot, "poll": bench_poll, "training": bench_training}
    for name in sys.argv[1:] or parts:
        parts[name]()
