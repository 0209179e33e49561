"""Phase names: the stretches of a run's wall time that are not training steps, and what a rank
can be doing (the progress clock's `phase`, refined from the training thread's stack)."""

from __future__ import annotations

from otel_mindformers.names.spec import Kind, MetricSpec

ATTR_PHASE = "training.phase"
SPAN_PREFIX = "mindformers.phase."

PHASE_DURATION = MetricSpec(
    "mindformers.phase.duration",
    Kind.HISTOGRAM,
    "s",
    "Wall time of a non-step phase (startup, compile, data_wait, evaluation, checkpoint.save, checkpoint.load, "
    "user-marked), by training.phase.",
)

# --- what the training thread is doing (`StepClock.phase`) ---
PHASE_STEP = "step"
PHASE_DATA_WAIT = "data_wait"
PHASE_EVALUATION = "evaluation"
PHASE_CHECKPOINT_SAVE = "checkpoint.save"
PHASE_OUTSIDE_TRAINING = "outside"
PHASES = (PHASE_STEP, PHASE_DATA_WAIT, PHASE_EVALUATION, PHASE_CHECKPOINT_SAVE, PHASE_OUTSIDE_TRAINING)

# --- phases of the time ledger that are not a thread state ---
PHASE_STARTUP = "startup"
PHASE_COMPILE = "compile"
PHASE_CHECKPOINT_LOAD = "checkpoint.load"

# --- checkpoint phases' attributes ---
ATTR_CHECKPOINT_PATH = "training.checkpoint.path"
ATTR_CHECKPOINT_SIZE = "training.checkpoint.size"
ATTR_CHECKPOINT_RESUME = "training.checkpoint.resume"
