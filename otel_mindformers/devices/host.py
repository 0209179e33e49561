"""Host readings through psutil: this rank's process always, the node once per node."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

import psutil

from otel_mindformers.devices.source import MIB, AttributeValue, Point, Readings
from otel_mindformers.names import semconv

# psutil's CPU percentages compare CPU time with the previous call. Over a few
# milliseconds (a poll right after start) clock-tick rounding turns that into nonsense
# (2045 % on two cores): a CPU reading needs at least this much wall time behind it.
CPU_WINDOW_S = 0.5


def _node_cpu_seconds() -> tuple[float, float]:
    """(busy, total) CPU seconds of the node, counted as `psutil.cpu_percent` counts them.

    Our own baseline, not `psutil.cpu_percent(None)`'s: psutil 7 keeps that one per calling
    thread, and the source is built on the training thread but read on the poller's, so
    every first window read as 0 %."""
    times = psutil.cpu_times()
    # Linux counts guest time inside user and nice too.
    total = sum(times) - getattr(times, "guest", 0.0) - getattr(times, "guest_nice", 0.0)
    return total - times.idle - getattr(times, "iowait", 0.0), total


class HostSource:
    """`node_attributes` is None on every rank but one per node, so the node's CPU and
    memory series are not reported once per rank; `process_attributes` is None where this
    process is not the one to watch (the `devices` command).

    CPU use is measured over windows of at least CPU_WINDOW_S: a poll sooner than that
    after the previous measurement repeats it, and before the first window has passed
    there is no CPU reading at all.
    """

    name = "psutil"

    def __init__(
        self,
        process_attributes: Mapping[str, AttributeValue] | None,
        node_attributes: Mapping[str, AttributeValue] | None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._clock = clock
        self._process = psutil.Process()
        self._process_attributes = None if process_attributes is None else dict(process_attributes)
        self._node_attributes = None if node_attributes is None else dict(node_attributes)
        try:
            self._cpus = len(self._process.cpu_affinity()) or 1
        except AttributeError:  # platforms without CPU affinity
            self._cpus = psutil.cpu_count() or 1
        # Start the first window: psutil's first call only records the CPU times.
        self._process.cpu_percent(None)
        self._node_seconds = _node_cpu_seconds()
        self._window_start = self._clock()
        self._cpu: tuple[float, float] | None = None  # (process %, node %) of the last window

    def read(self) -> Readings:
        if self._clock() - self._window_start >= CPU_WINDOW_S:
            # 100 per fully busy core for the process; 0..100 across all cores for the node.
            self._cpu = (self._process.cpu_percent(None), self._node_cpu_percent())
            self._window_start = self._clock()
        rss = self._process.memory_info().rss
        memory = psutil.virtual_memory()
        points = []
        snapshot = {"host_rss_mb": rss / MIB, "host_memory_percent": memory.percent}
        if self._cpu is not None:
            process_cpu, node_cpu = self._cpu
            snapshot.update(process_cpu_percent=process_cpu, host_cpu_percent=node_cpu)
        if self._process_attributes is not None:
            points.append(Point(semconv.PROCESS_MEMORY_USAGE, float(rss), self._process_attributes, "psutil"))
            if self._cpu is not None:
                points.append(
                    Point(
                        semconv.PROCESS_CPU_UTILIZATION,
                        self._cpu[0] / 100.0 / self._cpus,
                        self._process_attributes,
                        "psutil",
                    )
                )
        if self._node_attributes is not None:
            points += [
                Point(
                    semconv.SYSTEM_MEMORY_USAGE,
                    float(memory.used),
                    {**self._node_attributes, semconv.ATTR_SYSTEM_MEMORY_STATE: "used"},
                    "psutil",
                ),
                Point(semconv.SYSTEM_MEMORY_LIMIT, float(memory.total), self._node_attributes, "psutil"),
            ]
            if self._cpu is not None:
                points.append(
                    Point(semconv.SYSTEM_CPU_UTILIZATION, self._cpu[1] / 100.0, self._node_attributes, "psutil")
                )
        return Readings(tuple(points), snapshot)

    def _node_cpu_percent(self) -> float:
        (busy_before, total_before), self._node_seconds = self._node_seconds, _node_cpu_seconds()
        busy, total = self._node_seconds
        if total <= total_before:
            return 0.0
        return min(100.0, max(0.0, 100.0 * (busy - busy_before) / (total - total_before)))

    def close(self) -> None:
        """Nothing is held between polls."""
