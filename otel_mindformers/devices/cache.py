"""The latest readings of every source, shared by the instruments and the local outputs.

Written by the poll thread, read by the metric reader's thread (observable callbacks) and
by the training thread (snapshots on sampled steps). Readers never wait for a poll: they
see the last completed one. Entries older than `max_age` are dropped, so a poll thread
stuck in a driver call shows up as missing data, not as a frozen value.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from otel_mindformers.devices.source import Point, Readings


class ReadingCache:
    def __init__(self, max_age: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._max_age = max_age
        self._clock = clock
        self._lock = threading.Lock()
        # source name -> (time read, points by metric, snapshot)
        self._entries: dict[str, tuple[float, dict[str, list[Point]], dict[str, float]]] = {}

    def put(self, source: str, readings: Readings) -> None:
        by_metric: dict[str, list[Point]] = {}
        for point in readings.points:
            by_metric.setdefault(point.metric, []).append(point)
        entry = (self._clock(), by_metric, dict(readings.snapshot))
        with self._lock:
            self._entries[source] = entry

    def drop(self, source: str) -> None:
        with self._lock:
            self._entries.pop(source, None)

    def points(self, metric: str) -> list[Point]:
        return [point for by_metric, _ in self._fresh() for point in by_metric.get(metric, ())]

    def snapshot(self) -> dict[str, float]:
        merged: dict[str, float] = {}
        for _, snapshot in self._fresh():
            merged.update(snapshot)
        return merged

    def _fresh(self) -> list[tuple[dict[str, list[Point]], dict[str, float]]]:
        oldest = self._clock() - self._max_age
        with self._lock:
            entries = list(self._entries.values())
        return [(by_metric, snapshot) for at, by_metric, snapshot in entries if at >= oldest]
