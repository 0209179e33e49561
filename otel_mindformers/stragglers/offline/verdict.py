"""Which rank held the job back, and at what: the report's verdict across ranks.

Every rank's JSON lines carry its sampled windows' `sections` (stragglers/sections.py): seconds
of data wait, of time inside the step (compute and communication, the wait for other ranks
in the all-reduce included) and of phases. Ranks of a synchronous data-parallel job move in
step, so their step times agree whoever is slow; the sections say where each rank spent the
wait. Over the windows every rank logged (the same sampled steps):

- the job's wall time is the sum of the windows' longest length;
- the job's useful time is the sum of the windows' *shortest* in-step time: the rank that
  waited least inside its step did only its own compute and communication, and every other
  rank's in-step time beyond that was spent waiting for the slowest one;
- a rank's loss in a section (data wait, checkpoint, evaluation, other phases) is its time
  there beyond the job's best rank in the same window, summed: the best rank pays its own
  share anyway, the excess is what every rank waited for this one.

The bottleneck is the rank and section with the largest loss, named when it exceeds
`threshold` of the job's wall time. When every rank waits for its data (the job's best rank
itself waited over INPUT_BOUND of the job's wall time), the job is input-bound: whichever
rank falls slightly behind shows a little more wait, and naming it would send people to a
node that is not the cause; a rank is named for its data wait then only when its excess is
larger than what every rank waited. Without a bottleneck, a rank whose in-step time per step
rose against its earlier windows (the individual score) is named, with what host clocks
cannot tell apart: a slow compute rank and a slow link look alike.
"""

from __future__ import annotations

import statistics
from array import array
from dataclasses import dataclass, field

from otel_mindformers.names import straggler_names as names
from otel_mindformers.stragglers.sections import STEPS_KEY, WINDOW_KEY

DEFAULT_THRESHOLD = 0.05  # of the job's wall time
RISE = 2.0  # in-step time per step of the last windows against the rank's earlier ones
LAST_WINDOWS = 3
# Every rank waited this share of the job's wall time for its data: the job is input-bound
# (the in-process signal's default `data_share`, so both say "input-bound" alike).
INPUT_BOUND = 0.2
_LOSS_SECTIONS = (names.SECTION_DATA_WAIT, names.SECTION_CHECKPOINT, names.SECTION_EVALUATION, names.SECTION_OTHER)
# A SectionHistory row: seconds by section, then the window's length and its steps.
COLUMNS = (names.SECTION_DATA_WAIT, names.SECTION_IN_STEP, *_LOSS_SECTIONS[1:], WINDOW_KEY, STEPS_KEY)
TELL_APART = (
    "a slow compute rank and a slow link look alike from host clocks: compare the ranks' device readings "
    "(AI-core utilisation and frequency, temperature, throttling from npu-smi; `device_monitor: true`) "
    "and take a profiler capture of the suspect ranks"
)


class SectionHistory:
    """One series' windows: step → its sections, kept as one row of floats per window."""

    def __init__(self) -> None:
        self.steps = array("q")
        self.rows = array("d")

    def add(self, step: int, sections: dict[str, float]) -> None:
        self.steps.append(step)
        self.rows.extend(sections.get(column, 0.0) for column in COLUMNS)

    def by_step(self) -> dict[int, tuple[float, ...]]:
        width = len(COLUMNS)
        # A restarted run logs a step again: the later window wins.
        return {step: tuple(self.rows[i * width : (i + 1) * width]) for i, step in enumerate(self.steps)}


_DATA, _IN_STEP, _WINDOW, _STEPS = 0, 1, len(COLUMNS) - 2, len(COLUMNS) - 1


@dataclass
class RankLoss:
    label: str
    rank: int | None
    section: str
    lost_s: float  # beyond the job's best rank, summed over the windows
    share_of_job: float  # of the job's wall time
    rank_share: float  # the rank's own share of the windows' wall time in the section


@dataclass
class StepRise:
    label: str
    rank: int | None
    ratio: float  # in-step time per step, last windows over the first ones
    baseline_ms: float
    latest_ms: float


