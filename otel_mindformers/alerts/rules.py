"""Anomaly rules: each looks at one sampled StepRecord and returns a Finding or None.

Rules run on the training thread, so each is a few comparisons; the baseline rules sort at
most `window` floats. Every "step" a rule counts (warm-up, window, streak) is a sampled step.
A rule returns a Finding (firing), None (checked, fine) or NO_DATA (nothing to judge: the
value is absent or NaN), so a NaN loss does not read as "loss spike resolved".
"""

from __future__ import annotations

import bisect
import dataclasses
import math
import statistics
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, Union

from otel_mindformers.alerts.alert import CRITICAL, WARNING, format_number
from otel_mindformers.config import AlertConfig
from otel_mindformers.core.record import StepRecord, loss_scaling_explains
from otel_mindformers.model_state.movement import GradNormMovement
from otel_mindformers.names import training as metrics

NONFINITE = "nonfinite"
LOSS_THRESHOLD = "loss_threshold"
GRAD_NORM_THRESHOLD = "grad_norm_threshold"
LOSS_SPIKE = "loss_spike"
GRAD_NORM_SPIKE = "grad_norm_spike"
OVERFLOW_STREAK = "overflow_streak"
STEP_TIME_REGRESSION = "step_time_regression"
STALL = "stall"

# MAD × 1.4826 estimates the standard deviation of normally distributed values.
MAD_TO_SIGMA = 1.4826
# A flat baseline has MAD 0 and would make every wiggle a spike: the robust sigma is taken
# to be at least this fraction of the median.
MIN_RELATIVE_SIGMA = 0.05


@dataclass(frozen=True)
class Finding:
    """What a rule saw: the metric, its value, the limit it crossed, and a sentence."""

    metric: str
    value: float | None
    threshold: float | None
    detail: str
    # Extra span-event attributes (the grad-norm spike names the layer and parameter).
    attributes: Mapping[str, Any] = field(default_factory=dict)


class _NoData:
    def __repr__(self) -> str:
        return "NO_DATA"


NO_DATA = _NoData()

Verdict = Union[Finding, None, _NoData]


class Rule(Protocol):
    name: str
    severity: str

    def check(self, record: StepRecord) -> Verdict: ...


def _number(record: StepRecord, metric: str) -> float | None:
    value = record.values.get(metric)
    if value is None or isinstance(value, bool):
        return None
    return float(value)


class RollingBaseline:
    """Median and median absolute deviation of the last `window` finite values.

    Both are robust: the spike being detected barely moves them, and a lasting level shift
    becomes the new baseline once it fills half the window. The values are also kept
    sorted, so the median costs nothing; the MAD is computed only when asked.
    """

    def __init__(self, window: int, warmup: int) -> None:
        self._arrivals: deque[float] = deque()
        self._sorted: list[float] = []
        self._window = window
        self._seen = 0
        self._warmup = warmup

    @property
    def ready(self) -> bool:
        return self._seen >= self._warmup

    def add(self, value: float) -> None:
        if len(self._arrivals) == self._window:
            oldest = self._arrivals.popleft()
            del self._sorted[bisect.bisect_left(self._sorted, oldest)]
        self._arrivals.append(value)
        bisect.insort(self._sorted, value)
        self._seen += 1

    def median(self) -> float:
        values, middle = self._sorted, len(self._sorted) // 2
        return values[middle] if len(values) % 2 else (values[middle - 1] + values[middle]) / 2

    def mad(self, median: float) -> float:
        return statistics.median([abs(v - median) for v in self._sorted])


class NonFiniteRule:
    """NaN/Inf loss or grad norm. An infinite grad norm on a step that reports overflow is
    loss scaling doing its job (the update was skipped), so only the streak rule sees it."""

    name = NONFINITE
    severity = CRITICAL

    def check(self, record: StepRecord) -> Finding | None:
        for metric in (metrics.LOSS, metrics.GRAD_NORM):
            value = _number(record, metric)
            if value is None or math.isfinite(value):
                continue
            if loss_scaling_explains(metric, record.values.get(metrics.OVERFLOW)):
                continue
            return Finding(metric, value, None, f"{metric} is {value}")
        return None


class ThresholdRule:
    """A value above a fixed limit (the article's `loss_threshold`)."""

    severity = WARNING

    def __init__(self, name: str, metric: str, limit: float) -> None:
        self.name = name
        self._metric = metric
        self._limit = limit

    def check(self, record: StepRecord) -> Verdict:
        value = _number(record, self._metric)
        if value is None or math.isnan(value):
            return NO_DATA
        if value <= self._limit:
            return None
        return Finding(
            self._metric,
            value,
            self._limit,
            f"{self._metric} {format_number(value)} > threshold {format_number(self._limit)}",
        )


