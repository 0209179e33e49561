"""The whole-run slowdown from one long `Model.train`, ours switched on and off in blocks.

Separate runs of the same model differ by far more than our cost: each run lands in a faster
or slower arrangement of MindSpore's threads on the cores (docs/performance.md, fifth round),
so paired runs need some 1,600 rounds for a 95 % interval of ±0.5 %. Inside one run that draw
is shared by both arms. A switchback design alternates them within the run: blocks of steps
with our callback's hooks called, blocks without, in pairs whose order a seeded coin decides.
Per pair, the ratio of the mean step period (one step end to the next, everything the
training thread and our background threads do in between) with ours over without; then the
median of the pairs' ratios, its 95 % percentile bootstrap and a sign test, as for rounds.

What it counts: every step hook, and our background threads' work while it overlaps the
blocks with ours on. The first `guard` steps of every block are left out, so a block's figure
is its steady state: the pipeline worker finishes the last batch of an "on" block within
about 0.1 s after the records stop (its wait for company ends after 0.1 s of quiet), inside
the next block's guard. Work on a timer of its own (the span exporter's 5 s schedule at low
rates, the metric reader) lands in either arm by the clock, so about half of it is counted;
`bench_overhead.py` reports those threads' CPU per step beside it. Not counted:
`on_train_begin` / `on_train_end`, reported per run.
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from mindspore.train import Callback


@dataclass
class SwitchbackPlan:
    """Blocks of `block` steps, the first `guard` of each left out; `pairs` pairs after a
    lead-in pair that warms both arms up; both multiples of the sampling interval, so every
    measured block holds the same sampled steps."""

    block: int
    guard: int
    pairs: int
    seed: int = 0
    arms: list[bool] = field(init=False)  # per block: ours on?

    def __post_init__(self) -> None:
        rng = random.Random(self.seed)
        self.arms = [True, False]  # the lead-in: ours' first sampled step builds its read plan
        for _ in range(self.pairs):
            first = rng.random() < 0.5
            self.arms += [first, not first]

    @property
    def steps(self) -> int:
        return len(self.arms) * self.block

    @classmethod
    def for_step_time(cls, step_seconds: float, interval: int, pairs: int, seed: int = 0) -> SwitchbackPlan:
        """Blocks of about 1.5 s (at least 20 sampled steps), a guard of about 0.2 s."""

        def steps_of(seconds: float, least: int) -> int:
            return max(least, round(seconds / step_seconds / interval)) * interval

        return cls(block=steps_of(1.5, 20), guard=steps_of(0.2, 1), pairs=pairs, seed=seed)


class Gate(Callback):
    """Calls `inner`'s step hooks while `on`; its train and epoch hooks always (the run's
    begin and end are ours in both arms, and counted apart)."""

    def __init__(self, inner: Callback) -> None:
        super().__init__()
        self.on = True
        self._step_begin = inner.on_train_step_begin
        self._step_end = inner.on_train_step_end
        for hook in ("on_train_begin", "on_train_epoch_begin", "on_train_epoch_end", "on_train_end"):
            setattr(self, hook, getattr(inner, hook))

    def on_train_step_begin(self, run_context: Any) -> None:
        if self.on:
            self._step_begin(run_context)

    def on_train_step_end(self, run_context: Any) -> None:
        if self.on:
            self._step_end(run_context)


class Periods(Callback):
    """Last in the callback list: each step end's time, and the gate set for the next block."""

    def __init__(self, gate: Gate, plan: SwitchbackPlan) -> None:
        super().__init__()
        self._gate, self._plan = gate, plan
        self.ends: list[float] = []
        self._clock: Callable[[], float] = time.perf_counter

    def on_train_begin(self, run_context: Any) -> None:
        self._gate.on = self._plan.arms[0]

    def on_train_step_end(self, run_context: Any) -> None:
        self.ends.append(self._clock())
        done = len(self.ends)
        if done % self._plan.block == 0 and done < self._plan.steps:
            self._gate.on = self._plan.arms[done // self._plan.block]


def _block_means(plan: SwitchbackPlan, ends: list[float]) -> list[float]:
    """Each block's mean step period over its measured steps (its guard left out), in seconds."""
    means = []
    for index in range(len(plan.arms)):
        first = index * plan.block + plan.guard
        last = (index + 1) * plan.block - 1
        means.append((ends[last] - ends[first - 1]) / (last - first + 1))
    return means


def pair_ratios(plan: SwitchbackPlan, ends: list[float]) -> list[float]:
    """Per measured pair: mean step period with ours / without, guards left out."""
    means = _block_means(plan, ends)
    ratios = []
    for pair in range(1, len(plan.arms) // 2):  # pair 0 is the lead-in
        a, b = 2 * pair, 2 * pair + 1
        on, off = (means[a], means[b]) if plan.arms[a] else (means[b], means[a])
        ratios.append(on / off)
    return ratios


def mean_periods(plan: SwitchbackPlan, ends: list[float]) -> dict[bool, float]:
    """The mean step period of each arm over its measured blocks (the lead-in left out), in seconds."""
    measured = list(zip(plan.arms, _block_means(plan, ends)))[2:]
    return {arm: statistics.fmean(mean for on, mean in measured if on is arm) for arm in (True, False)}
