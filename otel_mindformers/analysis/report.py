"""`otel-mindformers report`: what a run did, where it went wrong, which ranks were slow."""

from __future__ import annotations

import json
import math
import statistics
from array import array
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

from otel_mindformers.analysis.top_norms import Peak, TopNorms
from otel_mindformers.names import phase_names
from otel_mindformers.names import training as tm
from otel_mindformers.names.phase_names import PHASE_CHECKPOINT_LOAD, PHASE_COMPILE, PHASE_STARTUP
from otel_mindformers.nonfinite.offline.first_bad_rank import report_findings as first_bad_rank_findings
from otel_mindformers.outputs.jsonl_reader import Location, Scanned, Series, StepPoint, scan_logs
from otel_mindformers.restarts.offline.attempts_report import job_report
from otel_mindformers.stragglers.offline import verdict as stragglers
from otel_mindformers.stragglers.offline.verdict import Verdict
from otel_mindformers.stragglers.sections import STEPS_KEY

FORMATS = ("text", "json", "markdown")
DEFAULT_STRAGGLER_THRESHOLD = 0.10
_LISTED_STEPS = 10  # step lists in text/markdown are cut after this many
# The phases a run records itself, in the order it meets them (docs/time.md); user-marked
# phases add up under OTHER_PHASES.
BUILT_IN_PHASES = (
    PHASE_STARTUP, PHASE_CHECKPOINT_LOAD, PHASE_COMPILE,
    phase_names.PHASE_DATA_WAIT, phase_names.PHASE_EVALUATION, phase_names.PHASE_CHECKPOINT_SAVE,
)  # fmt: skip
OTHER_PHASES = "other"
_LEDGER_TOTALS = frozenset({"wall", "productive"})  # the `time` object's keys that are not phases


@dataclass(frozen=True)
class Gap:
    """Steps missing between two consecutive records (`after` → `before`)."""

    after: int
    before: int
    location: str


@dataclass(frozen=True)
class Restart:
    """The step number went back: the file was appended to by a restarted run."""

    from_step: int
    to_step: int
    location: str


@dataclass
class TimeBreakdown:
    """Where one series' wall time went, from its JSON lines' `time` objects: the last
    object of each run in the log (a restarted run starts a new ledger), summed."""

    wall_s: float
    productive_s: float
    goodput: float | None
    # Seconds lost by phase: the built-in ones by name, user-marked ones under "other".
    lost_s: dict[str, float]

    def share(self, phase: str) -> float | None:
        return self.lost_s.get(phase, 0.0) / self.wall_s if self.wall_s > 0 else None


@dataclass(frozen=True)
class LoggedAttempt:
    """An attempt of a job as a series' lines saw it: its last logged step and that line's
    time. Fresher than the ledger's last heartbeat for an attempt that was killed."""

    job_id: str
    attempt: int
    last_step: int
    last_time: float | None
    # The run's wait for data up to that line (its `time` object's `data_wait`), when it has one.
    data_wait: float | None = None


@dataclass
class SeriesSummary:
    label: str
    rank: int | None
    files: list[str]
    records: int
    first_step: int | None
    last_step: int | None
    wall_time_s: float | None
    first_loss: float | None
    last_loss: float | None
    min_loss: float | None
    min_loss_step: int | None
    # The loss was non-finite from this step to the end of the series (`last_loss` is the
    # last finite one, before it); None when the last logged loss is finite.
    loss_nonfinite_since: int | None
    step_time_median_ms: float | None
    step_time_mean_ms: float | None
    step_time_max_ms: float | None
    steps_per_second: float | None
    mean_samples_per_second: float | None
    mean_tokens_per_second: float | None
    nonfinite_steps: list[int]
    overflow_steps: list[int]
    alerts: list[str]
    stride: int | None
    gaps: list[Gap]
    restarts: list[Restart]
    foreign_lines: int
    damaged_tails: list[str]
    out_of_range: list[str]  # `FILE:LINE: what`: lines whose numbers no analysis can hold
    skew_vs_median: float | None = None
    # The largest gradient norms over the run (analysis/top_norms.py): name, value, step.
    top_layers: list[Peak] = field(default_factory=list)
    top_parameters: list[Peak] = field(default_factory=list)
    time: TimeBreakdown | None = None
    attempts: list[LoggedAttempt] = field(default_factory=list)
    world_size: int = 1  # the job's ranks, as its lines say


