"""StepRecord: what one sampled training step produced, on the host, ready for every sink."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from otel_mindformers.names.training import GRAD_NORM, ORDER


class ModelStateReading(Protocol):
    """What a record and its outputs read of model_state/state.ModelState (a layer above)."""

    def __bool__(self) -> bool: ...
    def summary(self) -> dict[str, Any]: ...
    def scalars(self) -> list[tuple[str, float]]: ...
    def stdout_parts(self) -> list[str]: ...


def loss_scaling_explains(name: str, overflow: object) -> bool:
    """A non-finite grad norm on a step that reports overflow is fp16 loss scaling at work
    (the update was skipped, the scale goes down): not a fault. `overflow`: the step's
    value, a bool live or 1.0 read back from a JSON line. The one rule every judge of
    non-finite values applies (the alert rule, the first bad rank, report, hang-report)."""
    return name == GRAD_NORM and (overflow is True or (type(overflow) is float and overflow == 1.0))


def counted_nonfinite(names: Iterable[str], overflow: object) -> list[str]:
    """`names` (non-finite values of one step) less those loss scaling explains."""
    return [name for name in names if not loss_scaling_explains(name, overflow)]


# Key sets in the table's order: a run's records share one or two key sets, so each is
# sorted once, not on every call (several per record, on the pipeline's worker).
_ORDERED: dict[tuple[str, ...], tuple[str, ...]] = {}
_ORDERED_MAX = 256  # key sets kept (a replay of mixed logs may bring many)


def _table_order(keys: tuple[str, ...]) -> tuple[str, ...]:
    ordered = _ORDERED.get(keys)
    if ordered is None:
        if len(_ORDERED) >= _ORDERED_MAX:
            _ORDERED.clear()
        ordered = _ORDERED[keys] = tuple(sorted(keys, key=lambda key: ORDER.get(key, len(ORDER))))
    return ordered


# The JSON line's own keys (StepRecord.to_json_dict): no value may be written under one.
LINE_FIELDS = frozenset({
    "time_stamp", "step", "epoch", "rank", "world_size", "nonfinite", "alerts", "time", "sections", "stragglers",
    "model_state", "job", "recovered",
})  # fmt: skip


@dataclass(frozen=True)
class PhaseInterval:
    """A phase known from timestamps (wall seconds). `seconds` is what the histogram and the
    ledger count: the data wait of a whole window, whose span covers only its last gap.
    `traced=False`: observed by the histogram, no span (a gap too short to look at)."""

    name: str
    start_wall: float
    end_wall: float
    seconds: float
    attributes: Mapping[str, Any] = field(default_factory=dict)
    traced: bool = True


@dataclass
class StepRecord:
    """One sampled step. `values` maps a training-metric key (training_metrics.TABLE) to its
    value: a float, or a bool for overflow. Units are the table's: `train_per_step_time` is
    in milliseconds, as MindFormers' own logs print it.

    `started_at` is the wall time the step began (the previous step's end), when the live
    callback knows it; a replayed record derives it from the step time.
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
    started_at: float | None = None
    # Phases that ended in this window (timeline.py), recorded as spans by the pipeline.
    phases: list[PhaseInterval] = field(default_factory=list)
    # Seconds since the run's origin by phase, with `wall` and `productive` (goodput.py).
    time_breakdown: dict[str, float] = field(default_factory=dict)
    # The window's seconds by section, with `window` and `steps` (stragglers/sections.py).
    sections: dict[str, float] = field(default_factory=dict)
    # Sections this rank found itself holding the job back in (stragglers/rank_signal.py).
    stragglers: list[str] = field(default_factory=list)
    # Readings from inside the model (model_state/): summarised on the worker thread.
    model_state: ModelStateReading | None = None
    # The job this run is an attempt of: id, attempt number, job goodput (restarts/attempt_tracker.py).
    job: dict[str, object] | None = None
    # How many ranks the job has: written when more than one, so a report can tell a missing log.
    world_size: int = 1
    # Read back from a dead run's flight ring by a later process (flight_recorder/): the
    # values and times the training thread handed over, nothing the pipeline worker adds.
    recovered: bool = False

    def ordered_values(self) -> list[tuple[str, float | bool]]:
        """Values in the table's order (loss first), for lines people read."""
        values = self.values
        return [(key, values[key]) for key in _table_order(tuple(values))]

    def nonfinite(self) -> list[str]:
        """Keys of the values that are NaN or ±Inf, in the table's order."""
        bad = [name for name, value in self.values.items() if isinstance(value, float) and not math.isfinite(value)]
        return list(_table_order(tuple(bad))) if len(bad) > 1 else bad

    def to_json_dict(self) -> dict[str, object]:
        """The strict-JSON line: NaN/Inf become null and are listed under "nonfinite"."""
        line: dict[str, object] = {
            "time_stamp": round(self.time_stamp, 6),
            "step": self.step,
            "epoch": self.epoch,
            "rank": self.rank,
        }
        if self.world_size > 1:
            line["world_size"] = self.world_size
        bad = self.nonfinite()
        for name, value in self.ordered_values():
            line[name] = None if name in bad else value
        line.update(self.device)
        if bad:
            line["nonfinite"] = bad
        if self.alerts:
            line["alerts"] = list(self.alerts)
        if self.time_breakdown:
            line["time"] = dict(self.time_breakdown)
        if self.sections:
            line["sections"] = {key: round(value, 6) for key, value in self.sections.items()}
        if self.stragglers:
            line["stragglers"] = list(self.stragglers)
        if self.model_state:
            line["model_state"] = self.model_state.summary()
        if self.job:
            line["job"] = dict(self.job)
        if self.recovered:
            line["recovered"] = True
        return line
