"""Anomaly rules: each looks at one sampled StepRecord and returns a Finding or None.

Rules run on the pipeline's worker thread, once per sampled step, so each is a few comparisons; the baseline rules sort at
most `window` floats. Every "step" a rule counts (warm-up, window, streak) is a sampled step.
A rule returns a Finding (firing), None (checked, fine) or NO_DATA (nothing to judge: the
value is absent or NaN), so a NaN loss does not read as "loss spike resolved".
"""

from __future__ import annotations

import bisect
import dataclasses
import enum
import math
import statistics
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal, Protocol, Union

from otel_mindformers.alerts.alert import CRITICAL, WARNING, format_number
from otel_mindformers.config import AlertConfig
from otel_mindformers.core.step_record import StepRecord, loss_scaling_explains
from otel_mindformers.model_state.movement import GradNormMovement
from otel_mindformers.names import capture_names
from otel_mindformers.names import training as metrics

NONFINITE = "nonfinite"
LOSS_THRESHOLD = "loss_threshold"
GRAD_NORM_THRESHOLD = "grad_norm_threshold"
LOSS_SPIKE = "loss_spike"
GRAD_NORM_SPIKE = "grad_norm_spike"
OVERFLOW_STREAK = "overflow_streak"
STEP_TIME_REGRESSION = "step_time_regression"
STALL = "stall"
LOSS_SPIKE_SCORE = capture_names.RULE_LOSS_SPIKE_SCORE
CO_SPIKE = capture_names.RULE_CO_SPIKE
THROUGHPUT_DROP = capture_names.RULE_THROUGHPUT_DROP

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


class _NoData(enum.Enum):
    """The one NO_DATA value: an enum member, so `verdict is NO_DATA` narrows a Verdict."""

    NO_DATA = "NO_DATA"

    def __repr__(self) -> str:
        return "NO_DATA"

    __str__ = __repr__


NO_DATA: Final = _NoData.NO_DATA

Verdict = Union[Finding, None, Literal[_NoData.NO_DATA]]


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
        for metric in metrics.NONFINITE_WATCHED:
            value = _number(record, metric)
            if value is None or math.isfinite(value):
                continue
            if loss_scaling_explains(metric, record.values.get(metrics.OVERFLOW)):
                continue
            return Finding(metric, value, None, f"{metric} is {value}")
        return None


class ThresholdRule:
    """A value above a fixed limit (the monitor_config article's `loss_threshold`)."""

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
    """Step time more than `factor` times the run's own rolling median and more than
    `min_increase` seconds above it: on steps of a few ms, scheduler or GC jitter doubles a
    step without anything having regressed."""

    def __init__(self, factor: float, window: int, warmup: int, min_increase: float) -> None:
        super().__init__(STEP_TIME_REGRESSION, metrics.STEP_TIME, window, warmup)
        self._factor = factor
        self._min_increase_ms = min_increase * 1000.0

    def _judge(self, value: float, median: float) -> Finding | None:
        relative, absolute = self._factor * median, median + self._min_increase_ms
        limit = max(relative, absolute)
        if value <= limit:
            return None
        above = (
            f"{self._factor:g} x rolling median {format_number(median)} ms"
            if relative >= absolute
            else f"rolling median {format_number(median)} ms + {format_number(self._min_increase_ms)} ms"
        )
        return Finding(metrics.STEP_TIME, value, limit, f"step time {format_number(value)} ms > {above}")


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


class SpikeScoreRule:
    """OLMo 2's loss spike score: the share of the last `window` sampled losses that were
    more than `sigma` standard deviations above the mean of the `window` losses before them.

    The score is handed to `on_score` on every judged step (the gauge dashboards plot). The
    rule fires once when the score rises above `threshold`, stays quiet (NO_DATA: nothing
    new to judge) while it remains above, and resolves when it falls back. Mean and
    variance are running sums over the window: a few float operations per sampled step.
    """

    name = LOSS_SPIKE_SCORE
    severity = WARNING

    def __init__(
        self,
        sigma: float,
        window: int,
        warmup: int,
        threshold: float,
        on_score: Callable[[float], None] | None = None,
    ) -> None:
        self._sigma = sigma
        self._warmup = warmup
        self._threshold = threshold
        self._on_score = on_score
        self._values: deque[float] = deque(maxlen=window)
        self._flags: deque[bool] = deque(maxlen=window)
        self._sum = 0.0
        self._squares = 0.0
        self._outliers = 0
        self._above = False
        self.score: float | None = None

    def _push(self, value: float, outlier: bool | None) -> None:
        values = self._values
        if len(values) == values.maxlen:
            oldest = values[0]
            self._sum -= oldest
            self._squares -= oldest * oldest
        values.append(value)
        self._sum += value
        self._squares += value * value
        if outlier is not None:
            if len(self._flags) == self._flags.maxlen and self._flags[0]:
                self._outliers -= 1
            self._flags.append(outlier)
            self._outliers += outlier

    def check(self, record: StepRecord) -> Verdict:
        value = _number(record, metrics.LOSS)
        if value is None or not math.isfinite(value):
            return NO_DATA
        count = len(self._values)
        if count < self._warmup:
            self._push(value, None)
            return None
        mean = self._sum / count
        sigma = math.sqrt(max(self._squares / count - mean * mean, 0.0))
        limit = mean + self._sigma * sigma
        outlier = value > limit and value - mean > 1e-12 * abs(mean)
        self._push(value, outlier)
        self.score = score = self._outliers / len(self._flags)
        if self._on_score is not None:
            self._on_score(score)
        if score <= self._threshold:
            self._above = False
            return None
        if self._above:
            return NO_DATA  # still above: notified when it rose, resolved when it falls
        self._above = True
        return Finding(
            metrics.LOSS,
            score,
            self._threshold,
            f"loss spike score {score:.3g} > {self._threshold:g}: {self._outliers} of the last "
            f"{len(self._flags)} sampled losses were more than {self._sigma:g} sigma above their rolling "
            f"mean (latest loss {format_number(value)}, mean {format_number(mean)}, limit {format_number(limit)})",
            {"training.loss": value},
        )