@dataclass
class Report:
    series: list[SeriesSummary]
    steps: int | None
    wall_time_s: float | None
    loss_from: str | None
    first_loss: float | None
    last_loss: float | None
    min_loss: float | None
    min_loss_step: int | None
    loss_nonfinite_since: int | None
    steps_per_second: float | None
    mean_samples_per_second: float | None
    mean_tokens_per_second: float | None
    nonfinite_records: int
    overflow_records: int
    median_step_time_ms: float | None
    straggler_threshold: float
    stragglers: list[str] = field(default_factory=list)
    slowest: str | None = None
    # Which rank held the job back, and at what (stragglers/offline/verdict.py).
    bottleneck: Verdict | None = None
    # The job's attempts from its ledgers (restarts/offline/attempts_report.py), when the
    # caller read them: a resume or a killed attempt they explain is not a finding.
    attempts: list[dict[str, Any]] = field(default_factory=list)


def build_report(series: list[Series], straggler_threshold: float = DEFAULT_STRAGGLER_THRESHOLD) -> Report:
    """The report of series already read (see `report_logs` to read and summarise at once)."""
    summarised = []
    for one in series:
        stats = SeriesStats()
        for point in one.points:
            stats.add(point)
        summarised.append(
            (
                stats,
                stats.summary(
                    one.label, one.rank, one.files, one.alerts, one.foreign_lines, one.damaged_tails, one.out_of_range
                ),
            )
        )
    return _combine(summarised, straggler_threshold)


def report_logs(inputs, straggler_threshold: float = DEFAULT_STRAGGLER_THRESHOLD) -> Report:
    """Read and summarise in one pass: each record updates its series' running summary and
    is dropped, so memory does not grow with the size of the logs' lines. A folder is its
    latest run: the earlier runs set aside there are other runs, not slower ranks."""
    return report_scanned(scan_logs(inputs, SeriesStats, one_run_per_folder=True), straggler_threshold)


_Stats = TypeVar("_Stats", bound="SeriesStats")


def report_scanned(
    scanned: Sequence[Scanned[_Stats]], straggler_threshold: float = DEFAULT_STRAGGLER_THRESHOLD
) -> Report:
    """The report of series `scan_logs` summarised into `SeriesStats` (or a subclass that
    keeps more, as the HTML page's does)."""
    summarised = [
        (
            one.sink,
            one.sink.summary(
                one.label, one.rank, one.files, one.alerts, one.foreign_lines, one.damaged_tails, one.out_of_range
            ),
        )
        for one in scanned
    ]
    return _combine(summarised, straggler_threshold)


def read_job(report: Report, inputs: Sequence[str | Path]) -> dict[str, Any] | None:
    """The job's attempts and totals from the ledgers beside `inputs` (`job_report`, given
    what the series' lines know of each attempt), kept on `report` as well: a resume or a
    killed attempt they explain is not a finding. None without a ledger."""
    job = job_report(inputs, logged=report.series)
    if job is not None:
        report.attempts = job["attempts"]
    return job


def _combine(summarised: Sequence[tuple[SeriesStats, SeriesSummary]], straggler_threshold: float) -> Report:
    summaries = [summary for _, summary in summarised]
    medians = [s.step_time_median_ms for s in summaries if s.step_time_median_ms is not None]
    overall_median = statistics.median(medians) if medians else None
    if overall_median:
        for summary in summaries:
            if summary.step_time_median_ms is not None:
                summary.skew_vs_median = summary.step_time_median_ms / overall_median - 1.0
    by_skew = sorted(
        ((s.skew_vs_median, s) for s in summaries if s.skew_vs_median is not None),
        key=lambda pair: pair[0],
        reverse=True,
    )
    first_stamps = [stats.first_stamp for stats, _ in summarised if stats.first_stamp is not None]
    last_stamps = [stats.last_stamp for stats, _ in summarised if stats.last_stamp is not None]
    lossy = next((s for s in summaries if s.first_loss is not None), None)
    return Report(
        series=summaries,
        steps=max((s.last_step for s in summaries if s.last_step is not None), default=None),
        wall_time_s=max(last_stamps) - min(first_stamps) if first_stamps else None,
        loss_from=lossy.label if lossy else None,
        first_loss=lossy.first_loss if lossy else None,
        last_loss=lossy.last_loss if lossy else None,
        min_loss=lossy.min_loss if lossy else None,
        min_loss_step=lossy.min_loss_step if lossy else None,
        loss_nonfinite_since=lossy.loss_nonfinite_since if lossy else None,
        steps_per_second=_mean_of(s.steps_per_second for s in summaries),
        mean_samples_per_second=_mean_of(s.mean_samples_per_second for s in summaries),
        mean_tokens_per_second=_mean_of(s.mean_tokens_per_second for s in summaries),
        nonfinite_records=sum(len(s.nonfinite_steps) for s in summaries),
        overflow_records=sum(len(s.overflow_steps) for s in summaries),
        median_step_time_ms=overall_median,
        straggler_threshold=straggler_threshold,
        stragglers=[s.label for skew, s in by_skew if len(by_skew) > 1 and skew > straggler_threshold],
        slowest=by_skew[0][1].label if len(by_skew) > 1 else None,
        bottleneck=stragglers.verdict([(summary.label, summary.rank, stats.sections) for stats, summary in summarised]),
    )


