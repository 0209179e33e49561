"""Which rank holds the job back, seen from inside the rank: its section times as series,
and a signal when it waits for its data or its steps slow down against its own history.

Runs on the pipeline's worker thread, once per sampled window, from the window's sections
(stragglers/sections.py). No collective: in synchronous data parallelism every rank already
learns the job's pace inside the gradient all-reduce, so

- a rank whose window goes mostly to waiting for its next batch (`data_share`) is the one
  the others wait for: the healthy ranks spend that time inside their step instead, and
  their data wait stays small (the *relative* signal, section `data_wait`);
- a rank whose in-step time per step rises past `step_rise` times its own baseline (the
  median of its earlier windows, up to HISTORY of them) slowed down, or waits for a rank that did
  (the *individual* signal, section `in_step`). From host clocks a slow compute rank and a
  slow link look alike; the signal says so and points to device readings and a profiler
  capture.

Each signal needs `windows` consecutive windows, and fires once per episode: a span event
on the step span, an OTel log record, the counter `mindformers.rank.straggler.signals` and
the section's name in the JSON line's `stragglers`; the training log's warning comes once per
section (a share hovering at the threshold starts episode after episode). A process that is
the whole job is told it is input-bound: there are no other ranks to hold back.
"""

from __future__ import annotations

import statistics
from collections import deque
from typing import Any

from opentelemetry._logs import SeverityNumber
from opentelemetry.metrics import Counter, Meter
from opentelemetry.trace import Span
from opentelemetry.util.types import AttributeValue

from otel_mindformers.config.schema import StragglerConfig
from otel_mindformers.core.guarded_log import get_logger
from otel_mindformers.core.step_record import StepRecord
from otel_mindformers.job.identity import Identity
from otel_mindformers.names import semconv
from otel_mindformers.names import straggler_names as names
from otel_mindformers.stragglers.sections import STEPS_KEY, WINDOW_KEY
from otel_mindformers.telemetry.events import record_event
from otel_mindformers.telemetry.training_instruments import Coalesced, create_instrument

_logger = get_logger(__name__)

HISTORY = 100  # windows the individual score's baseline is the median of

# What tells a slow compute rank from a slow link when host clocks cannot (docs/stragglers.md).
TELL_APART = (
    "a slow compute rank and a slow link look alike from host clocks: compare the ranks' device "
    "readings (AI-core utilisation and frequency, temperature, throttling from npu-smi; "
    "`device_monitor: true`) and take a profiler capture of the suspect ranks"
)


def _above(share: float, threshold: float) -> str:
    """`share` as a percentage that reads above `threshold`: 20.3 % is not "20% (threshold 20%)"."""
    whole = f"{share:.0%}"
    return whole if whole != f"{threshold:.0%}" else f"{share:.1%}"


class _Streak:
    """Consecutive windows over a threshold; `hit` is true on the window that completes
    `needed` of them, once per episode (the streak must break to fire again)."""

    def __init__(self, needed: int) -> None:
        self._needed = needed
        self._count = 0

    def update(self, over: bool) -> bool:
        self._count = self._count + 1 if over else 0
        return self._count == self._needed


