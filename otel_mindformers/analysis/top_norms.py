"""The run's largest norms, for `report` and `plot`: per layer and per parameter, the
largest value each reached and the step it was reached at, from the JSON lines' summaries
(a `logs.StepPoint.model_state`). Memory is one entry per layer and per named parameter."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from otel_mindformers.names.model_state import GRAD_NORM

TOP_K = 5


@dataclass
class Peak:
    name: str
    value: float
    step: int


class TopNorms:
    """Peaks of one family (the gradient norm by default) over a run."""

    def __init__(self, family: str = GRAD_NORM) -> None:
        self.family = family
        self._layers: dict[str, Peak] = {}
        self._parameters: dict[str, Peak] = {}

    def add(self, step: int, summary: Mapping[str, Any] | None) -> None:
        part = (summary or {}).get(self.family)
        if not part:
            return
        for layer, value in part.get("layer", {}).items():
            _keep(self._layers, f"layer {layer}", value, step)
        top = part.get("max")
        if top:
            _keep(self._parameters, top["parameter"], top["value"], step)
        for name, value in part.get("parameter", {}).items():
            _keep(self._parameters, name, value, step)

    def layers(self, k: int = TOP_K) -> list[Peak]:
        return _largest(self._layers, k)

    def parameters(self, k: int = TOP_K) -> list[Peak]:
        return _largest(self._parameters, k)


def _keep(peaks: dict[str, Peak], name: str, value: Any, step: int) -> None:
    if isinstance(value, (int, float)) and (name not in peaks or value > peaks[name].value):
        peaks[name] = Peak(name, float(value), step)


def _largest(peaks: dict[str, Peak], k: int) -> list[Peak]:
    return sorted(peaks.values(), key=lambda p: p.value, reverse=True)[:k]