class SeriesStats:
    """A series' summary, kept up to date one point at a time (a `logs.PointSink`).

    Per record it keeps at most a step time (8 bytes) and, for a step jump, the jump; the
    median step time needs every value, the rest are running numbers."""

    def __init__(self) -> None:
        self.records = 0
        self.world_size = 1  # the most ranks a line of the series says the job has
        self.first_step: int | None = None
        self.first_stamp: float | None = None
        self.last_stamp: float | None = None
        self._previous: StepPoint | None = None
        self._losses: tuple[int, float] | None = None  # (step, value) of the first loss
        self._last_loss: float | None = None
        self._loss_nonfinite_since: int | None = None
        self._min_loss: tuple[float, int] | None = None
        self._first_step_time: float | None = None  # compilation: left out unless alone
        self._step_times = array("d")
        self._progress = [0.0, 0.0]  # steps advanced, seconds they took
        self._samples = [0.0, 0]
        self._tokens = [0.0, 0]
        self._first_rates: dict[str, float] = {}  # the first record's, compilation in them: kept if alone
        self.nonfinite_steps = array("q")
        self.overflow_steps = array("q")
        self._strides: Counter[int] = Counter()
        # Forward step difference → (file index, line, step) of each, flat: gaps
        # are the differences beyond the stride, known only at the end.
        self._jumps: dict[int, array] = {}
        self._paths: dict[Path, int] = {}
        self.restarts: list[Restart] = []
        self.top = TopNorms()
        self._time_before: dict[str, float] = {}  # the finished runs' last `time` objects, summed
        self._time: dict[str, float] | None = None  # the current run's latest one
        self.sections = stragglers.SectionHistory()
        self._attempts: dict[tuple[str, int], list] = {}  # (job id, attempt) -> [last step, its time, data wait]

    def add(self, point: StepPoint) -> None:
        if point.world_size is not None and point.world_size > self.world_size:
            self.world_size = point.world_size
        stamp = point.time_stamp
        if point.job is not None:
            seen = self._attempts.get(point.job)
            data_wait = point.time.get(phase_names.PHASE_DATA_WAIT) if point.time else None
            if seen is None:
                self._attempts[point.job] = [point.step, stamp, data_wait]
            elif point.step > seen[0]:
                seen[0], seen[1], seen[2] = point.step, stamp, data_wait
        if stamp is not None:
            self.first_stamp = stamp if self.first_stamp is None else min(self.first_stamp, stamp)
            self.last_stamp = stamp if self.last_stamp is None else max(self.last_stamp, stamp)
        loss = point.value(tm.LOSS)
        if _finite(loss):
            if self._losses is None:
                self._losses = (point.step, loss)
            self._last_loss = loss
            self._loss_nonfinite_since = None
            if self._min_loss is None or loss < self._min_loss[0]:
                self._min_loss = (loss, point.step)
        elif tm.LOSS in point.nonfinite and self._losses is not None and self._loss_nonfinite_since is None:
            self._loss_nonfinite_since = point.step
        step_time = point.value(tm.STEP_TIME)
        if self.records == 0:
            self.first_step = point.step
            self._first_step_time = step_time if _finite(step_time) else None
        elif _finite(step_time):
            self._step_times.append(step_time)
        first = self.records == 0
        for name, total in ((tm.SAMPLES_PER_SECOND, self._samples), (tm.TOKENS_PER_SECOND, self._tokens)):
            value = point.value(name)
            if not _finite(value):
                continue
            if first:
                self._first_rates[name] = value
            else:
                total[0] += value
                total[1] += 1
        bad = point.counted_nonfinite  # not a grad norm on an overflow step (loss scaling)
        if bad and not bad.isdisjoint(tm.NONFINITE_WATCHED):  # not a custom scalar's NaN alone
            self.nonfinite_steps.append(point.step)
        if point.overflow:
            self.overflow_steps.append(point.step)
        if point.model_state:
            self.top.add(point.step, point.model_state)
        if point.time is not None:
            self._follow_time(point.step, point.time)
        if point.sections:
            self.sections.add(point.step, point.sections)
        self._follow(point)
        self.records += 1

    def _follow(self, point: StepPoint) -> None:
        previous, self._previous = self._previous, point
        if previous is None:
            return
        if point.step > previous.step:
            difference = point.step - previous.step
            self._strides[difference] += 1
            # A record whose own window spans the jump lost nothing before it: device sink mode
            # samples the first sink end past each multiple of `interval`, off that grid.
            if (point.sections or {}).get(STEPS_KEY) != difference:
                where = self._paths.setdefault(point.location.path, len(self._paths))
                self._jumps.setdefault(difference, array("q")).extend((where, point.location.line, point.step))
            if previous.time_stamp is not None and point.time_stamp is not None:
                self._progress[0] += difference
                self._progress[1] += point.time_stamp - previous.time_stamp
        else:
            self.restarts.append(Restart(previous.step, point.step, str(point.location)))

    def _follow_time(self, step: int, time: dict[str, float]) -> None:
        """`time` objects are cumulative: keep the latest, and bank it when a new run begins
        (the step goes back, or the wall time since the origin does)."""
        latest = self._time
        if latest is not None and (
            time["wall"] < latest["wall"] or (self._previous is not None and step <= self._previous.step)
        ):
            for key, seconds in latest.items():
                self._time_before[key] = self._time_before.get(key, 0.0) + seconds
        self._time = time

    def time_breakdown(self) -> TimeBreakdown | None:
        if self._time is None:
            return None
        totals = dict(self._time_before)
        for key, seconds in self._time.items():
            totals[key] = totals.get(key, 0.0) + seconds
        wall = totals.get("wall", 0.0)
        productive = totals.get("productive", 0.0)
        lost = {phase: totals[phase] for phase in BUILT_IN_PHASES if totals.get(phase, 0.0) > 0}
        other = sum(s for key, s in totals.items() if key not in _LEDGER_TOTALS and key not in BUILT_IN_PHASES)
        if other > 0:
            lost[OTHER_PHASES] = other
        return TimeBreakdown(wall, productive, productive / wall if wall > 0 else None, lost)

    def _sequence(self) -> tuple[int | None, list[Gap]]:
        """The usual step stride (the sampling interval) and the jumps beyond it."""
        if not self._strides:
            return None, []
        # Ties go to the larger stride: the first sample (step 1) and the last one sit
        # off the interval grid and must not shrink it.
        stride = max(self._strides.items(), key=lambda kv: (kv[1], kv[0]))[0]
        paths = list(self._paths)
        jumps = sorted(  # files are read in order, each from its first line: this is reading order
            (found[i], found[i + 1], found[i + 2] - difference, found[i + 2])
            for difference, found in self._jumps.items()
            if difference > stride
            for i in range(0, len(found), 3)
        )
        return stride, [Gap(after, before, str(Location(paths[where], line))) for where, line, after, before in jumps]

    def _mean_rate(self, name: str, total: list) -> float | None:
        """The mean logged rate, the first record left out as from the step times (unless alone)."""
        if total[1]:
            return total[0] / total[1]
        return self._first_rates.get(name)

    def summary(
        self, label: str, rank: int | None, files, alerts, foreign_lines: int, damaged_tails, out_of_range: list[str]
    ) -> SeriesSummary:
        step_times = (
            self._step_times
            if self._step_times
            else (array("d", [self._first_step_time]) if self._first_step_time is not None else array("d"))
        )
        stride, gaps = self._sequence()
        steps, seconds = self._progress
        return SeriesSummary(
            label=label,
            rank=rank,
            files=[str(f) for f in files],
            records=self.records,
            first_step=self.first_step,
            last_step=self._previous.step if self._previous else None,
            wall_time_s=(
                self.last_stamp - self.first_stamp
                if self.first_stamp is not None and self.last_stamp is not None  # set together in `add`
                else None
            ),
            first_loss=self._losses[1] if self._losses else None,
            last_loss=self._last_loss,
            min_loss=self._min_loss[0] if self._min_loss else None,
            min_loss_step=self._min_loss[1] if self._min_loss else None,
            loss_nonfinite_since=self._loss_nonfinite_since,
            step_time_median_ms=statistics.median(step_times) if step_times else None,
            step_time_mean_ms=statistics.fmean(step_times) if step_times else None,
            step_time_max_ms=max(step_times) if step_times else None,
            steps_per_second=steps / seconds if seconds > 0 else None,
            mean_samples_per_second=self._mean_rate(tm.SAMPLES_PER_SECOND, self._samples),
            mean_tokens_per_second=self._mean_rate(tm.TOKENS_PER_SECOND, self._tokens),
            nonfinite_steps=list(self.nonfinite_steps),
            overflow_steps=list(self.overflow_steps),
            alerts=[f"step {a.step}: {a.describe()}" if a.step is not None else a.describe() for a in alerts],
            stride=stride,
            gaps=gaps,
            restarts=self.restarts,
            foreign_lines=foreign_lines,
            damaged_tails=[str(location) for location in damaged_tails],
            out_of_range=list(out_of_range),
            top_layers=self.top.layers(),
            top_parameters=self.top.parameters(),
            time=self.time_breakdown(),
            world_size=self.world_size,
            attempts=[LoggedAttempt(job, attempt, *seen) for (job, attempt), seen in self._attempts.items()],
        )