@dataclass
class InputBound:
    """Every rank waited for its data: the seconds the job's best rank waited, per window,
    summed (what no rank can be blamed for), and their share of the job's wall time."""

    waited_s: float
    share_of_job: float


@dataclass
class Verdict:
    ranks: int
    windows: int
    steps: int
    job_wall_s: float
    job_useful_s: float
    job_goodput: float | None
    threshold: float
    bottleneck: RankLoss | None = None
    job_median_share: float | None = None  # the bottleneck section's median share over ranks
    losses: list[RankLoss] = field(default_factory=list)  # every rank's largest loss, largest first
    rises: list[StepRise] = field(default_factory=list)
    note: str | None = None
    input_bound: InputBound | None = None  # every rank waited for its data

    @property
    def named(self) -> list[str]:
        if self.bottleneck is not None:
            return [self.bottleneck.label]
        return [rise.label for rise in self.rises]


def verdict(
    histories: list[tuple[str, int | None, SectionHistory]], threshold: float = DEFAULT_THRESHOLD
) -> Verdict | None:
    """The verdict over series that logged sections; None with fewer than two such ranks or
    no window they all logged."""
    tables = [(label, rank, history.by_step()) for label, rank, history in histories if history.steps]
    if len(tables) < 2:
        return None
    common = sorted(set.intersection(*(set(table) for _, _, table in tables)))
    if not common:
        return None
    windows = [[table[step] for _, _, table in tables] for step in common]
    job_wall = sum(max(row[_WINDOW] for row in rows) for rows in windows)
    useful = sum(min(row[_IN_STEP] for row in rows) for rows in windows)
    steps = int(sum(max(row[_STEPS] for row in rows) for rows in windows))
    result = Verdict(
        ranks=len(tables), windows=len(common), steps=steps, job_wall_s=job_wall, job_useful_s=useful,
        job_goodput=useful / job_wall if job_wall > 0 else None, threshold=threshold,
    )  # fmt: skip
    if job_wall <= 0:
        return result
    # Each window's best rank per column, once, not again per rank and column: that is
    # quadratic in the ranks (docs/analysis.md has the 64-rank benchmark).
    best = [[min(row[column] for row in rows) for column in range(len(COLUMNS))] for rows in windows]
    losses = []
    for index, (label, rank, _) in enumerate(tables):
        for column, section in enumerate(COLUMNS[: len(_LOSS_SECTIONS) + 1]):
            if section == names.SECTION_IN_STEP:
                continue
            lost = sum(rows[index][column] - least[column] for rows, least in zip(windows, best))
            wall = sum(rows[index][_WINDOW] for rows in windows)
            own = sum(rows[index][column] for rows in windows) / wall if wall > 0 else 0.0
            losses.append(RankLoss(label, rank, section, lost, lost / job_wall, own))
    worst_per_rank: dict[str, RankLoss] = {}
    for loss in sorted(losses, key=lambda one: one.lost_s, reverse=True):
        worst_per_rank.setdefault(loss.label, loss)
    result.losses = list(worst_per_rank.values())
    shared_wait = sum(least[_DATA] for least in best)
    if shared_wait / job_wall > INPUT_BOUND:
        result.input_bound = InputBound(shared_wait, shared_wait / job_wall)
    top = result.losses[0]
    # Input-bound, a rank's data wait beyond the best one's names it only when it is more
    # than every rank waited anyway: less is whichever rank fell behind this time.
    blamed = result.input_bound is None or top.section != names.SECTION_DATA_WAIT or top.lost_s > shared_wait
    if top.share_of_job > threshold and blamed:
        result.bottleneck = top
        result.job_median_share = statistics.median(
            loss.rank_share for loss in losses if loss.section == top.section
        )  # fmt: skip
        return result
    result.rises = _rises(tables, common)
    if result.rises:
        result.note = TELL_APART
    return result


