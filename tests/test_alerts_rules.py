"""The anomaly rules on their own: what fires, what does not, and robust baselines."""

import math
import statistics

import pytest
from hypothesis import given
from hypothesis import strategies as st

from otel_mindformers.alerts import rules
from otel_mindformers.alerts.rules import NO_DATA, Finding
from otel_mindformers.config import AlertConfig, SpikeRuleConfig, StepTimeRuleConfig
from otel_mindformers.core.step_record import StepRecord


def rec(step, **values):
    return StepRecord(step=step, epoch=1, rank=0, time_stamp=0.0, values=values)


def feed(rule, key, series, start=1):
    return [rule.check(rec(start + i, **{key: v})) for i, v in enumerate(series)]


def test_nonfinite_loss_and_grad_norm():
    rule = rules.NonFiniteRule()
    nan_loss = rule.check(rec(1, loss=math.nan, grad_norm=1.0))
    assert isinstance(nan_loss, Finding) and nan_loss.metric == "loss" and "nan" in nan_loss.detail
    inf_norm = rule.check(rec(2, loss=1.0, grad_norm=math.inf))
    assert inf_norm.metric == "grad_norm" and "inf" in inf_norm.detail
    assert rule.check(rec(3, loss=1.0, grad_norm=2.0)) is None


def test_infinite_grad_norm_on_an_overflow_step_is_loss_scaling_not_an_anomaly():
    rule = rules.NonFiniteRule()
    assert rule.check(rec(1, loss=1.0, grad_norm=math.inf, overflow=True)) is None
    assert rule.check(rec(2, loss=math.nan, grad_norm=math.inf, overflow=True)).metric == "loss"


def test_threshold_fires_above_and_has_no_opinion_on_nan():
    rule = rules.ThresholdRule("loss_threshold", "loss", 8.0)
    assert rule.check(rec(1, loss=8.0)) is None
    finding = rule.check(rec(2, loss=9.5))
    assert (finding.value, finding.threshold) == (9.5, 8.0)
    assert "9.5" in finding.detail and "8" in finding.detail
    assert rule.check(rec(3, loss=math.nan)) is NO_DATA
    assert rule.check(rec(4, learning_rate=0.1)) is NO_DATA


def test_spike_fires_on_the_spike_only_after_warmup():
    rule = rules.SpikeRule("loss_spike", "loss", zscore=6.0, window=50, warmup=10)
    noisy = [2.0 + 0.05 * ((i * 7) % 5 - 2) for i in range(30)]
    verdicts = feed(rule, "loss", noisy[:20] + [9.0] + noisy[20:])
    fired = [i + 1 for i, v in enumerate(verdicts) if isinstance(v, Finding)]
    assert fired == [21]
    finding = verdicts[20]
    assert finding.value == 9.0 and 2.0 < finding.threshold < 9.0
    assert "median" in finding.detail


def test_the_value_after_the_warmup_values_is_the_first_judged():
    # "after `warmup` values" (docs/alerts.md): with warmup 3, the fourth value can fire.
    rule = rules.SpikeRule("loss_spike", "loss", zscore=6.0, window=10, warmup=3)
    verdicts = feed(rule, "loss", [1.0, 1.0, 1.0, 9.0])
    assert isinstance(verdicts[3], Finding)


def test_spike_during_warmup_is_not_reported():
    rule = rules.SpikeRule("loss_spike", "loss", zscore=6.0, window=50, warmup=10)
    verdicts = feed(rule, "loss", [2.0, 2.0, 50.0, 2.0])
    assert not any(isinstance(v, Finding) for v in verdicts)


def test_flat_baseline_tolerates_small_wiggles():
    rule = rules.SpikeRule("loss_spike", "loss", zscore=6.0, window=20, warmup=5)
    verdicts = feed(rule, "loss", [1.0] * 10 + [1.1, 0.9, 1.2])
    assert not any(isinstance(v, Finding) for v in verdicts)
    assert isinstance(rule.check(rec(14, loss=1.5)), Finding)


def test_lasting_level_shift_becomes_the_new_baseline():
    rule = rules.SpikeRule("loss_spike", "loss", zscore=6.0, window=10, warmup=5)
    verdicts = feed(rule, "loss", [1.0] * 10 + [5.0] * 12)
    fired = [i + 1 for i, v in enumerate(verdicts) if isinstance(v, Finding)]
    assert fired == [11, 12, 13, 14, 15]