def _finite(value: float | None) -> bool:
    return value is not None and math.isfinite(value)


def _mean_of(values) -> float | None:
    kept = [v for v in values if _finite(v)]
    return statistics.fmean(kept) if kept else None


# --- rendering -----------------------------------------------------------------------------


def render(report: Report, fmt: str) -> str:
    if fmt == "json":
        return json.dumps(json_body(report), indent=2)
    if fmt == "markdown":
        return _markdown(report)
    return _text(report)


# What the step-time view in the JSON report means (docs/analysis.md#report).
STEP_TIME_VIEW = (
    "series whose own step time is over the median by more than straggler_threshold; in a "
    "synchronous job the ranks move in step, so it names no rank: read holds_back"
)


def json_body(report: Report) -> dict[str, Any]:
    """The report as `report --json` writes it (before the job and captures are added), with
    one verdict: `holds_back` names the series that holds the job back, from the sections
    (bottleneck) where they name one, else from step times. The step-time view
    (`stragglers`, `slowest`) sits under `step_time_view`, labelled. Non-finite numbers are
    None."""
    body = asdict(report)
    stragglers, slowest = body.pop("stragglers"), body.pop("slowest")
    body.pop("attempts")  # the JSON's "job" holds them
    named = report.bottleneck.bottleneck if report.bottleneck is not None else None
    body["holds_back"] = named.label if named is not None else (stragglers[0] if stragglers else None)
    body["step_time_view"] = {"stragglers": stragglers, "slowest": slowest, "meaning": STEP_TIME_VIEW}
    return _json_safe(body)


