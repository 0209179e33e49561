"""Telemetry names of captures (captures/controller.py) and of the rules that trigger them.

A capture is evidence taken when an alert rule fires or a person asks for it: a profiler
trace of the next steps, every thread's stack, what identifies the step's batch.
"""

from __future__ import annotations

from otel_mindformers.names.spec import Kind, MetricSpec

# --- the rules added beside loss_spike / grad_norm_spike / step_time_regression ---------
RULE_LOSS_SPIKE_SCORE = "loss_spike_score"
RULE_CO_SPIKE = "co_spike"
RULE_THROUGHPUT_DROP = "throughput_drop"
# Every built-in rule name `alert_config.capture.rules` may list (with `all`).
BUILTIN_RULES: tuple[str, ...] = (
    "nonfinite",
    "loss_threshold",
    "grad_norm_threshold",
    "loss_spike",
    "grad_norm_spike",
    "overflow_streak",
    "step_time_regression",
    RULE_LOSS_SPIKE_SCORE,
    RULE_CO_SPIKE,
    RULE_THROUGHPUT_DROP,
    "stall",
)
ALL_RULES = "all"

# --- capture kinds ------------------------------------------------------------------------
KIND_PROFILE = "profile"
KIND_STACKS = "stacks"
KIND_BATCH = "batch"
KINDS: tuple[str, ...] = (KIND_PROFILE, KIND_STACKS, KIND_BATCH)
# The trigger of a capture a person asked for (`otel-mindformers capture`).
TRIGGER_ON_DEMAND = "on_demand"

# --- metrics ------------------------------------------------------------------------------
LOSS_SPIKE_SCORE = MetricSpec(
    "mindformers.train.loss.spike_score",
    Kind.GAUGE,
    "",
    "Share of the last `window` sampled losses more than `sigma` standard deviations above "
    "their rolling mean (OLMo 2's spike score), 0 to 1.",
)
CAPTURES = MetricSpec(
    "mindformers.captures",
    Kind.COUNTER,
    "{capture}",
    "Captures taken (profile, stacks, batch) by kind and trigger, or skipped (outcome).",
)
CAPTURE_METRICS: tuple[MetricSpec, ...] = (LOSS_SPIKE_SCORE, CAPTURES)

# --- the span event on the triggering step span, and the event name of its log record ----
EVENT_CAPTURE = "mindformers.capture"
ATTR_CAPTURE_KIND = "training.capture.kind"  # one kind, or a comma-joined list on the event
ATTR_CAPTURE_PATH = "training.capture.path"
ATTR_CAPTURE_TRIGGER = "training.capture.trigger"  # the rule's name, or on_demand
ATTR_CAPTURE_STEPS = "training.capture.steps"  # how many steps the profile covers
ATTR_CAPTURE_OUTCOME = "training.capture.outcome"  # taken, skipped, failed

# --- files --------------------------------------------------------------------------------
MANIFEST_FILE = "capture.json"
CONTROL_FILE = "capture_request.json"
REQUEST_LOCK_FILE = ".capture_request.lock"  # held while `capture` adds a request
ANSWERS_FILE = "request_answers.json"
PROFILE_DIR = "profile"
STACKS_FILE = "stacks.txt"
BATCH_FILE = "batch.json"
