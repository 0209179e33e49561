"""Telemetry names of the per-rank section times and the straggler signal (docs/stragglers.md).

A sampled window's wall time on one rank splits into sections: `data_wait` (between steps,
waiting for the next batch), `in_step` (inside the step: compute and communication as one
figure, including the time this rank waits for the others in the gradient all-reduce), and
the phases that ended in the window (`checkpoint`, `evaluation`, `other`).
"""

from __future__ import annotations

from otel_mindformers.names.spec import Kind, MetricSpec

ATTR_SECTION = "training.section"
ATTR_SCORE = "training.straggler.score"  # "relative" or "individual"
ATTR_SHARE = "training.straggler.share"  # the section's share of the window's wall time
ATTR_RATIO = "training.straggler.ratio"  # in-step time per step over the rank's own baseline

SECTION_DATA_WAIT = "data_wait"
SECTION_IN_STEP = "in_step"
SECTION_CHECKPOINT = "checkpoint"
SECTION_EVALUATION = "evaluation"
SECTION_OTHER = "other"
SECTIONS = (SECTION_DATA_WAIT, SECTION_IN_STEP, SECTION_CHECKPOINT, SECTION_EVALUATION, SECTION_OTHER)

SCORE_RELATIVE = "relative"  # this rank waits for its data while the job's pace says the others do not
SCORE_INDIVIDUAL = "individual"  # this rank's in-step time rose against its own history

SECTION_TIME = MetricSpec(
    "mindformers.rank.section.time",
    Kind.COUNTER,
    "s",
    "Seconds of the rank's sampled windows by training.section: data_wait (between steps), in_step (compute "
    "and communication, waiting for other ranks included), checkpoint, evaluation, other phases. Its rate is "
    "the section's share of wall time.",
)
SECTION_STEPS = MetricSpec(
    "mindformers.rank.section.steps",
    Kind.COUNTER,
    "{step}",
    "Steps of the windows mindformers.rank.section.time covers: in_step seconds over these are the rank's "
    "in-step time per step.",
)
STRAGGLER_SIGNALS = MetricSpec(
    "mindformers.rank.straggler.signals",
    Kind.COUNTER,
    "{signal}",
    "Times this rank found itself holding the job back, by training.section and training.straggler.score "
    "(relative: it waits for its data; individual: its in-step time rose against its own history).",
)
STRAGGLER_METRICS: tuple[MetricSpec, ...] = (SECTION_TIME, SECTION_STEPS, STRAGGLER_SIGNALS)

EVENT_STRAGGLER = "mindformers.straggler"