def _json_safe(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_json_safe(v) for v in value]
    return value


def _num(value: float | None, digits: int = 4) -> str:
    if value is None:
        return "-"
    return f"{value:.{digits}g}"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:+.1f}%"


def _steps_list(steps: list[int]) -> str:
    shown = ", ".join(str(s) for s in steps[:_LISTED_STEPS])
    more = len(steps) - _LISTED_STEPS
    return shown + (f", … ({more} more)" if more > 0 else "")


def _after(report: Report) -> str:
    """Where the last loss shown is not the run's last: the loss went non-finite and stayed."""
    since = report.loss_nonfinite_since
    return "" if since is None else f" (last finite; non-finite from step {since} to the end)"


def _overview(report: Report) -> list[tuple[str, str]]:
    first = report.series[0].first_step if report.series else None
    rows = [
        ("logs", ", ".join(s.label for s in report.series)),
        ("steps", "-" if report.steps is None else f"{first}..{report.steps}"),
        ("wall time", "-" if report.wall_time_s is None else f"{report.wall_time_s:.1f} s (first to last record)"),
        (
            "loss",
            "-"
            if report.first_loss is None
            else f"first {_num(report.first_loss)}, last {_num(report.last_loss)}{_after(report)}, "
            f"min {_num(report.min_loss)} (step {report.min_loss_step}) [{report.loss_from}]",
        ),
        ("throughput", _throughput(report)),
        ("non-finite", f"{report.nonfinite_records} record(s)"),
        ("overflow", f"{report.overflow_records} record(s)"),
    ]
    return rows