def _rises(tables, common: list[int]) -> list[StepRise]:
    """Ranks whose in-step time per step in their last windows rose past RISE times the
    median of their earlier windows (the individual score), largest first."""
    if len(common) < 2 * LAST_WINDOWS:
        return []
    rises = []
    for label, rank, table in tables:
        per_step = [table[step][_IN_STEP] / max(table[step][_STEPS], 1.0) for step in common]
        baseline = statistics.median(per_step[:-LAST_WINDOWS])
        latest = statistics.median(per_step[-LAST_WINDOWS:])
        if baseline > 0 and latest / baseline > RISE:
            rises.append(StepRise(label, rank, latest / baseline, baseline * 1000, latest * 1000))
    return sorted(rises, key=lambda rise: rise.ratio, reverse=True)


# --- rendering -----------------------------------------------------------------------------

TITLE = "Which rank holds the job back (synchronous training: every rank waits for the slowest)"


def _seconds(value: float) -> str:
    return f"{value:.3f} s" if value < 10 else f"{value:.1f} s"


def input_bound_text(result: Verdict) -> str | None:
    """ "every rank is input-bound: ..." when it is."""
    bound = result.input_bound
    if bound is None:
        return None
    return (
        f"every rank is input-bound: each waited for its data at least {_seconds(bound.waited_s)} "
        f"({bound.share_of_job:.1%} of the job's wall time); the data pipeline or its storage sets the job's pace"
    )


def lines(result: Verdict | None) -> list[str]:
    """The verdict in lines people read (text and markdown)."""
    if result is None:
        return []
    goodput = "-" if result.job_goodput is None else f"{result.job_goodput:.3f}"
    out = [
        f"job useful time {_seconds(result.job_useful_s)} of {_seconds(result.job_wall_s)} "
        f"(useful share {goodput}) over {result.windows} window(s), {result.steps} steps, {result.ranks} ranks"
    ]
    bound = input_bound_text(result)
    if bound is not None:
        out.append(bound)
    top = result.bottleneck
    if top is not None:
        median = "-" if result.job_median_share is None else f"{result.job_median_share:.1%}"
        out.append(
            f"bottleneck: {top.label}, {top.section}: the job lost {_seconds(top.lost_s)} "
            f"({top.share_of_job:.1%} of its wall time) waiting for it; its {top.section} share "
            f"{top.rank_share:.1%} against a job median of {median}"
        )
        out += [
            f"  {loss.label}: {_seconds(loss.lost_s)} to {loss.section} beyond the best rank"
            for loss in result.losses
            if loss.lost_s > 0
        ]
        return out
    if result.rises:
        named = ", ".join(
            f"{rise.label} ({rise.baseline_ms:.1f} -> {rise.latest_ms:.1f} ms per step, {rise.ratio:.2f}x)"
            for rise in result.rises
        )
        out.append(f"in-step time rose against the rank's own earlier windows, no data wait to explain it: {named}")
        out.append(f"cannot tell apart: {result.note}")
        return out
    if bound is not None:
        excess = next((loss for loss in result.losses if loss.section == names.SECTION_DATA_WAIT), None)
        out.append(
            "no rank holds the others back: "
            + (
                f"the largest extra wait, {excess.label}'s {_seconds(excess.lost_s)}, is less than every rank waited"
                if excess is not None and excess.lost_s > 0
                else "their waits agree"
            )
        )
        return out
    out.append(f"no rank holds the job back: no rank lost over {result.threshold:.0%} of the job's wall time")
    return out


def findings(result: Verdict | None) -> list[str]:
    """The verdict's findings: the rank it names, or that every rank is input-bound."""
    if result is None:
        return []
    bound = input_bound_text(result)
    found = [bound] if bound is not None else []
    if result.bottleneck is not None:
        top = result.bottleneck
        return [
            f"{top.label}: holds the job back in {top.section}, the job lost {_seconds(top.lost_s)} "
            f"({top.share_of_job:.1%} of its wall time) to it",
            *found,
        ]
    return found + [
        f"{rise.label}: in-step time rose {rise.ratio:.2f}x against its own earlier windows" for rise in result.rises
    ]


__all__ = [
    "COLUMNS",
    "DEFAULT_THRESHOLD",
    "TITLE",
    "InputBound",
    "SectionHistory",
    "Verdict",
    "findings",
    "input_bound_text",
    "lines",
    "verdict",
]
