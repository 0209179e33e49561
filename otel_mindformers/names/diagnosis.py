"""Telemetry names of the hang and first-bad-rank diagnosis (metrics, events, attributes).
semconv.py's table takes these over; the phases a rank can be in are in phases.py."""

from __future__ import annotations

from otel_mindformers.names.spec import Kind, MetricSpec

# --- heartbeat (observable: read by the metric reader's thread, never the training thread) ---
PROGRESS_STEP = MetricSpec(
    "mindformers.progress.step",
    Kind.OBSERVABLE_GAUGE,
    "{step}",
    "The rank's last finished training step (a heartbeat: exported even while training is stuck).",
)
PROGRESS_LAST_STEP_TIME = MetricSpec(
    "mindformers.progress.last_step_time",
    Kind.OBSERVABLE_GAUGE,
    "s",
    "Unix time at which the rank's last training step finished.",
)
# The first non-finite value a rank saw in this run: one add per run, with the step and the
# value's name as attributes, so `min by (job)` over the series finds the first bad rank.
NONFINITE_FIRST = MetricSpec(
    "mindformers.train.nonfinite.first",
    Kind.COUNTER,
    "{event}",
    "The rank's first non-finite loss or grad norm of the run (once per run, by step and metric).",
)
DIAGNOSIS_METRICS: tuple[MetricSpec, ...] = (PROGRESS_STEP, PROGRESS_LAST_STEP_TIME, NONFINITE_FIRST)

# --- events (span events on the run span, and the event name of their log records) ---
EVENT_STACKS = "mindformers.stacks"
EVENT_FIRST_NONFINITE = "mindformers.nonfinite.first"

# --- attributes ---
ATTR_STACKS_REASON = "training.stacks.reason"
ATTR_STACKS_VERDICT = "training.stacks.verdict"  # "stuck" or "slow" (second dump of a stall)
ATTR_STACKS_THREADS = "training.stacks.threads"  # thread names, training thread first
ATTR_STACKS_TEXT = "training.stacks.text"
ATTR_STACKS_FILE = "training.stacks.file"
ATTR_IDLE_SECONDS = "training.idle_seconds"

# --- dump reasons and verdicts ---
REASON_STALL = "stall"
REASON_STALL_AGAIN = "stall_second_threshold"
REASON_SIGNAL = "SIGUSR1"
STUCK = "stuck"
SLOW = "slow"