def _throughput(report: Report) -> str:
    parts = []
    if report.mean_samples_per_second is not None:
        parts.append(f"{_num(report.mean_samples_per_second)} samples/s")
    if report.mean_tokens_per_second is not None:
        parts.append(f"{_num(report.mean_tokens_per_second)} tokens/s")
    if report.steps_per_second is not None:
        parts.append(f"{_num(report.steps_per_second)} steps/s")
    return "mean " + ", ".join(parts) if parts else "-"


_TABLE_HEADER = ("series", "records", "steps", "median ms", "mean ms", "max ms", "skew vs median")


def _table_rows(report: Report) -> list[tuple[str, ...]]:
    return [
        (
            s.label,
            str(s.records),
            "-" if s.first_step is None else f"{s.first_step}..{s.last_step}",
            _num(s.step_time_median_ms),
            _num(s.step_time_mean_ms),
            _num(s.step_time_max_ms),
            _pct(s.skew_vs_median),
        )
        for s in report.series
    ]


def _straggler_line(report: Report) -> str | None:
    if report.slowest is None:
        return None
    by_label = {s.label: s for s in report.series}
    # Where the ranks move in step, the bottleneck section below says more than their step
    # times: point at it, beside any straggler a noisy median flags.
    verdict = report.bottleneck
    below = None
    if verdict is not None and verdict.bottleneck is not None:
        below = "see below for the rank that holds them back"
    elif verdict is not None and verdict.rises:
        below = "see below for the ranks whose step time rose"
    elif verdict is not None and verdict.input_bound is not None:
        below = "every rank waits for its data (below)"
    if report.stragglers:
        named = ", ".join(f"{label} ({_pct(by_label[label].skew_vs_median)})" for label in report.stragglers)
        line = (
            f"stragglers (> {report.straggler_threshold:.0%} over the median "
            f"{_num(report.median_step_time_ms)} ms): {named}"
        )
        return f"{line}; {below}" if below else line
    if below:
        return (
            f"step times agree (median {_num(report.median_step_time_ms)} ms) because the ranks move in step: {below}"
        )
    slowest = by_label[report.slowest]
    return (
        f"no stragglers: every series within {report.straggler_threshold:.0%} of the median "
        f"{_num(report.median_step_time_ms)} ms; slowest {slowest.label} ({_pct(slowest.skew_vs_median)})"
    )


_TIME_TITLE = "Where the time went per series (seconds lost by phase, share of wall time)"


def _time_table(report: Report) -> tuple[tuple[str, ...], list[tuple[str, ...]]] | None:
    """Goodput by phase per series: which rank lost how much to what. Phase columns are the
    ones some series lost time to; None when no log has `time` objects."""
    timed = [(s.label, s.time) for s in report.series if s.time is not None]
    if not timed:
        return None
    phases = [p for p in (*BUILT_IN_PHASES, OTHER_PHASES) if any(p in time.lost_s for _, time in timed)]
    header = ("series", "wall s", "own goodput", *phases)
    rows = [
        (
            label,
            f"{time.wall_s:.1f}",
            "-" if time.goodput is None else f"{time.goodput:.3f}",
            *(_seconds_and_share(time.lost_s.get(p, 0.0), time.share(p)) for p in phases),
        )
        for label, time in timed
    ]
    return header, rows


# What start-up counts from (docs/time.md): the kernel's start of the process.
STARTUP_FROM = (
    "start-up counts from the process's start to the first step (a wrapper script that sets up, then "
    "execs Python, keeps its process: its setup counts)"
)


def _own_goodput_note(report: Report) -> str:
    """What the per-series goodput is, beside the job's, so the two tables agree at a glance;
    and what start-up counts from, when a series lost time to it."""
    note = (
        "own goodput: each series' time in its steps over its own wall time; a rank that waits "
        "for another inside its step counts that wait as its own"
    )
    if any(s.time is not None and PHASE_STARTUP in s.time.lost_s for s in report.series):
        note += f"; {STARTUP_FROM}"
    verdict = report.bottleneck
    if verdict is not None and verdict.job_goodput is not None and verdict.ranks > 1:
        note += f"; the job's useful share across ranks: {verdict.job_goodput:.3f} (below)"
    return note


