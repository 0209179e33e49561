"""Heartbeat: every rank's last finished step and when it finished, as observable gauges.

The gauges' callbacks read the run's progress object on the metric reader's thread, so the
training thread pays nothing, and the values keep being exported while it is stuck: a
Prometheus rule (collector-config/rules/) compares ranks and names those that stopped first.
They are the run's sources on the meter's shared gauges (telemetry/observables.py): a later
run in the process reports its own progress, and a run that ended reports none.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol

from opentelemetry.metrics import CallbackOptions, Observation

from otel_mindformers.core.clock import WallClock
from otel_mindformers.names.diagnosis import PROGRESS_LAST_STEP_TIME, PROGRESS_STEP
from otel_mindformers.telemetry.observables import RunObservables


class Progress(Protocol):
    step: int  # last finished step
    last_step_end: float  # time.perf_counter() when it finished (or when training began)


class Heartbeat:
    """`mindformers.progress.step` and `mindformers.progress.last_step_time` for one rank."""

    def __init__(self, observables: RunObservables, progress: Progress, point_attributes: dict[str, Any]) -> None:
        self._progress = progress
        self._attributes = dict(point_attributes)
        self._clock = WallClock()
        observables.observe(PROGRESS_STEP, self._observe_step)
        observables.observe(PROGRESS_LAST_STEP_TIME, self._observe_time)

    @classmethod
    def start(cls, observables: RunObservables, progress: Progress, point_attributes: dict[str, Any]) -> Heartbeat:
        """Register the gauges' sources; until `observables` closes, every metric collection
        reads `progress`."""
        return cls(observables, progress, point_attributes)

    def _observe_step(self, _options: CallbackOptions) -> Iterator[Observation]:
        yield Observation(self._progress.step, self._attributes)

    def _observe_time(self, _options: CallbackOptions) -> Iterator[Observation]:
        yield Observation(self._clock.wall(self._progress.last_step_end), self._attributes)
