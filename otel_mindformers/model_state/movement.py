"""Which layer and which parameter moved most between two sampled steps: named by the
grad-norm spike rule (alerts/rules.py) on its span event.

Live records carry every parameter's norm; a replayed one only its summary, so the layer
comes from the per-layer norms and the parameter from the per-parameter values when there
are any, else from the summary's largest parameter.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from otel_mindformers.core.step_record import StepRecord
from otel_mindformers.model_state.state import ModelState
from otel_mindformers.names.model_state import ATTR_LAYER, ATTR_PARAMETER, GRAD_NORM


def _largest_rise(now: dict[str, float], before: dict[str, float]) -> tuple[str, float] | None:
    rises = {
        name: value - before.get(name, 0.0) for name, value in now.items() if value is not None and math.isfinite(value)
    }
    if not rises:
        return None
    name = max(rises, key=rises.__getitem__)
    return name, rises[name]


class GradNormMovement:
    """Feed every sampled record (so "before" is the previous sample); `moved_most` then
    names what rose most since it."""

    def __init__(self) -> None:
        self._layers: dict[str, float] = {}
        self._parameters: dict[str, float] = {}
        self._moved: dict[str, Any] = {}

    def update(self, record: StepRecord) -> None:
        self._moved = {}
        state = record.model_state
        part = state.summary().get(GRAD_NORM) if state else None
        if state is None or not part:
            return
        layers = {k: v for k, v in part.get("layer", {}).items() if v is not None}
        raw = state.families.get(GRAD_NORM) if isinstance(state, ModelState) else None  # a replay has summaries only
        if raw is not None:
            norms = np.sqrt(np.asarray(raw.squares, dtype=np.float64).reshape(-1))
            parameters = dict(zip(raw.names, norms.tolist()))
        else:
            parameters = {k: v for k, v in part.get("parameter", {}).items() if v is not None}
        if self._layers or self._parameters:
            layer = _largest_rise(layers, self._layers)
            parameter = _largest_rise(parameters, self._parameters)
            if layer is not None:
                self._moved[ATTR_LAYER] = layer[0]
            if parameter is not None:
                self._moved[ATTR_PARAMETER] = parameter[0]
            elif part.get("max"):
                self._moved[ATTR_PARAMETER] = part["max"]["parameter"]
        self._layers, self._parameters = layers, parameters

    @property
    def moved_most(self) -> dict[str, Any]:
        return dict(self._moved)

    def describe(self) -> str:
        bits = []
        if ATTR_LAYER in self._moved:
            bits.append(f"layer {self._moved[ATTR_LAYER]}")
        if ATTR_PARAMETER in self._moved:
            bits.append(str(self._moved[ATTR_PARAMETER]))
        return "moved most: " + ", ".join(bits) if bits else ""
