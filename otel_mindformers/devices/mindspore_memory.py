"""This process's device memory as MindSpore's memory pool counts it."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from otel_mindformers.devices.source import MIB, AttributeValue, Point, Readings
from otel_mindformers.names import semconv

# memory_stats() key -> (metric, snapshot key)
_STATS = {
    "total_allocated_memory": (semconv.DEVICE_MEMORY_ALLOCATED, "device_memory_allocated_mb"),
    "total_reserved_memory": (semconv.DEVICE_MEMORY_RESERVED, "device_memory_reserved_mb"),
    "max_allocated_memory": (semconv.DEVICE_MEMORY_MAX_ALLOCATED, "device_memory_max_allocated_mb"),
    "max_reserved_memory": (semconv.DEVICE_MEMORY_MAX_RESERVED, "device_memory_max_reserved_mb"),
}


class MindSporeMemorySource:
    """`memory_stats` is `mindspore.runtime.memory_stats`: one call returns what
    `memory_allocated`, `memory_reserved` and the `max_*` functions each return.

    The CPU backend always reports zeros, and so does a pool not yet created: a pool that
    has never reserved anything is "no reading", and nothing is emitted for it.
    """

    name = "mindspore"

    def __init__(self, memory_stats: Callable[[], Mapping[str, Any]], attributes: Mapping[str, AttributeValue]) -> None:
        self._memory_stats = memory_stats
        self._attributes = dict(attributes)

    def read(self) -> Readings:
        stats = self._memory_stats()
        if not stats.get("max_reserved_memory") and not stats.get("total_reserved_memory"):
            return Readings()
        points, snapshot = [], {}
        for key, (metric, snapshot_key) in _STATS.items():
            value = stats.get(key)
            if isinstance(value, (int, float)):
                points.append(Point(metric, float(value), self._attributes, "mindspore.runtime.memory_stats"))
                snapshot[snapshot_key] = value / MIB
        return Readings(tuple(points), snapshot)

    def close(self) -> None:
        """Nothing is held between polls."""