class BaselineRule:
    """A finite value judged against the rolling baseline of the values before it, once the
    baseline is warm; the value then joins the baseline. Subclasses say what is anomalous."""

    severity = WARNING

    def __init__(self, name: str, metric: str, window: int, warmup: int) -> None:
        self.name = name
        self._metric = metric
        self._baseline = RollingBaseline(window, warmup)

    def check(self, record: StepRecord) -> Verdict:
        value = _number(record, self._metric)
        if value is None or not math.isfinite(value):
            return NO_DATA
        finding = self._judge(value, self._baseline.median()) if self._baseline.ready else None
        self._baseline.add(value)
        return finding

    def _judge(self, value: float, median: float) -> Finding | None:
        raise NotImplementedError


class SpikeRule(BaselineRule):
    """A value more than `zscore` robust standard deviations above its rolling median."""

    def __init__(self, name: str, metric: str, zscore: float, window: int, warmup: int) -> None:
        super().__init__(name, metric, window, warmup)
        self._zscore = zscore

    def _judge(self, value: float, median: float) -> Finding | None:
        limit = median + self._zscore * MIN_RELATIVE_SIGMA * abs(median)
        # Only a value above the smallest possible limit needs the (costlier) MAD.
        if value > limit:
            sigma = max(MAD_TO_SIGMA * self._baseline.mad(median), MIN_RELATIVE_SIGMA * abs(median))
            limit = median + self._zscore * sigma
        if value <= limit:
            return None
        return Finding(
            self._metric,
            value,
            limit,
            f"{self._metric} {format_number(value)} spiked above {format_number(limit)} "
            f"(rolling median {format_number(median)} + {self._zscore:g} robust sigma)",
        )


class GradNormSpikeRule(SpikeRule):
    """The grad-norm spike, naming the layer and the parameter whose gradient norm rose most
    since the previous sampled step (when the record carries per-layer norms)."""

    def __init__(self, zscore: float, window: int, warmup: int) -> None:
        super().__init__(GRAD_NORM_SPIKE, metrics.GRAD_NORM, zscore, window, warmup)
        self._movement = GradNormMovement()

    def check(self, record: StepRecord) -> Verdict:
        self._movement.update(record)
        finding = super().check(record)
        moved = self._movement.moved_most
        if isinstance(finding, Finding) and moved:
            finding = dataclasses.replace(
                finding, detail=f"{finding.detail}; {self._movement.describe()}", attributes=moved
            )
        return finding


class StepTimeRegressionRule(BaselineRule):
    """Step time more than `factor` times the run's own rolling median."""

    def __init__(self, factor: float, window: int, warmup: int) -> None:
        super().__init__(STEP_TIME_REGRESSION, metrics.STEP_TIME, window, warmup)
        self._factor = factor

    def _judge(self, value: float, median: float) -> Finding | None:
        limit = self._factor * median
        if value <= limit:
            return None
        return Finding(
            metrics.STEP_TIME,
            value,
            limit,
            f"step time {format_number(value)} ms > {self._factor:g} x rolling median {format_number(median)} ms",
        )


class OverflowStreakRule:
    """`length` consecutive sampled steps that overflowed: the loss scale is not recovering."""

    name = OVERFLOW_STREAK
    severity = WARNING

    def __init__(self, length: int) -> None:
        self._length = length
        self._streak = 0

    def check(self, record: StepRecord) -> Verdict:
        overflow = record.values.get(metrics.OVERFLOW)
        if overflow is None:
            return NO_DATA
        self._streak = self._streak + 1 if overflow else 0
        if self._streak < self._length:
            return None
        return Finding(
            metrics.OVERFLOW,
            float(self._streak),
            float(self._length),
            f"{self._streak} consecutive sampled steps overflowed",
        )


def build_rules(config: AlertConfig) -> list[Rule]:
    """The enabled rules, in the order their findings are reported."""
    rules: list[Rule] = []
    if config.nonfinite:
        rules.append(NonFiniteRule())
    if config.loss_threshold is not None:
        rules.append(ThresholdRule(LOSS_THRESHOLD, metrics.LOSS, config.loss_threshold))
    if config.grad_norm_threshold is not None:
        rules.append(ThresholdRule(GRAD_NORM_THRESHOLD, metrics.GRAD_NORM, config.grad_norm_threshold))
    if config.loss_spike.enable:
        spike = config.loss_spike
        rules.append(SpikeRule(LOSS_SPIKE, metrics.LOSS, spike.zscore, spike.window, spike.warmup))
    if config.grad_norm_spike.enable:
        spike = config.grad_norm_spike
        rules.append(GradNormSpikeRule(spike.zscore, spike.window, spike.warmup))
    if config.overflow_streak is not None:
        rules.append(OverflowStreakRule(config.overflow_streak))
    regression = config.step_time_regression
    if regression.enable:
        rules.append(StepTimeRegressionRule(regression.factor, regression.window, regression.warmup))
    return rules
