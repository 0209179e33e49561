"""StepRecord: what one sampled training step produced, on the host, ready for every sink."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from otel_mindformers import semconv

# Metric names accepted in `monitored_metrics`, as the JSON keys are spelled.
LOSS = "loss"
LEARNING_RATE = "learning_rate"
GRAD_NORM = "grad_norm"
STEP_TIME = "train_per_step_time"
OVERFLOW = "overflow"
LOSS_SCALE = "loss_scale"
SAMPLES_PER_SECOND = "samples_per_second"
TOKENS_PER_SECOND = "tokens_per_second"

KNOWN_METRICS: tuple[str, ...] = (
    LOSS,
    LEARNING_RATE,
    GRAD_NORM,
    STEP_TIME,
    OVERFLOW,
    LOSS_SCALE,
    SAMPLES_PER_SECOND,
    TOKENS_PER_SECOND,
)
_ORDER = {name: index for index, name in enumerate(KNOWN_METRICS)}

# Metrics that need a readback of the step's outputs (the rest are host clocks/counters).
DEVICE_METRICS = frozenset({LOSS, LEARNING_RATE, GRAD_NORM, OVERFLOW, LOSS_SCALE})


@dataclass
class StepRecord:
    """One sampled step. `values` maps metric name → value (float, or bool for overflow).

    `train_per_step_time` is in milliseconds, as MindFormers' own logs print it; the OTel
    step-duration histogram is in seconds, as OTel units require.
    """

    step: int
    epoch: int
    rank: int
    time_stamp: float
    steps_in_window: int = 1
    values: dict[str, float | bool] = field(default_factory=dict)
    device: dict[str, float] = field(default_factory=dict)
    is_last: bool = False
    alerts: list[str] = field(default_factory=list)  # rules that fired on this step

    def ordered_values(self) -> list[tuple[str, float | bool]]:
        """Values in the stable KNOWN_METRICS order (loss first), for lines people read."""
        return sorted(self.values.items(), key=lambda item: _ORDER.get(item[0], len(_ORDER)))

    def nonfinite(self) -> list[str]:
        """Names of the values that are NaN or ±Inf, in the stable KNOWN_METRICS order."""
        return [
            name
            for name, value in self.ordered_values()
            if isinstance(value, float) and not math.isfinite(value)
        ]

    def span_attributes(self) -> dict[str, object]:
        """Step-span attributes: `training.<metric>` per finite value (the live callback and
        `otel-mindformers replay` both use this)."""
        attrs: dict[str, object] = {
            semconv.ATTR_STEP: self.step,
            semconv.ATTR_EPOCH: self.epoch,
            semconv.ATTR_STEPS_IN_WINDOW: self.steps_in_window,
        }
        bad = self.nonfinite()
        for name, value in self.values.items():
            if name not in bad:
                attrs[f"training.{name}"] = value
        return attrs

    def to_json_dict(self) -> dict[str, object]:
        """The strict-JSON line: NaN/Inf become null and are listed under "nonfinite"."""
        line: dict[str, object] = {
            "time_stamp": round(self.time_stamp, 6),
            "step": self.step,
            "epoch": self.epoch,
            "rank": self.rank,
        }
        bad = self.nonfinite()
        for name, value in self.ordered_values():
            line[name] = None if name in bad else value
        line.update(self.device)
        if bad:
            line["nonfinite"] = bad
        if self.alerts:
            line["alerts"] = list(self.alerts)
        return line