def _seconds_and_share(seconds: float, share: float | None) -> str:
    shown = f"{seconds:.3f}" if seconds < 10 else f"{seconds:.1f}"  # a short load reads as more than 0.00
    return f"{shown} s" + ("" if share is None else f" ({share:.1%})")


def _largest_loss(report: Report) -> str | None:
    losses = [
        (seconds, s.label, s.time, phase) for s in report.series if s.time for phase, seconds in s.time.lost_s.items()
    ]
    if not losses:
        return None
    seconds, label, time, phase = max(losses, key=lambda loss: loss[0])
    share = time.share(phase)
    return f"largest loss: {label}, {_seconds_and_share(seconds, None)} to {phase}" + (
        "" if share is None else f" ({share:.1%} of its wall time)"
    )


def _missing_ranks(report: Report) -> str | None:
    """ "logs of 1 of 2 ranks" when the lines say the job had more ranks than there are logs."""
    world = max((s.world_size for s in report.series), default=1)
    ranks = {s.rank for s in report.series if s.rank is not None}
    if world <= len(ranks):
        return None
    missing = sorted(set(range(world)) - ranks)
    shown = ", ".join(map(str, missing[:8])) + (", ..." if len(missing) > 8 else "")
    return (
        f"logs of {len(ranks)} of {world} ranks (none for rank {shown}); cannot compare ranks: "
        "the straggler verdict and the job's totals are of these ranks only"
    )


def _killed_in(attempts: list[dict[str, Any]], gap: Gap) -> dict[str, Any] | None:
    """The killed attempt whose last steps the gap is: it went past the gap's start, and the
    next attempt resumed before the gap's end."""
    for attempt, following in zip(attempts, attempts[1:]):
        if (
            attempt.get("outcome") == "killed"
            and gap.after < int(attempt.get("last_step") or 0)
            and int(following.get("resume_step") or 0) < gap.before
        ):
            return attempt
    return None


def _resumed_at(attempts: list[dict[str, Any]], step: int) -> bool:
    """Whether a later attempt resumed so that its first step is `step`."""
    return any(int(a.get("resume_step") or 0) + 1 == step for a in attempts[1:])


# What a finding is about: where the HTML page shows it (analysis/html_report/page.py).
TOPIC_LOGS, TOPIC_CURVES, TOPIC_RANKS, TOPIC_ATTEMPTS = "logs", "curves", "ranks", "attempts"


class Finding(NamedTuple):
    topic: str
    text: str


def findings(report: Report) -> list[Finding]:
    """The report's findings, each with its topic."""
    found = [Finding(TOPIC_RANKS, missing)] if (missing := _missing_ranks(report)) else []
    for s in report.series:
        curves: list[str] = []
        if s.nonfinite_steps:
            curves.append(f"{s.label}: non-finite values at steps {_steps_list(s.nonfinite_steps)}")
        if s.overflow_steps:
            curves.append(f"{s.label}: overflow at steps {_steps_list(s.overflow_steps)}")
        attempts: list[str] = []
        for gap in s.gaps:
            killed = _killed_in(report.attempts, gap)
            attempts.append(
                f"{s.label}: steps {gap.after + 1}–{killed['last_step']} of attempt {killed['attempt']} were not "
                f"recorded; the process was killed at {gap.location}"
                if killed is not None
                else f"{s.label}: gap, no record between step {gap.after} and step {gap.before} "
                f"(stride {s.stride}) at {gap.location}"
            )
        for restart in s.restarts:
            if _resumed_at(report.attempts, restart.to_step):
                continue  # a resume the job's ledger explains (its attempts table shows it)
            attempts.append(
                f"{s.label}: restart, step went from {restart.from_step} back to "
                f"{restart.to_step} at {restart.location}"
            )
        alerts = [f"{s.label}: alert, {alert}" for alert in s.alerts]
        logs = [f"{s.label}: truncated last line skipped at {location}" for location in s.damaged_tails]
        if s.foreign_lines:  # expected: the article's custom monitor writes beside ours
            logs.append(
                f"{s.label}: {s.foreign_lines} line(s) another monitor wrote to the same file left out "
                "(a custom monitor's own records, as the monitor_config article's writes beside these)"
            )
        logs += [f"{s.label}: line skipped, {note}" for note in s.out_of_range]
        found += [Finding(TOPIC_CURVES, line) for line in curves]
        found += [Finding(TOPIC_ATTEMPTS, line) for line in attempts]
        found += [Finding(TOPIC_CURVES, line) for line in alerts]
        found += [Finding(TOPIC_LOGS, line) for line in logs]
    # Diagnosis files beside the logs name the first rank to go non-finite.
    found += [Finding(TOPIC_CURVES, line) for line in first_bad_rank_findings(report.series)]
    found += [Finding(TOPIC_RANKS, line) for line in stragglers.findings(report.bottleneck)]
    return found