class RankSections:
    """`section_series` attributes: the rank's (`rank`), its node's (`node`), none (`off`)."""

    def __init__(self, meter: Meter, otel_logger: Any, identity: Identity, config: StragglerConfig) -> None:
        self._identity = identity
        self._config = config
        self._series = None
        if config.section_series != "off":
            self._series = create_instrument(meter, names.SECTION_TIME).add
            self._steps = create_instrument(meter, names.SECTION_STEPS).add
            self._attributes = (
                identity.point_attributes() if config.section_series == "rank" else identity.node_attributes()
            )
            self._section_attributes = {
                section: {**self._attributes, names.ATTR_SECTION: section} for section in names.SECTIONS
            }
        self._counter: Counter | None = create_instrument(meter, names.STRAGGLER_SIGNALS) if config.signal else None
        self._otel_logger = otel_logger
        self._data = _Streak(config.windows)
        self._rise = _Streak(config.windows)
        self._history: deque[float] = deque(maxlen=HISTORY)  # in-step seconds per step, by window
        self._streak: list[float] = []  # the windows of the current rise, kept out of the baseline
        self._warned: set[str] = set()  # sections already named in the training log

    def observe(self, record: StepRecord, span: Span | None, coalesced: Coalesced) -> None:
        """`coalesced` holds the section series' adds until the pipeline's batch ends."""
        sections = record.sections
        if not sections:
            return
        if self._series is not None:
            for section in names.SECTIONS:
                seconds = sections.get(section)
                if seconds:
                    coalesced.add(self._series, seconds, self._section_attributes[section])
            coalesced.add(self._steps, int(sections[STEPS_KEY]), self._attributes)
        if self._counter is not None:
            self._check(self._counter, record, sections, span)

    def _check(self, counter: Counter, record: StepRecord, sections: dict[str, float], span: Span | None) -> None:
        window, steps = sections[WINDOW_KEY], sections[STEPS_KEY]
        if window <= 0 or steps <= 0:
            return
        config = self._config
        share = sections[names.SECTION_DATA_WAIT] / window
        if self._data.update(share > config.data_share):
            # Between steps is the next batch, and the callbacks' hooks after ours and before it
            # (a custom loop: its own code between two `run.step` blocks).
            waited = (
                "it waited between steps (for its data, or for work between steps: callbacks, a custom loop's "
                f"code outside run.step) {_above(share, config.data_share)} of its wall time for {config.windows} "
                "sampled window(s) "
                f"(threshold {config.data_share:.0%})"
            )
            self._signal(
                counter, record, span, names.SECTION_DATA_WAIT, names.SCORE_RELATIVE, {names.ATTR_SHARE: share},
                # A rank sees only its own clocks: when every rank waits for slow shared storage,
                # whichever falls behind shows the wait. So it says what it knows, and where the
                # comparison is made (`report` over every rank's sections).
                f"rank {self._identity.rank} is input-bound: {waited}; if the other ranks' data wait is small "
                "(they wait for it inside their step), it holds the job back: `otel-mindformers report` compares the ranks"
                if self._identity.distributed  # one process has no job to hold back: it is input-bound
                else f"training is input-bound: {waited}; the data pipeline or the work between steps, not the step, sets the pace",
            )  # fmt: skip
        per_step = sections[names.SECTION_IN_STEP] / steps
        if share > config.data_share:  # a baseline of steps, not of waits for data
            return
        if len(self._history) < config.windows:
            self._history.append(per_step)
            return
        baseline = statistics.median(self._history)
        ratio = per_step / baseline if baseline > 0 else 0.0
        rising = ratio > config.step_rise
        if rising:
            self._streak.append(per_step)
        else:  # the streak's windows join the history once it ends
            self._history.extend(self._streak)
            self._streak.clear()
            self._history.append(per_step)
        if self._rise.update(rising):
            self._signal(
                counter, record, span, names.SECTION_IN_STEP, names.SCORE_INDIVIDUAL, {names.ATTR_RATIO: ratio},
                f"rank {self._identity.rank}: in-step time {per_step * 1000:.1f} ms per step, {ratio:.2f}x its own "
                f"median of {baseline * 1000:.1f} ms for {config.windows} sampled window(s), with no data wait "
                f"to explain it; {TELL_APART}",
            )  # fmt: skip

    def _signal(
        self,
        counter: Counter,
        record: StepRecord,
        span: Span | None,
        section: str,
        score: str,
        extra: dict[str, float],
        message: str,
    ) -> None:
        attributes: dict[str, AttributeValue] = {
            **self._identity.point_attributes(),
            names.ATTR_SECTION: section,
            names.ATTR_SCORE: score,
        }
        counter.add(1, attributes)
        event = {**attributes, **extra, semconv.ATTR_STEP: record.step, "message": message}
        record_event(span, self._otel_logger, names.EVENT_STRAGGLER, message, event, SeverityNumber.WARN)
        record.stragglers.append(section)
        if section not in self._warned:  # the training log once per section; every episode is counted
            self._warned.add(section)
            _logger.warning(
                "otel_mindformers: %s (later episodes: the counter %s and span events, not this log)",
                message,
                names.STRAGGLER_SIGNALS.name,
            )


__all__ = ["TELL_APART", "RankSections"]
