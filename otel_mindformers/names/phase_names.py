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

# --- the built-in phases, and where user-marked ones go ---
BUILT_IN_PHASES = (
    PHASE_STARTUP,
    PHASE_CHECKPOINT_LOAD,
    PHASE_COMPILE,
    PHASE_DATA_WAIT,
    PHASE_EVALUATION,
    PHASE_CHECKPOINT_SAVE,
)
# A user phase's key in the JSON line's `time` object and the run span's `training.time.*`
# attributes: its own namespace, so `phase("wall")` cannot overwrite the ledger's totals.
USER_PHASE_PREFIX = "user."
# Distinct user phase names a run keeps apart (in the ledger and the histogram's
# `training.phase`); later names fold into USER_PHASE_OTHER. Names are cut to
# MAX_PHASE_NAME_CHARS.
MAX_USER_PHASES = 32
MAX_PHASE_NAME_CHARS = 64
USER_PHASE_OTHER = "other"
# A phase still open when its run ends: closed by the run, its span says so.
ATTR_PHASE_CLOSED_BY_RUN_END = "training.phase.closed_by_run_end"