def _text(report: Report) -> str:
    out = ["Run"]
    out += [f"  {name:<11} {value}" for name, value in _overview(report)]
    out += ["", "Step time per series (train_per_step_time)"]
    out += _aligned([_TABLE_HEADER, *_table_rows(report)])
    straggler = _straggler_line(report)
    if straggler:
        out.append("  " + straggler)
    time_table = _time_table(report)
    if time_table:
        header, rows = time_table
        out += ["", _TIME_TITLE, *_aligned([header, *rows]), "  " + _own_goodput_note(report)]
        largest = _largest_loss(report)
        if largest:  # none when no series lost time to any phase
            out.append("  " + largest)
    verdict_lines = stragglers.lines(report.bottleneck)
    if verdict_lines:
        out += ["", stragglers.TITLE] + [f"  {line}" for line in verdict_lines]
    for title, peaks in _top_norms(report):
        out += ["", title] + [f"  {label:<12} {name:<48} {value}" for label, name, value in peaks]
    lines = [finding.text for finding in findings(report)]
    out += ["", "Findings"] + ([f"  {line}" for line in lines] or ["  none"])
    return "\n".join(out) + "\n"


def _aligned(rows: list[tuple[str, ...]]) -> list[str]:
    """A text table: the first column left-aligned, the others right-aligned."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [
        "  "
        + "  ".join(
            cell.ljust(width) if i == 0 else cell.rjust(width) for i, (cell, width) in enumerate(zip(row, widths))
        ).rstrip()
        for row in rows
    ]


def _top_norms(report: Report) -> list[tuple[str, list[tuple[str, str, str]]]]:
    """Per series with per-layer norms: the layers and parameters with the largest gradient
    norm over the run (peak value and its step)."""
    sections = []
    for s in report.series:
        for what, peaks in (("layers", s.top_layers), ("parameters", s.top_parameters)):
            if peaks:
                rows = [(s.label, p.name, f"{_num(p.value)} at step {p.step}") for p in peaks]
                sections.append((f"Largest gradient norms: {what} ({s.label}, top {len(peaks)})", rows))
    return sections


def _markdown(report: Report) -> str:
    out = ["## Run", "", "| | |", "|---|---|"]
    out += [f"| {name} | {_md(value)} |" for name, value in _overview(report)]
    out += ["", "## Step time per series (train_per_step_time)", ""]
    out.append("| " + " | ".join(_TABLE_HEADER) + " |")
    out.append("|---|" + "---:|" * (len(_TABLE_HEADER) - 1))
    out += ["| " + " | ".join(_md(cell) for cell in row) + " |" for row in _table_rows(report)]
    straggler = _straggler_line(report)
    if straggler:
        out += ["", straggler]
    time_table = _time_table(report)
    if time_table:
        header, rows = time_table
        out += ["", f"## {_TIME_TITLE}", "", "| " + " | ".join(header) + " |", "|---|" + "---:|" * (len(header) - 1)]
        out += ["| " + " | ".join(_md(cell) for cell in row) + " |" for row in rows]
        out += ["", _md(_own_goodput_note(report))]
        largest = _largest_loss(report)
        if largest:  # none when no series lost time to any phase
            out += ["", largest]
    verdict_lines = stragglers.lines(report.bottleneck)
    if verdict_lines:
        out += ["", f"## {stragglers.TITLE}", ""] + [f"- {_md(line.strip())}" for line in verdict_lines]
    for title, peaks in _top_norms(report):
        out += ["", f"## {title}", "", "| series | name | peak |", "|---|---|---|"]
        out += [f"| {_md(label)} | {_md(name)} | {value} |" for label, name, value in peaks]
    out += ["", "## Findings", ""]
    out += [f"- {_md(finding.text)}" for finding in findings(report)] or ["none"]
    return "\n".join(out) + "\n"


def _md(text: str) -> str:
    return text.replace("|", "\\|")