@given(st.lists(st.floats(min_value=0.0, max_value=1e6), min_size=1, max_size=9))
def test_nothing_fires_before_warmup(values):
    rule = rules.SpikeRule("loss_spike", "loss", zscore=0.0, window=100, warmup=10)
    assert not any(isinstance(v, Finding) for v in feed(rule, "loss", values))


def test_nan_is_no_data_for_the_spike_rule_and_stays_out_of_the_baseline():
    rule = rules.SpikeRule("loss_spike", "loss", zscore=6.0, window=10, warmup=3)
    assert feed(rule, "loss", [1.0, math.nan, 1.0, math.inf])[1] is NO_DATA
    assert rule.check(rec(5, loss=1.0)) is None  # a baseline of three finite values is ready


def test_overflow_streak():
    rule = rules.OverflowStreakRule(3)
    verdicts = feed(rule, "overflow", [True, True, False, True, True, True, True])
    fired = [(i + 1, v.value) for i, v in enumerate(verdicts) if isinstance(v, Finding)]
    assert fired == [(6, 3.0), (7, 4.0)]
    assert rule.check(rec(8, loss=1.0)) is NO_DATA


def test_step_time_regression_against_own_median():
    rule = rules.StepTimeRegressionRule(factor=2.0, window=20, warmup=5, min_increase=0.05)  # the defaults' floor
    verdicts = feed(rule, "train_per_step_time", [100.0, 110.0, 95.0, 105.0, 100.0, 190.0, 260.0, 100.0])
    fired = [(i + 1, v.threshold) for i, v in enumerate(verdicts) if isinstance(v, Finding)]
    assert fired == [(7, 205.0)]  # 2 x median(100, 110, 95, 105, 100, 190)
    assert "ms" in verdicts[6].detail


def step_time_findings(series, min_increase):
    rule = rules.StepTimeRegressionRule(factor=2.0, window=20, warmup=5, min_increase=min_increase)
    return [v for v in feed(rule, "train_per_step_time", series) if isinstance(v, Finding)]


def test_step_time_regression_needs_a_rise_of_min_increase_too():
    """1 ms steps with a 4 ms one fired at the default factor: jitter, not a regression."""
    jitter = [1.0, 1.2, 0.9, 1.1, 1.0, 4.0, 1.0]
    assert step_time_findings(jitter, min_increase=0.05) == []
    (fired,) = step_time_findings(jitter, min_increase=0.0)  # the factor alone
    assert fired.value == 4.0 and fired.threshold == 2.0
    (fired,) = step_time_findings([1.0, 1.2, 0.9, 1.1, 1.0, 60.0], min_increase=0.05)
    assert fired.threshold == 51.0 and fired.detail == "step time 60 ms > rolling median 1 ms + 50 ms"


def test_build_rules_follows_the_config():
    everything = AlertConfig(enable_alert=True, loss_threshold=8.0, grad_norm_threshold=100.0)
    assert [r.name for r in rules.build_rules(everything)] == [
        "nonfinite",
        "loss_threshold",
        "grad_norm_threshold",
        "loss_spike",
        "grad_norm_spike",
        "overflow_streak",
        "step_time_regression",
    ]
    nothing = AlertConfig(
        nonfinite=False,
        loss_spike=SpikeRuleConfig(enable=False),
        grad_norm_spike=SpikeRuleConfig(enable=False),
        overflow_streak=None,
        step_time_regression=StepTimeRuleConfig(enable=False),
    )
    assert rules.build_rules(nothing) == []


@pytest.mark.parametrize("value", [True, False])
def test_overflow_flag_is_not_read_as_a_number(value):
    rule = rules.ThresholdRule("loss_threshold", "overflow", 0.5)
    assert rule.check(rec(1, overflow=value)) is NO_DATA


@given(
    st.lists(st.floats(min_value=-1e6, max_value=1e6), min_size=1, max_size=60),
    st.integers(min_value=3, max_value=12),
)
def test_rolling_baseline_matches_median_and_mad_of_the_window(values, window):
    baseline = rules.RollingBaseline(window, warmup=1)
    for value in values:
        baseline.add(value)
    last = values[-window:]
    median = statistics.median(last)
    assert baseline.median() == median
    assert baseline.mad(median) == statistics.median([abs(v - median) for v in last])
