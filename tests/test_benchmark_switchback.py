"""bench_overhead.py's switchback (benchmarks/_switchback.py), in a real `Model.train`: a
callback of known cost switched on and off in blocks must show as the ratio of the arms' step
periods, in the blocks where it ran, and the gate must call the hooks of the "on" blocks only."""

import sys
import time
from pathlib import Path

import mindspore as ms
import pytest
from mindspore.train import Callback

from tests.support import training

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
from _switchback import Gate, Periods, SwitchbackPlan, mean_periods, pair_ratios  # noqa: E402

pytestmark = pytest.mark.slow  # a real training run

COST = 0.005  # seconds of busy work per step: a few times the tiny graph-mode step here


class Costly(Callback):
    """Busy for COST at every step end; notes which steps it saw."""

    def __init__(self) -> None:
        super().__init__()
        self.steps: list[int] = []
        self.busy: list[float] = []  # each hook's wall time: COST, and more where it was preempted
        self.began = self.ended = 0

    def on_train_begin(self, run_context):
        self.began += 1

    def on_train_end(self, run_context):
        self.ended += 1

    def on_train_step_end(self, run_context):
        self.steps.append(run_context.original_args()["cur_step_num"])
        begin = time.perf_counter()
        while time.perf_counter() < begin + COST:
            pass
        self.busy.append(time.perf_counter() - begin)


def test_a_known_cost_shows_in_its_arm_and_only_there():
    plan = SwitchbackPlan(block=20, guard=4, pairs=6, seed=3)
    costly = Costly()
    gate = Gate(costly)
    periods = Periods(gate, plan)
    training.train([gate, periods], steps=plan.steps, mode=ms.GRAPH_MODE)

    on_steps = [
        step
        for index, arm in enumerate(plan.arms)
        if arm
        for step in range(index * plan.block + 1, (index + 1) * plan.block + 1)
    ]
    assert costly.steps == on_steps  # the hooks of "on" blocks, every one of them, and no other
    assert (costly.began, costly.ended) == (1, 1)  # begin and end whatever the arm
    assert plan.arms[:2] == [True, False] and sorted(plan.arms[2::2] + plan.arms[3::2]) == [False] * 6 + [True] * 6

    ratios = pair_ratios(plan, periods.ends)
    means = mean_periods(plan, periods.ends)
    assert len(ratios) == plan.pairs
    # Each pair's "on" block is slower by about the hook's time a step, whichever came first
    # in the pair: COST, more where a loaded machine preempted the busy hook. Counted twice
    # (or in the wrong blocks) it would be past twice that (or well under it).
    busy = sum(costly.busy) / len(costly.busy)
    extra = means[True] - means[False]
    assert 0.7 * busy < extra < 1.9 * busy, (busy, means, ratios)
    assert all(ratio > 1 for ratio in ratios), ratios


def test_blocks_hold_whole_sampling_intervals():
    plan = SwitchbackPlan.for_step_time(0.004, interval=10, pairs=3)
    assert plan.block % 10 == 0 and plan.guard % 10 == 0 and plan.guard < plan.block
    assert plan.steps == 8 * plan.block  # the lead-in pair and three measured
    assert SwitchbackPlan.for_step_time(0.5, interval=1, pairs=1).block == 20  # at least 20 sampled steps
