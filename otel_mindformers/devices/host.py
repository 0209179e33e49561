"""Host readings through psutil: this rank's process always, the node once per node."""

from __future__ import annotations

from typing import Mapping

import psutil

from otel_mindformers import semconv
from otel_mindformers.devices.base import MIB, AttributeValue, Point, Readings


class HostSource:
    """`node_attributes` is None on every rank but one per node, so the node's CPU and
    memory series are not reported once per rank; `process_attributes` is None where this
    process is not the one to watch (the `devices` command)."""

    name = "psutil"

    def __init__(
        self,
        process_attributes: Mapping[str, AttributeValue] | None,
        node_attributes: Mapping[str, AttributeValue] | None,
    ) -> None:
        self._process = psutil.Process()
        self._process_attributes = None if process_attributes is None else dict(process_attributes)
        self._node_attributes = None if node_attributes is None else dict(node_attributes)
        try:
            self._cpus = len(self._process.cpu_affinity()) or 1
        except AttributeError:  # platforms without CPU affinity
            self._cpus = psutil.cpu_count() or 1
        # psutil's CPU percentages compare with the previous call; the first one says 0.0.
        self._process.cpu_percent(None)
        psutil.cpu_percent(None)

    def read(self) -> Readings:
        process_cpu = self._process.cpu_percent(None)  # 100 per fully busy core
        rss = self._process.memory_info().rss
        node_cpu = psutil.cpu_percent(None)  # 0..100 across all cores
        memory = psutil.virtual_memory()
        points = []
        if self._process_attributes is not None:
            cpu_fraction = process_cpu / 100.0 / self._cpus
            points += [
                Point(semconv.PROCESS_CPU_UTILIZATION, cpu_fraction, self._process_attributes),
                Point(semconv.PROCESS_MEMORY_USAGE, float(rss), self._process_attributes),
            ]
        if self._node_attributes is not None:
            points += [
                Point(semconv.SYSTEM_CPU_UTILIZATION, node_cpu / 100.0, self._node_attributes),
                Point(semconv.SYSTEM_MEMORY_USAGE, float(memory.used),
                      {**self._node_attributes, semconv.ATTR_SYSTEM_MEMORY_STATE: "used"}),
                Point(semconv.SYSTEM_MEMORY_LIMIT, float(memory.total), self._node_attributes),
            ]
        snapshot = {
            "host_rss_mb": rss / MIB,
            "process_cpu_percent": process_cpu,
            "host_cpu_percent": node_cpu,
            "host_memory_percent": memory.percent,
        }
        return Readings(tuple(points), snapshot)

    def close(self) -> None:
        """Nothing is held between polls."""