class CoSpikeRule:
    """Loss and grad norm both spiking, each against its own rolling baseline, within
    `within` sampled steps of each other; one finding per co-spike."""

    name = CO_SPIKE
    severity = WARNING

    def __init__(self, zscore: float, window: int, warmup: int, within: int) -> None:
        self._loss = SpikeRule(CO_SPIKE, metrics.LOSS, zscore, window, warmup)
        self._grad = SpikeRule(CO_SPIKE, metrics.GRAD_NORM, zscore, window, warmup)
        self._within = within
        self._index = 0
        self._last: dict[str, tuple[int, Finding]] = {}

    def check(self, record: StepRecord) -> Verdict:
        verdicts = {metrics.LOSS: self._loss.check(record), metrics.GRAD_NORM: self._grad.check(record)}
        if all(v is NO_DATA for v in verdicts.values()):
            return NO_DATA
        self._index += 1
        fresh = False
        for metric, verdict in verdicts.items():
            if isinstance(verdict, Finding):
                self._last[metric] = (self._index, verdict)
                fresh = True
        loss, grad = self._last.get(metrics.LOSS), self._last.get(metrics.GRAD_NORM)
        if not (fresh and loss and grad and abs(loss[0] - grad[0]) <= self._within):
            return None
        self._last.clear()  # one co-spike, one finding
        return Finding(
            metrics.LOSS,
            loss[1].value,
            loss[1].threshold,
            f"loss and grad norm spiked together: {loss[1].detail}; {grad[1].detail}",
            {"training.grad_norm": grad[1].value or 0.0, "training.grad_norm.limit": grad[1].threshold or 0.0},
        )


class ThroughputDropRule:
    """`metric` (samples / tokens per second, MFU) more than `drop` below the run's own
    baseline: the median of its first `baseline` values once `warmup` values were skipped."""

    name = THROUGHPUT_DROP
    severity = WARNING

    def __init__(self, metric: str, drop: float, baseline: int, warmup: int) -> None:
        self._metric = metric
        self._drop = drop
        self._size = baseline
        self._skip = warmup
        self._collected: list[float] = []
        self._baseline: float | None = None

    def check(self, record: StepRecord) -> Verdict:
        value = _number(record, self._metric)
        if value is None or not math.isfinite(value):
            return NO_DATA
        if self._baseline is None:
            if self._skip > 0:
                self._skip -= 1
            else:
                self._collected.append(value)
                if len(self._collected) == self._size:
                    self._baseline = statistics.median(self._collected)
            return None
        limit = (1.0 - self._drop) * self._baseline
        if value >= limit:
            return None
        return Finding(
            self._metric,
            value,
            limit,
            f"{self._metric} {format_number(value)} is {100 * (1 - value / self._baseline):.0f}% below the "
            f"run's baseline {format_number(self._baseline)} (limit {format_number(limit)}, drop {self._drop:g})",
        )


def build_rules(config: AlertConfig, on_spike_score: Callable[[float], None] | None = None) -> list[Rule]:
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
        rules.append(
            StepTimeRegressionRule(regression.factor, regression.window, regression.warmup, regression.min_increase)
        )
    score = config.loss_spike_score
    if score.enable:
        rules.append(SpikeScoreRule(score.sigma, score.window, score.warmup, score.threshold, on_spike_score))
    co_spike = config.co_spike
    if co_spike.enable:
        rules.append(CoSpikeRule(co_spike.zscore, co_spike.window, co_spike.warmup, co_spike.within))
    drop = config.throughput_drop
    if drop.enable:
        rules.append(ThroughputDropRule(drop.metric, drop.drop, drop.baseline, drop.warmup))
    return rules
