"""`ModelState`: one sampled step's readings from inside the model, raw on the training
thread, summarised once on the pipeline's worker thread.

The training thread only stores what it was handed (names and a host array, or floats
MindFormers already printed). `summary()` aggregates on first use, on the worker thread:
per layer and per kind (the L2 norm over their parameters: the square root of the sum of
squared norms), the max over parameters with its name, and the filtered per-parameter
values. The summary is what the JSON line stores, so a replayed line gives back exactly the
live measurements.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from otel_mindformers.model_state.parameters import KINDS, ParameterFilter, kind_of, layer_of
from otel_mindformers.names.model_state import (
    FAMILIES,
    SUMMARY_DEVICE_LOCAL_LOSS,
    SUMMARY_DROP_RATE,
    SUMMARY_EXPERT_LOAD,
    SUMMARY_EXPERT_LOAD_IMBALANCE,
    SUMMARY_LOCAL_LOSS,
)

Summary = dict[str, Any]

# Keys of the summary beside the families.


@dataclass
class FamilyReadings:
    """Per-parameter squared L2 norms, in the order of `names`."""

    names: Sequence[str]
    squares: Any  # 1-D array-like of the same length


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def summarise_family(readings: FamilyReadings, selection: ParameterFilter) -> Summary:
    import numpy as np  # the live path only (MindSpore brings numpy); the CLI reads summaries without it

    squares = np.asarray(readings.squares, dtype=np.float64).reshape(-1)
    names = list(readings.names)[: squares.size]
    by_layer: dict[str, float] = defaultdict(float)
    by_kind: dict[str, float] = defaultdict(float)
    for name, square in zip(names, squares.tolist()):
        layer = layer_of(name)
        if layer is not None:
            by_layer[layer] += square
        by_kind[kind_of(name)] += square
    summary: Summary = {
        "layer": {layer: _finite(math.sqrt(s)) for layer, s in sorted(by_layer.items(), key=lambda kv: int(kv[0]))},
        "kind": {kind: _finite(math.sqrt(by_kind[kind])) for kind in KINDS if kind in by_kind},
    }
    if names:
        top = int(np.nanargmax(squares)) if np.isfinite(squares).any() else 0
        top_name = names[top]
        summary["max"] = {"value": _finite(math.sqrt(squares[top])), "parameter": top_name, "layer": layer_of(top_name)}
    index = {name: i for i, name in enumerate(names)}
    chosen = selection.select(names)
    if chosen:
        summary["parameter"] = {name: _finite(math.sqrt(squares[index[name]])) for name in chosen}
    return summary


@dataclass
class ModelState:
    """Readings of one sampled step. Families map a family key (`grad_norm`, `adam_m_norm`,
    `adam_v_norm`) to per-parameter squared norms."""

    families: dict[str, FamilyReadings] = field(default_factory=dict)
    local_losses: list[float] = field(default_factory=list)
    device_local_losses: dict[str, float] = field(default_factory=dict)
    expert_loads: dict[str, list[float]] = field(default_factory=dict)
    drop_rates: dict[str, float] = field(default_factory=dict)
    selection: ParameterFilter = field(default_factory=lambda: ParameterFilter(None))
    _summary: Summary | None = None

    def __bool__(self) -> bool:
        return bool(
            self._summary
            or self.families
            or self.local_losses
            or self.device_local_losses
            or self.expert_loads
            or self.drop_rates
        )

    @classmethod
    def from_summary(cls, summary: Mapping[str, Any]) -> ModelState:
        """A state read back from a JSON line: its summary is the line's."""
        return cls(_summary=dict(summary))

    def summary(self) -> Summary:
        if self._summary is None:
            summary: Summary = {
                family.key: summarise_family(self.families[family.key], self.selection)
                for family in FAMILIES
                if family.key in self.families
            }
            if self.local_losses:
                summary[SUMMARY_LOCAL_LOSS] = [float(v) for v in self.local_losses]
            if self.device_local_losses:
                summary[SUMMARY_DEVICE_LOCAL_LOSS] = {k: _finite(float(v)) for k, v in self.device_local_losses.items()}
            if self.expert_loads:
                summary[SUMMARY_EXPERT_LOAD] = {
                    layer: [float(v) for v in loads] for layer, loads in self.expert_loads.items()
                }
                summary[SUMMARY_EXPERT_LOAD_IMBALANCE] = {
                    layer: _finite(max(loads) / (sum(loads) / len(loads)))
                    for layer, loads in self.expert_loads.items()
                    if loads and sum(loads) > 0
                }
            if self.drop_rates:
                summary[SUMMARY_DROP_RATE] = {layer: _finite(float(v)) for layer, v in self.drop_rates.items()}
            self._summary = summary
        return self._summary

    def scalars(self) -> list[tuple[str, float]]:
        """TensorBoard tags and values (MindFormers' own tag spelling for per-parameter ones:
        `adam_m_norm/<parameter>`)."""
        out: list[tuple[str, float]] = []
        summary = self.summary()
        for family in FAMILIES:
            part = summary.get(family.key)
            if not part:
                continue
            out += [(f"{family.key}/layer_{layer}", v) for layer, v in part["layer"].items()]
            out += [(f"{family.key}/kind_{kind}", v) for kind, v in part["kind"].items()]
            if "max" in part:
                out.append((f"{family.key}/max", part["max"]["value"]))
            out += [(f"{family.key}/{name}", v) for name, v in part.get("parameter", {}).items()]
        if summary.get(SUMMARY_LOCAL_LOSS):
            out.append((SUMMARY_LOCAL_LOSS, sum(summary[SUMMARY_LOCAL_LOSS]) / len(summary[SUMMARY_LOCAL_LOSS])))
        for key in (SUMMARY_DEVICE_LOCAL_LOSS, SUMMARY_EXPERT_LOAD_IMBALANCE, SUMMARY_DROP_RATE):
            out += [(f"{key}/{name}", v) for name, v in summary.get(key, {}).items()]
        return [(tag, v) for tag, v in out if v is not None]

    def stdout_parts(self) -> list[str]:
        """Aggregates only: per family the largest parameter norm and the layer with the
        largest norm; the worst MoE layer."""
        parts = []
        summary = self.summary()
        for family in FAMILIES:
            part = summary.get(family.key)
            if not part or "max" not in part:
                continue
            top = part["max"]
            text = f"{family.key}_max {_fmt(top['value'])} ({top['parameter']})"
            if part["layer"]:
                layer, value = max(part["layer"].items(), key=lambda kv: -1.0 if kv[1] is None else kv[1])
                text += f" top layer {layer} {_fmt(value)}"
            parts.append(text)
        for key in (SUMMARY_EXPERT_LOAD_IMBALANCE, SUMMARY_DROP_RATE):
            values = {k: v for k, v in summary.get(key, {}).items() if v is not None}
            if values:
                layer = max(values, key=values.__getitem__)
                parts.append(f"{key} max {values[layer]:.3g} (layer {layer})")
        return parts


def _fmt(value: float | None) -> str:
    return "nan" if value is None else f"{value:.4g}"
