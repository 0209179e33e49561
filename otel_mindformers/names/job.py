"""Telemetry names of the job: its layout gauge (`mindformers.job.info`) and its life across
restarts (restarts/attempt_tracker.py): the attempt's
resource attributes, the job goodput and the no-progress count, and the badput categories
with the `ml-goodput-measurement` BadputType each maps to."""

from __future__ import annotations

from otel_mindformers.names.spec import Kind, MetricSpec

# --- resource / run-span attributes ---------------------------------------------------------
ATTR_ATTEMPT = "training.job.attempt"  # 1 for a job's first attempt, k for its k-th
ATTR_ATTEMPT_ID = "training.job.attempt.id"  # unique per attempt (a uuid)
ATTR_RESUME_STEP = "training.job.resume_step"  # the job step the attempt started after
ATTR_LOST_STEPS = "training.job.lost_steps"  # on the run span: steps the previous attempt lost
ATTR_DOWNTIME = "training.job.downtime"  # seconds from the previous attempt's heartbeat to this first step
ATTR_PREVIOUS_OUTCOME = "training.job.previous_attempt.outcome"

# --- metrics (observable: read by the metric reader's thread) --------------------------------
# Under `opentelemetry-instrument` the SDK builds the resource before MindSpore is imported
# and before a MindFormers Trainer reads its YAML, so the parallel layout cannot ride on the
# resource there. Like Prometheus' target_info, this gauge carries it as attributes from
# the run's start, on every path: join it to any series on `training.rank`.
JOB_INFO = MetricSpec(
    "mindformers.job.info",
    Kind.OBSERVABLE_GAUGE,
    "",  # no unit: the series is `mindformers_job_info` in both Prometheus flavours, like target_info
    "Always 1; its attributes are the rank's job: parallel layout, batch and sequence sizes, software versions.",
)
JOB_GOODPUT = MetricSpec(
    "mindformers.job.goodput",
    Kind.OBSERVABLE_GAUGE,
    "",
    "The job's goodput across its attempts: productive training time over the wall time since its first attempt began.",
)
JOB_ATTEMPT = MetricSpec(
    "mindformers.job.attempt",
    Kind.OBSERVABLE_GAUGE,
    "{attempt}",
    "The number of the job's attempt this process is (1 for the first).",
)
JOB_NO_PROGRESS_ATTEMPTS = MetricSpec(
    "mindformers.job.no_progress_attempts",
    Kind.OBSERVABLE_GAUGE,
    "{attempt}",
    "Attempts in a row that ended, not completed, without passing the furthest step the first of them reached (3: three attempts died at one step).",
)
JOB_METRICS: tuple[MetricSpec, ...] = (JOB_INFO, JOB_GOODPUT, JOB_ATTEMPT, JOB_NO_PROGRESS_ATTEMPTS)

# --- how an attempt ended -----------------------------------------------------------------------
OUTCOME_COMPLETED = "completed"
OUTCOME_STOPPED = "stopped"
OUTCOME_CRASHED = "crashed"
OUTCOME_KILLED = "killed"  # no end record: inferred from its last heartbeat
# The reason the ledger gives a killed attempt (no parentheses: reports show reasons in them).
INFERRED_KILL = "no end record, inferred from its last heartbeat"
OUTCOME_RUNNING = "running"  # the attempt still going on (or not yet known to have died)

# --- the job's time, by category, and the ml-goodput-measurement BadputType it maps to ----------
PRODUCTIVE = "productive"
BADPUT_CATEGORIES: dict[str, str] = {
    "startup": "PROGRAM_STARTUP",  # process start to the first step's begin, less the checkpoint load
    "checkpoint_load": "UNPRODUCTIVE_CHECKPOINT_RESTORE_TIME",
    "compile": "PROGRAM_STARTUP",  # the attempt's first step (graph compilation)
    "checkpoint_save": "UNPRODUCTIVE_CHECKPOINT_SAVE_TIME",
    # Between the first and the last step: ml-goodput-measurement's user-named badput events.
    "evaluation": "CUSTOM_BADPUT_EVENTS",  # Model.fit's evaluation, a `phase("evaluation")`
    "user_phases": "CUSTOM_BADPUT_EVENTS",  # the user's own `phase(...)` blocks
    "data_wait": "DATA_LOADING_SYNC",  # between steps, waiting for the next batch
    "lost_progress": "WASTED_PROGRESS_FROM_DISRUPTION",  # steps computed again after a restart
    "no_process": "INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION",  # between attempts: last heartbeat to the next start
    "other": "OTHER",  # after an attempt's last step until its end or last heartbeat
}

# --- alert -------------------------------------------------------------------------------------
RULE_NO_PROGRESS = "no_progress"
