"""`MetricSpec`: a metric's name, instrument kind, unit and description, as data."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class Kind(str, Enum):
    COUNTER = "counter"
    GAUGE = "gauge"
    HISTOGRAM = "histogram"
    OBSERVABLE_GAUGE = "observable_gauge"
    OBSERVABLE_COUNTER = "observable_counter"
    OBSERVABLE_UP_DOWN_COUNTER = "observable_up_down_counter"


@dataclass(frozen=True)
class MetricSpec:
    name: str
    kind: Kind
    unit: str
    description: str
